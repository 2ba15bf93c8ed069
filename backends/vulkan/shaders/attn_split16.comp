#version 450
#extension GL_GOOGLE_include_directive : require
// Flash-decoding (attn_split.glsl) for head_dim 16; see attn_fused.glsl.
#define HEAD_DIM4 4
#define SPLIT
#include "attn_fused.glsl"
