// Softmax over one axis: `outer` x `len` x `inner` elements, one work-group of 64 per (outer, inner)
// line; max and sum by a shared-memory tree.
struct Params { lines: i32, len: i32, inner: i32, row: u32 }
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> part: array<f32, 64>;

fn reduce(lane: u32, v: f32, is_max: bool) -> f32 {
    part[lane] = v;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {
        if (lane < s) {
            if (is_max) { part[lane] = max(part[lane], part[lane + s]); } else { part[lane] += part[lane + s]; }
        }
        workgroupBarrier();
    }
    let t = part[0];
    workgroupBarrier();
    return t;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let line = i32(wg.x + wg.y * p.row);
    if (line >= p.lines) { return; }  // uniform per work-group
    let base = (line / p.inner) * p.len * p.inner + line % p.inner;
    var m = -3.4028235e38;
    for (var k = i32(lane); k < p.len; k += 64) { m = max(m, x[base + k * p.inner]); }
    m = reduce(lane, m, true);
    var s = 0.0;
    for (var k = i32(lane); k < p.len; k += 64) { s += exp(x[base + k * p.inner] - m); }
    let inv = 1.0 / reduce(lane, s, false);
    for (var k = i32(lane); k < p.len; k += 64) {
        let i = base + k * p.inner;
        y[i] = exp(x[i] - m) * inv;
    }
}
