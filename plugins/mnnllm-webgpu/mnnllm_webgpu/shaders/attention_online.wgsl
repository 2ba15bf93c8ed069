${ENABLE}
// Attention in one dispatch with an online softmax (no scores buffer, so no depth limit), for an
// adapter whose subgroups hold the 8 invocations of a work-group (lavapipe: 8 lanes, one
// vector; no barrier, which lavapipe pays for by switching coroutines). One work-group per (query
// t, HEADS query heads of one kv head: a prefill's whole group, so that each key and value is read
// once for them, ~0.6x the CPU time of one head a work-group; a decode step's 1, so that its few
// work-groups spread over the threads): keys go by 8 at a time, one per invocation (the dot
// products a vec4 at a time), each head's 8 scores' max and sum by subgroup ops into its running
// max and sum (the sum and the partial output rescaled when the max grows), then each invocation
// adds the 8 value rows, their weights passed by subgroupShuffle, into its share of each head's
// output (vec4 number lane, lane + 8, ...). Keys and
// values before past (step[0]) come from the cache, the step's own from the k/v inputs; the
// work-group of a kv head's first query heads appends the step's row to the cache (nothing in this
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
const PER_LANE: i32 = (D4 + 7) / 8;  // output vec4s an invocation sums (per head)
const HEADS: i32 = ${HEADS};  // query heads of one kv head a work-group takes (their keys and values read once)
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
    let group = p.heads / p.kv_heads;
    let units = group / HEADS;  // work-groups of one (query, kv head)
    let th = i32(wg.x + wg.y * p.row);
    if (th >= p.seq * p.kv_heads * units) { return; }  // uniform per work-group
    let lane = i32(li);
    let unit = th % (p.kv_heads * units);
    let g = unit / units;
    let h0 = g * group + (unit % units) * HEADS;  // this work-group's first query head
    // queries from both ends in turn (0, seq-1, 1, seq-2, ...): lavapipe hands each of its threads
    // one contiguous run of a dispatch's work-groups, and a causal walk grows with t, so in
    // query order one thread got the cheap first half (1/4 of the work) and the other the rest
    let n = th / (p.kv_heads * units);
    var t = n / 2;
    if (n % 2 == 1) { t = p.seq - 1 - n / 2; }
    let past = step[0];
    let total = step[1];
    if (p.write_cache != 0 && h0 % group == 0 && t < p.kv_seq) {
        let src = (t * p.kv_heads + g) * D4;
        let to = ((past + t) * p.kv_heads + g) * D4;
        for (var d = lane; d < D4; d += 8) {
            ck[to + d] = vec4<${KV}>(k[src + d]);
            cv[to + d] = vec4<${KV}>(v[src + d]);
        }
    }
    var qv: array<vec4<f32>, HEADS * D4>;  // head hh's vec4 d at hh * D4 + d
    for (var i = 0; i < HEADS * D4; i++) { qv[i] = q[(t * p.heads + h0) * D4 + i]; }
    var end = total;
    if (p.mask_mode == 1) { end = min(total, past + t + 1); }  // causally blocked keys weigh 0
    var top: array<f32, HEADS>;
    var sum: array<f32, HEADS>;
    var acc: array<vec4<f32>, HEADS * PER_LANE>;  // head hh's share i at hh * PER_LANE + i
    for (var hh = 0; hh < HEADS; hh++) {
        top[hh] = NEG_INF;
        sum[hh] = 0.0;
        if (p.has_sinks != 0) {  // the sink's logit: in the denominator from the start
            top[hh] = sinks[h0 + hh];
            sum[hh] = 1.0;
        }
    }
    for (var c = 0; c < end; c += 8) {
        let j = c + lane;
        var s: array<f32, HEADS>;
        for (var hh = 0; hh < HEADS; hh++) { s[hh] = NEG_INF; }
        if (j < end) {
            var dot4: array<vec4<f32>, HEADS>;  // zeroed by hand: naga declares a loop's locals once
            for (var hh = 0; hh < HEADS; hh++) { dot4[hh] = vec4<f32>(0.0); }
            for (var d = 0; d < D4; d++) {
                let kd = key(j, g, d, past);  // one key read for every head of the group
                for (var hh = 0; hh < HEADS; hh++) { dot4[hh] += qv[hh * D4 + d] * kd; }
            }
            var added = 0.0;
            var blocked = false;
            if (p.mask_mode >= 2) {
                let start = total - p.mask_cols;
                if (j >= start) {
                    let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
                    if (p.mask_mode == 2) { added = bitcast<f32>(bits); } else { blocked = bits == 0u; }
                }
            }
            for (var hh = 0; hh < HEADS; hh++) {
                s[hh] = (dot4[hh].x + dot4[hh].y + dot4[hh].z + dot4[hh].w) * p.scale + added;
                if (blocked) { s[hh] = NEG_INF; }
            }
        }
        var w: array<f32, HEADS>;
        var live = false;
        for (var hh = 0; hh < HEADS; hh++) {
            w[hh] = 0.0;
            let new_top = max(top[hh], subgroupMax(s[hh]));
            if (new_top <= NEG_INF) { continue; }  // every key so far masked out (w stays 0)
            live = true;
            let rescale = exp(top[hh] - new_top);
            w[hh] = exp(s[hh] - new_top);
            sum[hh] = sum[hh] * rescale + subgroupAdd(w[hh]);
            for (var i = 0; i < PER_LANE; i++) { acc[hh * PER_LANE + i] *= rescale; }
            top[hh] = new_top;
        }
        if (!live) { continue; }
        for (var kk = 0; kk < 8; kk++) {
            if (c + kk >= end) { break; }
            var wk: array<f32, HEADS>;
            for (var hh = 0; hh < HEADS; hh++) { wk[hh] = subgroupShuffle(w[hh], u32(kk)); }
            for (var i = 0; i < PER_LANE; i++) {
                let d = lane + 8 * i;
                if (d < D4) {
                    let vd = value(c + kk, g, d, past);  // one value read for every head of the group
                    for (var hh = 0; hh < HEADS; hh++) { acc[hh * PER_LANE + i] += wk[hh] * vd; }
                }
            }
        }
    }
    for (var hh = 0; hh < HEADS; hh++) {
        let inv = 1.0 / sum[hh];
        for (var i = 0; i < PER_LANE; i++) {
            let d = lane + 8 * i;
            if (d < D4) { o[(t * p.heads + h0 + hh) * D4 + d] = acc[hh * PER_LANE + i] * inv; }
        }
    }
}
