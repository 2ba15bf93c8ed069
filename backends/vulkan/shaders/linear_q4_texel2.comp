#version 450
#extension GL_GOOGLE_include_directive : require
// Two 4-bit linear layers on one input in one dispatch, for a CPU device, one token (decode);
// see linear_q4_texel.glsl.
#define ROWS 16
#define LANES 8
#define TOKENS 1
#define SEGMENTS 2
#include "linear_q4_texel.glsl"
