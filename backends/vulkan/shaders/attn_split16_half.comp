#version 450
#extension GL_GOOGLE_include_directive : require
// Flash-decoding (attn_split.glsl) for head_dim 16 over a half KV cache; see attn_fused.glsl.
#define HEAD_DIM4 4
#define KV_HALF
#define SPLIT
#include "attn_fused.glsl"
