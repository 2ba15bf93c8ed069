// LayerNorm / RMSNorm, one work-group of 64 per row of `len` elements spaced `hw` apart
// (hw > 1: the channel axis of an NC4HW4 tensor), sums by a shared-memory tree.
// flags: 1 rms, 2 gamma, 4 beta, 8 fused residual (s = x + r written to `sum`, then normalized).
struct Params { rows: i32, len: i32, hw: i32, eps: f32, flags: i32, row: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> r: array<f32>;
@group(0) @binding(2) var<storage, read_write> sum: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> gamma: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

var<workgroup> part: array<f32, 64>;

fn total(lane: u32, v: f32) -> f32 {
    part[lane] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lane < s) { part[lane] += part[lane + s]; }
        workgroupBarrier();
    }
    let t = part[0];
    workgroupBarrier();
    return t;
}

fn value(i: i32, residual: bool) -> f32 {
    if (residual) { return x[i] + r[i]; }
    return x[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = i32(wg.x + wg.y * p.row);
    if (row >= p.rows) { return; }  // uniform per work-group
    let base = (row / p.hw) * p.len * p.hw + row % p.hw;
    let residual = (p.flags & 8) != 0;
    var acc = 0.0;
    for (var k = i32(lane); k < p.len; k += 64) {
        let i = base + k * p.hw;
        let v = value(i, residual);
        if (residual) { sum[i] = v; }
        acc += v;
    }
    var mean = total(lane, acc) / f32(p.len);
    if ((p.flags & 1) != 0) { mean = 0.0; }
    var sq = 0.0;
    for (var k = i32(lane); k < p.len; k += 64) {
        let d = value(base + k * p.hw, residual) - mean;
        sq += d * d;
    }
    let inv = 1.0 / sqrt(total(lane, sq) / f32(p.len) + p.eps);
    for (var k = i32(lane); k < p.len; k += 64) {
        let i = base + k * p.hw;
        var v = (value(i, residual) - mean) * inv;
        if ((p.flags & 2) != 0) { v *= gamma[k]; }
        if ((p.flags & 4) != 0) { v += beta[k]; }
        y[i] = v;
    }
}
