// A 4-bit linear layer on a CPU adapter (linear_q4.wgsl's layout, parameters and outputs): one
// invocation per 8 output rows of one token (the token: the dispatch's y), so that each input load
// serves eight rows (lavapipe reads a storage buffer one lane at a time: loads are what costs),
// written without private arrays (its JIT keeps an indexed one in memory). X_DECL: x a storage
// array, or for one token a uniform block (lavapipe reads a uniform one load for all lanes). The
// codes' offset is taken off once per 32 codes: sum((c - offset) * x) = sum(c * x) - offset * sum(x).
struct Params {
    ic: i32, oc: i32, row0: i32, rows: i32, tokens: i32, vecs: i32, vecs_per_block: i32, blocks: i32,
    has_bias: i32, act: i32, offset: f32,
}
@group(0) @binding(0) ${X_DECL}
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> sz: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

struct Inputs { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
                a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

fn lo(word: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn hi(word: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
}

fn row_dot(wv: vec4<u32>, a: Inputs) -> f32 {  // sum over 32 codes of code * input
    return dot(lo(wv.x), a.a0) + dot(hi(wv.x), a.a1) + dot(lo(wv.y), a.a2) + dot(hi(wv.y), a.a3)
         + dot(lo(wv.z), a.a4) + dot(hi(wv.z), a.a5) + dot(lo(wv.w), a.a6) + dot(hi(wv.w), a.a7);
}

fn finish(t: i32, o: i32, v: f32) {
    if (o >= p.rows) { return; }
    var r = v;
    if (p.has_bias != 0) { r += bias[o]; }
    if (p.act == 1) { r = max(r, 0.0); } else if (p.act == 2) { r = clamp(r, 0.0, 6.0); }
    y[t * p.oc + p.row0 + o] = r;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let o = i32(id.x) * 8;
    let t = i32(id.y);
    if (o >= p.rows || t >= p.tokens) { return; }
    let r1 = min(o + 1, p.rows - 1);
    let r2 = min(o + 2, p.rows - 1);
    let r3 = min(o + 3, p.rows - 1);
    let r4 = min(o + 4, p.rows - 1);
    let r5 = min(o + 5, p.rows - 1);
    let r6 = min(o + 6, p.rows - 1);
    let r7 = min(o + 7, p.rows - 1);
    var acc = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    for (var k = 0; k < p.vecs; k++) {
        let base = (t * p.vecs + k) * 8;
        let a = Inputs(x[base], x[base + 1], x[base + 2], x[base + 3],
                       x[base + 4], x[base + 5], x[base + 6], x[base + 7]);
        let sum4 = a.a0 + a.a1 + a.a2 + a.a3 + a.a4 + a.a5 + a.a6 + a.a7;
        let xs = sum4.x + sum4.y + sum4.z + sum4.w;
        let b = k / p.vecs_per_block;
        let s0 = sz[o * p.blocks + b];
        let s1 = sz[r1 * p.blocks + b];
        let s2 = sz[r2 * p.blocks + b];
        let s3 = sz[r3 * p.blocks + b];
        let d = vec4<f32>(row_dot(w[o * p.vecs + k], a), row_dot(w[r1 * p.vecs + k], a),
                          row_dot(w[r2 * p.vecs + k], a), row_dot(w[r3 * p.vecs + k], a));
        acc += vec4<f32>(s0.x, s1.x, s2.x, s3.x) * (d - p.offset * xs) + vec4<f32>(s0.y, s1.y, s2.y, s3.y) * xs;
        let s4 = sz[r4 * p.blocks + b];
        let s5 = sz[r5 * p.blocks + b];
        let s6 = sz[r6 * p.blocks + b];
        let s7 = sz[r7 * p.blocks + b];
        let e = vec4<f32>(row_dot(w[r4 * p.vecs + k], a), row_dot(w[r5 * p.vecs + k], a),
                          row_dot(w[r6 * p.vecs + k], a), row_dot(w[r7 * p.vecs + k], a));
        acc2 += vec4<f32>(s4.x, s5.x, s6.x, s7.x) * (e - p.offset * xs) + vec4<f32>(s4.y, s5.y, s6.y, s7.y) * xs;
    }
    finish(t, o, acc.x);
    finish(t, o + 1, acc.y);
    finish(t, o + 2, acc.z);
    finish(t, o + 3, acc.w);
    finish(t, o + 4, acc2.x);
    finish(t, o + 5, acc2.y);
    finish(t, o + 6, acc2.z);
    finish(t, o + 7, acc2.w);
}
