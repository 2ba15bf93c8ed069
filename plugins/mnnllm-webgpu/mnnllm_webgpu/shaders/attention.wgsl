${ENABLE}
// Fused attention, one work-group of 64 per (query token t, head h) of one block of queries
// (t0 <= t < t0 + block, so that a block's scores fit one storage binding): scores of the `total`
// keys (step[1], written by the host before each submit) into the scratch row
// s[((t-t0)*heads+h)*stride..], their max and sum by a shared-memory tree, then the output
// o = sum_j p_j v_j / sum. Keys and values are token-major rows of KV (f32, or f16 read as f32):
// key j of kv head g at (j*kv_heads+g)*dim; grouped-query heads share kv head h / (heads / kv_heads).
// mask_mode 0: none; 1: causal (j <= past + t); 2: a float mask added; 3: an int mask (0 blocks),
// a [mask_rows, mask_cols] mask over the last mask_cols keys (its last seq rows). Blocked: -inf.
// has_sinks: one extra logit per head (sinks[h]) in the softmax's denominator.
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
var<workgroup> part: array<f32, 64>;

fn reduce(lane: u32, v: f32, is_max: bool) -> f32 {
    part[lane] = v;
    workgroupBarrier();
    for (var w = 32u; w > 0u; w >>= 1u) {
        if (lane < w) {
            if (is_max) { part[lane] = max(part[lane], part[lane + w]); } else { part[lane] += part[lane + w]; }
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let local = i32(wg.x + wg.y * p.row);
    if (local >= p.block * p.heads) { return; }  // uniform per work-group
    let th = p.t0 * p.heads + local;
    let past = step[0];
    let total = step[1];
    let h = th % p.heads;
    let t = th / p.heads;
    let g = h / (p.heads / p.kv_heads);
    let qa = th * p.dim;
    let sa = local * p.stride;
    var m = NEG_INF;
    for (var j = i32(lane); j < total; j += 64) {
        let ka = (j * p.kv_heads + g) * p.dim;
        var dotv = 0.0;
        for (var d = 0; d < p.dim; d++) { dotv += q[qa + d] * f32(keys[ka + d]); }
        var score = dotv * p.scale;
        if (p.mask_mode == 1) {
            if (j > past + t) { score = NEG_INF; }
        } else if (p.mask_mode >= 2) {
            let start = total - p.mask_cols;
            if (j >= start) {
                let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
                if (p.mask_mode == 2) { score += bitcast<f32>(bits); } else if (bits == 0u) { score = NEG_INF; }
            }
        }
        s[sa + j] = score;
        m = max(m, score);
    }
    var sink = NEG_INF;
    if (p.has_sinks != 0) { sink = sinks[h]; }
    m = max(reduce(lane, m, true), sink);
    var l = 0.0;
    for (var j = i32(lane); j < total; j += 64) {
        let e = exp(s[sa + j] - m);
        s[sa + j] = e;
        l += e;
    }
    l = reduce(lane, l, false);
    if (p.has_sinks != 0) { l += exp(sink - m); }
    storageBarrier();
    let inv = 1.0 / l;
    for (var d = i32(lane); d < p.dim; d += 64) {
        var acc = 0.0;
        for (var j = 0; j < total; j++) { acc += s[sa + j] * f32(values[(j * p.kv_heads + g) * p.dim + d]); }
        o[qa + d] = acc * inv;
    }
}
