#version 450
#extension GL_GOOGLE_include_directive : require
// Flash-decoding (attn_split.glsl) for head_dim 80 over a half KV cache; see attn_fused.glsl.
#define HEAD_DIM4 20
#define KV_HALF
#define SPLIT
#include "attn_fused.glsl"
