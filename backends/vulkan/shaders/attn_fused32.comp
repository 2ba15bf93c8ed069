#version 450
#extension GL_GOOGLE_include_directive : require
// Attention in one dispatch for head_dim 32; see attn_fused.glsl.
#define HEAD_DIM4 8
#include "attn_fused.glsl"
