#version 450
#extension GL_GOOGLE_include_directive : require
// Attention in one dispatch for head_dim 48; see attn_fused.glsl.
#define HEAD_DIM4 12
#include "attn_fused.glsl"
