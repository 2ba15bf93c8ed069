#version 450
#extension GL_GOOGLE_include_directive : require
// 4-bit linear layer for a CPU device, 4 tokens per invocation (prefill); see linear_q4_texel.glsl.
#define ROWS 8
#define LANES 8
#define TOKENS 4
#include "linear_q4_texel.glsl"
