// The part of attention_online.wgsl (one query head a work-group: decode) and
// attention_online_group.wgsl (the query heads of one kv head: prefill) that they share: an
// adapter whose subgroups hold the 8 invocations of a work-group (lavapipe: 8 lanes, one vector;
// no barrier, which lavapipe pays for by switching coroutines); the whole op in one dispatch with
// an online softmax (no scores buffer, so no depth limit). Keys and values before past (step[0])
// come from the cache, the step's own from the k/v inputs; the work-group of a kv head's first
// query head appends the step's row to the cache (nothing in the dispatch reads those rows from
// it). Without a cache (write_cache 0) past is 0: every key is an input's. Masks and sinks as
// attention.wgsl; a causal mask ends the walk at key past + t.
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
const PER_LANE: i32 = (D4 + 7) / 8;  // output vec4s of a head an invocation sums
const NEG_INF: f32 = -3.4028235e38;  // the lowest finite float: exp(NEG_INF - m) is 0

fn key(j: i32, g: i32, d: i32, past: i32) -> vec4<f32> {
    if (j >= past) { return k[((j - past) * p.kv_heads + g) * D4 + d]; }
    return vec4<f32>(ck[(j * p.kv_heads + g) * D4 + d]);
}

fn value(j: i32, g: i32, d: i32, past: i32) -> vec4<f32> {
    if (j >= past) { return v[((j - past) * p.kv_heads + g) * D4 + d]; }
    return vec4<f32>(cv[(j * p.kv_heads + g) * D4 + d]);
}


// the query of the n-th work-group row: from both ends in turn (0, seq-1, 1, seq-2, ...): lavapipe
// hands each of its threads one contiguous run of a dispatch's work-groups, and a causal walk
// grows with t, so in query order one of two threads got 1/4 of the work and the other 3/4
fn balanced_query(n: i32) -> i32 {
    if (n % 2 == 1) { return p.seq - 1 - n / 2; }
    return n / 2;
}

// kv head g's row of the step's token t appended to the cache (lanes 8 vec4 apart)
fn append_row(t: i32, g: i32, past: i32, lane: i32) {
    let src = (t * p.kv_heads + g) * D4;
    let to = ((past + t) * p.kv_heads + g) * D4;
    for (var d = lane; d < D4; d += 8) {
        ck[to + d] = vec4<${KV}>(k[src + d]);
        cv[to + d] = vec4<${KV}>(v[src + d]);
    }
}
