// A 4-bit linear layer over several tokens on a CPU adapter (prefill; linear_q4.wgsl's layout):
// one invocation per 4 output rows x 4 tokens, so that each weight load and each dequantized code
// serves four tokens. x is a uniform block of `chunk` token rows starting at token t0 (lavapipe
// loads a uniform value once for all lanes; the host binds one window of the input per dispatch);
// the tokens of a work-group: the dispatch's y times 4. Past the last row or token: the last one
// is read again and nothing written. Per 32 codes: sum((c - offset) * x) = sum(c * x) - offset * sum(x).
struct Params {
    ic: i32, oc: i32, row0: i32, rows: i32, chunk: i32, vecs: i32, vecs_per_block: i32, blocks: i32,
    has_bias: i32, act: i32, offset: f32, t0: i32,
}
@group(0) @binding(0) var<uniform> x: array<vec4<f32>, ${XV}>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> sz: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

struct Vec32 { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
               a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32> }

fn lo(word: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn hi(word: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
}

fn codes(wv: vec4<u32>) -> Vec32 {
    return Vec32(lo(wv.x), hi(wv.x), lo(wv.y), hi(wv.y), lo(wv.z), hi(wv.z), lo(wv.w), hi(wv.w));
}

fn inputs(t: i32, k: i32) -> Vec32 {
    let base = (t * p.vecs + k) * 8;
    return Vec32(x[base], x[base + 1], x[base + 2], x[base + 3], x[base + 4], x[base + 5], x[base + 6], x[base + 7]);
}

fn dot32(c: Vec32, a: Vec32) -> f32 {
    return dot(c.a0, a.a0) + dot(c.a1, a.a1) + dot(c.a2, a.a2) + dot(c.a3, a.a3)
         + dot(c.a4, a.a4) + dot(c.a5, a.a5) + dot(c.a6, a.a6) + dot(c.a7, a.a7);
}

fn total(a: Vec32) -> f32 {
    let s = a.a0 + a.a1 + a.a2 + a.a3 + a.a4 + a.a5 + a.a6 + a.a7;
    return s.x + s.y + s.z + s.w;
}

// rows o..o+3 of token t: scale * (sum(c * x) - offset * sum(x)) + zero * sum(x)
fn part(c0: Vec32, c1: Vec32, c2: Vec32, c3: Vec32, a: Vec32, sc: vec4<f32>, zr: vec4<f32>) -> vec4<f32> {
    let xs = total(a);
    let d = vec4<f32>(dot32(c0, a), dot32(c1, a), dot32(c2, a), dot32(c3, a));
    return sc * (d - p.offset * xs) + zr * xs;
}

fn finish(t: i32, o: i32, v: f32) {
    if (o >= p.rows || t >= p.chunk) { return; }
    var r = v;
    if (p.has_bias != 0) { r += bias[o]; }
    if (p.act == 1) { r = max(r, 0.0); } else if (p.act == 2) { r = clamp(r, 0.0, 6.0); }
    y[(p.t0 + t) * p.oc + p.row0 + o] = r;
}

fn store(t: i32, o: i32, v: vec4<f32>) {
    finish(t, o, v.x);
    finish(t, o + 1, v.y);
    finish(t, o + 2, v.z);
    finish(t, o + 3, v.w);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let o = i32(id.x) * 4;
    let t = i32(id.y) * 4;
    if (o >= p.rows) { return; }
    let r1 = min(o + 1, p.rows - 1);
    let r2 = min(o + 2, p.rows - 1);
    let r3 = min(o + 3, p.rows - 1);
    let t1 = min(t + 1, p.chunk - 1);
    let t2 = min(t + 2, p.chunk - 1);
    let t3 = min(t + 3, p.chunk - 1);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0; k < p.vecs; k++) {
        let b = k / p.vecs_per_block;
        let s0 = sz[o * p.blocks + b];
        let s1 = sz[r1 * p.blocks + b];
        let s2 = sz[r2 * p.blocks + b];
        let s3 = sz[r3 * p.blocks + b];
        let sc = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
        let zr = vec4<f32>(s0.y, s1.y, s2.y, s3.y);
        let c0 = codes(w[o * p.vecs + k]);
        let c1 = codes(w[r1 * p.vecs + k]);
        let c2 = codes(w[r2 * p.vecs + k]);
        let c3 = codes(w[r3 * p.vecs + k]);
        acc0 += part(c0, c1, c2, c3, inputs(t, k), sc, zr);
        acc1 += part(c0, c1, c2, c3, inputs(t1, k), sc, zr);
        acc2 += part(c0, c1, c2, c3, inputs(t2, k), sc, zr);
        acc3 += part(c0, c1, c2, c3, inputs(t3, k), sc, zr);
    }
    store(t, o, acc0);
    store(t + 1, o, acc1);
    store(t + 2, o, acc2);
    store(t + 3, o, acc3);
}
