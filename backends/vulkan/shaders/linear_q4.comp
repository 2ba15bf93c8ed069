#version 450
#extension GL_GOOGLE_include_directive : require
// 4-bit linear layer, one token per invocation (decode); see linear_q4.glsl.
#define TILE 1
#include "linear_q4.glsl"
