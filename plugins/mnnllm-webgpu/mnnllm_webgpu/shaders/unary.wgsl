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
        case 11: { r = tan(v); }
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
