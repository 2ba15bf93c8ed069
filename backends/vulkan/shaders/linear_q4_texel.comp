#version 450
#extension GL_GOOGLE_include_directive : require
// 4-bit linear layer for a CPU device, one token (decode); see linear_q4_texel.glsl.
#define ROWS 16
#define LANES 8
#define TOKENS 1
#include "linear_q4_texel.glsl"
