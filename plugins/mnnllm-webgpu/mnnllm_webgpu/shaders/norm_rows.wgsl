// norm.wgsl for contiguous rows of a multiple of 4 (hw 1) on an adapter whose subgroups hold a
// work-group's 8 invocations (lavapipe: one vector, no barrier): one work-group of 8 per row,
// each invocation every 8th vec4, the sums joined by subgroupAdd. RMSNorm takes one pass over
// the row for its sum of squares (LayerNorm two: the mean, then the squares about it); the fused
// residual sum is recomputed where it is read again rather than read back. Flags as norm.wgsl.
struct Params { rows: i32, len: i32, hw: i32, eps: f32, flags: i32, row: u32 }
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> r: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> sum: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> gamma: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> beta: array<vec4<f32>>;
@group(0) @binding(6) var<uniform> p: Params;

fn value(i: i32, residual: bool) -> vec4<f32> {
    if (residual) { return x[i] + r[i]; }
    return x[i];
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = i32(wg.x + wg.y * p.row);
    if (row >= p.rows) { return; }  // uniform per work-group
    let lane = i32(li);
    let n4 = p.len / 4;
    let base = row * n4;
    let residual = (p.flags & 8) != 0;
    let rms = (p.flags & 1) != 0;
    var mean = 0.0;
    var sq = vec4<f32>(0.0);
    var acc = vec4<f32>(0.0);
    for (var k = lane; k < n4; k += 8) {
        let v = value(base + k, residual);
        if (residual) { sum[base + k] = v; }
        acc += v;
        sq += v * v;
    }
    if (!rms) {
        mean = subgroupAdd(acc.x + acc.y + acc.z + acc.w) / f32(p.len);
        sq = vec4<f32>(0.0);
        for (var k = lane; k < n4; k += 8) {
            let d = value(base + k, residual) - mean;
            sq += d * d;
        }
    }
    let inv = 1.0 / sqrt(subgroupAdd(sq.x + sq.y + sq.z + sq.w) / f32(p.len) + p.eps);
    for (var k = lane; k < n4; k += 8) {
        var v = (value(base + k, residual) - mean) * inv;
        if ((p.flags & 2) != 0) { v *= gamma[k]; }
        if ((p.flags & 4) != 0) { v += beta[k]; }
        y[base + k] = v;
    }
}
