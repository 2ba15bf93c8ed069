// Float UnaryOp, one invocation per element; op codes as ops/elementwise.py's UNARY.
struct Params { total: i32, op: i32, row: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

fn tanh_safe(v: f32) -> f32 {  // no overflow for large |v|
    let t = exp(-2.0 * abs(v));
    return sign(v) * (1.0 - t) / (1.0 + t);
}

fn erf_approx(v: f32) -> f32 {  // Abramowitz & Stegun 7.1.26, |error| < 1.5e-7
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - poly * exp(-a * a));
}

// tan to ~2 ulp everywhere: v = k pi/2 + r with pi/2 in three parts, the first two short enough that
// k times them is exact (r to ~1e-14 with or without fused multiply-adds), tan(r) on
// [-pi/4, pi/4] by an odd polynomial (Cephes' tanf coefficients), -1/tan(r) for odd k. A driver's
// own tan may be a quick sin/cos, whose error near the poles is the whole value.
fn tan_reduced(v: f32) -> f32 {
    let k = floor(v * 0.63661977236758134 + 0.5);
    let r = (v - k * 1.5703125) - k * 4.838705062866211e-4 - k * -4.37113900018624e-8;
    let z = r * r;
    let poly = ((((9.38540185543e-3 * z + 3.11992232697e-3) * z + 2.44301354525e-2) * z + 5.34112807005e-2) * z
                + 1.33387994085e-1) * z + 3.33331568548e-1;
    let t = poly * z * r + r;
    if ((i32(k) & 1) != 0) { return -1.0 / t; }
    return t;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    if (i >= p.total) { return; }
    let v = x[i];
    var r: f32;
    switch p.op {
        case 0: { r = abs(v); }
        case 1: { r = -v; }
        case 2: { r = floor(v); }
        case 3: { r = ceil(v); }
        case 4: { r = v * v; }
        case 5: { r = sqrt(v); }
        case 6: { r = 1.0 / sqrt(v); }
        case 7: { r = exp(v); }
        case 8: { r = log(v); }
        case 9: { r = sin(v); }
        case 10: { r = cos(v); }
        case 11: { r = tan_reduced(v); }
        case 12: { r = atan(v); }
        case 13: { r = 1.0 / v; }
        case 14: { r = sign(v); }
        case 15: { r = 1.0 / (1.0 + exp(-v)); }
        case 16: { r = tanh_safe(v); }
        case 17: { r = v * clamp(v + 3.0, 0.0, 6.0) / 6.0; }
        case 18: { r = v / (1.0 + exp(-v)); }
        case 19: { r = 0.5 * v * (1.0 + tanh_safe(0.7978845608 * (v + 0.044715 * v * v * v))); }
        case 20: { r = 0.5 * v * (1.0 + erf_approx(v * 0.70710678118)); }
        case 21: { r = erf_approx(v); }
        default: { r = max(v, 0.0); }
    }
    y[i] = r;
}
