${ENABLE}
// attention.wgsl's computation (its bindings, parameters, masks, sinks and blocks of queries) in
// three barrier-free passes for a CPU adapter (lavapipe runs a work-group's invocations as SIMD
// lanes and pays for every workgroupBarrier by switching coroutines): PASS 0 one invocation per
// (t, h, key j < stride) of the block writes the masked score into s; PASS 1 one per (t, h) turns
// its row of total scores into softmax weights (sinks in the denominator); PASS 2 one per (t, h, d)
// sums the weighted values. Keys a causal mask blocks are neither dotted nor summed (their weight
// is exactly 0). `local` below is a (t, h) row of the block, `th` the same row among all queries.
struct Params {
    seq: i32, heads: i32, kv_heads: i32, dim: i32, stride: i32, scale: f32,
    mask_mode: i32, mask_rows: i32, mask_cols: i32, has_sinks: i32, row: u32, t0: i32, block: i32,
}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> keys: array<${KV}>;
@group(0) @binding(2) var<storage, read> values: array<${KV}>;
@group(0) @binding(3) var<storage, read> mask: array<u32>;
@group(0) @binding(4) var<storage, read> sinks: array<f32>;
@group(0) @binding(5) var<storage, read_write> s: array<f32>;
@group(0) @binding(6) var<storage, read_write> o: array<f32>;
@group(0) @binding(7) var<storage, read> step: array<i32>;  // past, total
@group(0) @binding(8) var<uniform> p: Params;

const NEG_INF: f32 = -3.4028235e38;  // the lowest finite float: exp(NEG_INF - m) is 0
const PASS: i32 = ${PASS};

fn score(local: i32, j: i32) {
    let past = step[0];
    let total = step[1];
    if (j >= total) { return; }
    let th = p.t0 * p.heads + local;
    let h = th % p.heads;
    let t = th / p.heads;
    if (p.mask_mode == 1 && j > past + t) {  // causally blocked: no dot product
        s[local * p.stride + j] = NEG_INF;
        return;
    }
    let g = h / (p.heads / p.kv_heads);
    let qa = th * p.dim;
    let ka = (j * p.kv_heads + g) * p.dim;
    var dotv = 0.0;
    for (var d = 0; d < p.dim; d++) { dotv += q[qa + d] * f32(keys[ka + d]); }
    var v = dotv * p.scale;
    if (p.mask_mode == 1) {
        if (j > past + t) { v = NEG_INF; }
    } else if (p.mask_mode >= 2) {
        let start = total - p.mask_cols;
        if (j >= start) {
            let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
            if (p.mask_mode == 2) { v += bitcast<f32>(bits); } else if (bits == 0u) { v = NEG_INF; }
        }
    }
    s[local * p.stride + j] = v;
}

fn softmax(local: i32) {
    let total = step[1];
    let sa = local * p.stride;
    var sink = NEG_INF;
    if (p.has_sinks != 0) { sink = sinks[local % p.heads]; }
    var m = sink;
    for (var j = 0; j < total; j++) { m = max(m, s[sa + j]); }
    var l = 0.0;
    for (var j = 0; j < total; j++) {
        let e = exp(s[sa + j] - m);
        s[sa + j] = e;
        l += e;
    }
    if (p.has_sinks != 0) { l += exp(sink - m); }
    let inv = 1.0 / l;
    for (var j = 0; j < total; j++) { s[sa + j] *= inv; }
}

fn context(local: i32, d: i32) {
    let th = p.t0 * p.heads + local;
    var total = step[1];
    if (p.mask_mode == 1) { total = min(total, step[0] + th / p.heads + 1); }  // blocked keys weigh 0
    let g = (th % p.heads) / (p.heads / p.kv_heads);
    let sa = local * p.stride;
    var acc = 0.0;
    for (var j = 0; j < total; j++) { acc += s[sa + j] * f32(values[(j * p.kv_heads + g) * p.dim + d]); }
    o[th * p.dim + d] = acc;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    let rows = p.block * p.heads;
    if (PASS == 0) {
        if (i < rows * p.stride) { score(i / p.stride, i % p.stride); }
    } else if (PASS == 1) {
        if (i < rows) { softmax(i); }
    } else if (i < rows * p.dim) {
        context(i / p.dim, i % p.dim);
    }
}
