#version 450
// Float UnaryOp, one invocation per element. op codes: see UNARY in ops.py.
#extension GL_EXT_samplerless_texture_functions : require
layout(local_size_x = 256) in;
layout(binding = 0) uniform textureBuffer X;  // read as float texels
layout(std430, binding = 1) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { int total; int op; uint row; } p;
float tanh_safe(float v) {
    float t = exp(-2.0 * abs(v));
    return sign(v) * (1.0 - t) / (1.0 + t);
}
// erf by Abramowitz and Stegun 7.1.26 (absolute error <= 1.5e-7), odd in v.
float erf_as(float v) {
    float a = abs(v);
    float t = 1.0 / (1.0 + 0.3275911 * a);
    float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - poly * exp(-a * a));
}
// tan to ~2 ulp everywhere: x = k pi/2 + r with pi/2 in three parts, the first two short enough that
// k times them is exact (r to ~1e-14 with or without fused multiply-adds), tan(r) on
// [-pi/4, pi/4] by an odd polynomial (Cephes' tanf coefficients), -1/tan(r) for odd k. A driver's
// own tan may be a quick sin/cos, whose error near the poles is the whole value.
float tan_reduced(float v) {
    float k = floor(v * 0.63661977236758134 + 0.5);
    float r = (v - k * 1.5703125) - k * 4.838705062866211e-4;
    r -= k * -4.37113900018624e-8;
    float z = r * r;
    float poly = ((((9.38540185543e-3 * z + 3.11992232697e-3) * z + 2.44301354525e-2) * z + 5.34112807005e-2) * z
                  + 1.33387994085e-1) * z + 3.33331568548e-1;
    float t = poly * z * r + r;
    return (int(k) & 1) != 0 ? -1.0 / t : t;
}
void main() {
    int i = int(gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row);
    if (i >= p.total) return;
    float v = texelFetch(X, i).x, r;
    switch (p.op) {
    case 0: r = abs(v); break;
    case 1: r = -v; break;
    case 2: r = floor(v); break;
    case 3: r = ceil(v); break;
    case 4: r = v * v; break;
    case 5: r = sqrt(v); break;
    case 6: r = 1.0 / sqrt(v); break;
    case 7: r = exp(v); break;
    case 8: r = log(v); break;
    case 9: r = sin(v); break;
    case 10: r = cos(v); break;
    case 11: r = tan_reduced(v); break;
    case 12: r = atan(v); break;
    case 13: r = 1.0 / v; break;
    case 14: r = sign(v); break;
    case 15: r = 1.0 / (1.0 + exp(-v)); break;
    case 16: r = tanh_safe(v); break;
    case 17: r = v * clamp(v + 3.0, 0.0, 6.0) / 6.0; break;
    case 18: r = v / (1.0 + exp(-v)); break;
    case 19: r = 0.5 * v * (1.0 + tanh_safe(0.7978845608 * (v + 0.044715 * v * v * v))); break;
    case 20: r = 0.5 * v * (1.0 + erf_as(v * 0.70710678118)); break;
    default: r = erf_as(v); break;
    }
    y[i] = r;
}
