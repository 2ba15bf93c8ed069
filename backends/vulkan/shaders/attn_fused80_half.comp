#version 450
#extension GL_GOOGLE_include_directive : require
// Attention in one dispatch for head_dim 80 over a half KV cache; see attn_fused.glsl.
#define HEAD_DIM4 20
#define KV_HALF
#include "attn_fused.glsl"
