#version 450
#extension GL_GOOGLE_include_directive : require
// Attention in one dispatch for head_dim 96 over a half KV cache; see attn_fused.glsl.
#define HEAD_DIM4 24
#define KV_HALF
#include "attn_fused.glsl"
