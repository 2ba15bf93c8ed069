#version 450
#extension GL_GOOGLE_include_directive : require
// 4-bit linear layer, 8 tokens per invocation (prefill); see linear_q4.glsl.
#define TILE 8
#include "linear_q4.glsl"
