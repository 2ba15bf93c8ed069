${ENABLE}
// Attention in one dispatch with an online softmax (no scores buffer, so no depth limit), for an
// adapter whose subgroups hold the 8 invocations of a work-group (lavapipe: 8 lanes, one
// vector; no barrier, which lavapipe pays for by switching coroutines). One work-group per (query
// t, head h): keys go by 8 at a time, one per invocation (the dot product a vec4 at a time), the
// 8 scores' max and sum by subgroup ops into a running max and sum (the sum and the partial output
// rescaled when the max grows), then each invocation adds the 8 value rows, their weights passed
// by subgroupShuffle, into its share of the output (vec4 number lane, lane + 8, ...). Keys and
// values before past (step[0]) come from the cache, the step's own from the k/v inputs; the
// work-group of a kv head's first query head appends the step's row to the cache (nothing in this
// dispatch reads those rows from it). Without a cache (write_cache 0) past is 0: every key is
// an input's. Masks and sinks as attention.wgsl; a causal mask ends the walk at key past + t.
struct Params {
    seq: i32, heads: i32, kv_heads: i32, kv_seq: i32, scale: f32,
    mask_mode: i32, mask_rows: i32, mask_cols: i32, has_sinks: i32, write_cache: i32, row: u32,
}
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k: array<vec4<f32>>;   // the step's keys [kv_seq, kv_heads, dim]
@group(0) @binding(2) var<storage, read> v: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> ck: array<vec4<${KV}>>;  // the cache
@group(0) @binding(4) var<storage, read_write> cv: array<vec4<${KV}>>;
@group(0) @binding(5) var<storage, read> mask: array<u32>;
@group(0) @binding(6) var<storage, read> sinks: array<f32>;
@group(0) @binding(7) var<storage, read_write> o: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> step: array<i32>;  // past, total
@group(0) @binding(9) var<uniform> p: Params;

const D4: i32 = ${DIM4};  // vec4s of a head
const PER_LANE: i32 = (D4 + 7) / 8;  // output vec4s an invocation sums
const NEG_INF: f32 = -3.4028235e38;  // the lowest finite float: exp(NEG_INF - m) is 0

fn key(j: i32, g: i32, d: i32, past: i32) -> vec4<f32> {
    if (j >= past) { return k[((j - past) * p.kv_heads + g) * D4 + d]; }
    return vec4<f32>(ck[(j * p.kv_heads + g) * D4 + d]);
}

fn value(j: i32, g: i32, d: i32, past: i32) -> vec4<f32> {
    if (j >= past) { return v[((j - past) * p.kv_heads + g) * D4 + d]; }
    return vec4<f32>(cv[(j * p.kv_heads + g) * D4 + d]);
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let th = i32(wg.x + wg.y * p.row);
    if (th >= p.seq * p.heads) { return; }  // uniform per work-group
    let lane = i32(li);
    let h = th % p.heads;
    // queries from both ends in turn (0, seq-1, 1, seq-2, ...): lavapipe hands each of its threads
    // one contiguous run of a dispatch's work-groups, and a causal walk grows with t, so in
    // query order one thread got the cheap first half (1/4 of the work) and the other the rest
    let n = th / p.heads;
    var t = n / 2;
    if (n % 2 == 1) { t = p.seq - 1 - n / 2; }
    let qh = t * p.heads + h;  // the (query, head) row of q and o
    let group = p.heads / p.kv_heads;
    let g = h / group;
    let past = step[0];
    let total = step[1];
    if (p.write_cache != 0 && h % group == 0 && t < p.kv_seq) {
        let src = (t * p.kv_heads + g) * D4;
        let to = ((past + t) * p.kv_heads + g) * D4;
        for (var d = lane; d < D4; d += 8) {
            ck[to + d] = vec4<${KV}>(k[src + d]);
            cv[to + d] = vec4<${KV}>(v[src + d]);
        }
    }
    var qv: array<vec4<f32>, D4>;
    for (var d = 0; d < D4; d++) { qv[d] = q[qh * D4 + d]; }
    var end = total;
    if (p.mask_mode == 1) { end = min(total, past + t + 1); }  // causally blocked keys weigh 0
    var top = NEG_INF;
    var sum = 0.0;
    if (p.has_sinks != 0) {  // the sink's logit: in the denominator from the start
        top = sinks[h];
        sum = 1.0;
    }
    var acc: array<vec4<f32>, PER_LANE>;
    for (var c = 0; c < end; c += 8) {
        let j = c + lane;
        var s = NEG_INF;
        if (j < end) {
            var dot4 = vec4<f32>(0.0);
            for (var d = 0; d < D4; d++) { dot4 += qv[d] * key(j, g, d, past); }
            s = (dot4.x + dot4.y + dot4.z + dot4.w) * p.scale;
            if (p.mask_mode >= 2) {
                let start = total - p.mask_cols;
                if (j >= start) {
                    let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
                    if (p.mask_mode == 2) { s += bitcast<f32>(bits); } else if (bits == 0u) { s = NEG_INF; }
                }
            }
        }
        let new_top = max(top, subgroupMax(s));
        if (new_top <= NEG_INF) { continue; }  // every key so far masked out
        let rescale = exp(top - new_top);
        let w = exp(s - new_top);
        sum = sum * rescale + subgroupAdd(w);
        for (var i = 0; i < PER_LANE; i++) { acc[i] *= rescale; }
        for (var kk = 0; kk < 8; kk++) {
            let wk = subgroupShuffle(w, u32(kk));
            if (c + kk >= end) { break; }
            for (var i = 0; i < PER_LANE; i++) {
                let d = lane + 8 * i;
                if (d < D4) { acc[i] += wk * value(c + kk, g, d, past); }
            }
        }
        top = new_top;
    }
    let inv = 1.0 / sum;
    for (var i = 0; i < PER_LANE; i++) {
        let d = lane + 8 * i;
        if (d < D4) { o[qh * D4 + d] = acc[i] * inv; }
    }
}
