enable f16;
// Linear layer over fp16 weights, computed in f32: y[t, row0 + o] = sum_c x[t, c] * w[o, c]
// (+ bias[o]), then relu/relu6, for one chunk of `rows` output rows. One invocation per output
// row and TILE tokens, no barrier (lavapipe pays a coroutine switch for each): it walks its row
// four channels a load (ic a multiple of 4: ic4 vec4s a row), each f16 vec4 widened exactly to
// f32 once for the TILE tokens. TILE is 1 for decode (a GEMV), 4 for prefill.
const TILE: i32 = ${TILE};
struct Params { ic4: i32, oc: i32, row0: i32, rows: i32, tokens: i32, has_bias: i32, act: i32 }
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let o = i32(id.x);
    let t0 = i32(id.y) * TILE;
    if (o >= p.rows) { return; }
    var sums = array<f32, TILE>();
    let last = p.tokens - 1;
    for (var k = 0; k < p.ic4; k++) {
        let v = vec4<f32>(w[o * p.ic4 + k]);
        for (var t = 0; t < TILE; t++) { sums[t] += dot(x[min(t0 + t, last) * p.ic4 + k], v); }
    }
    var b = 0.0;
    if (p.has_bias != 0) { b = bias[o]; }
    for (var t = 0; t < TILE; t++) {
        if (t0 + t > last) { break; }
        var r = sums[t] + b;
        if (p.act == 1) { r = max(r, 0.0); } else if (p.act == 2) { r = clamp(r, 0.0, 6.0); }
        y[(t0 + t) * p.oc + p.row0 + o] = r;
    }
}
