// Linear layer on 4-bit codes with the linear map, the fast path of linear.wgsl (same outputs,
// same chunks) for ic and the block size multiples of 32: a row's codes read 32 at a time as one
// vec4<u32> (code 8k+n of word k in bits 4n), the inputs as vec4<f32>, one (scale, zero) per 32
// codes. LANES invocations share ROWS output rows (LANES 8 needs ROWS 1: the lanes' sums are added
// by SUM8, a subgroup butterfly where the adapter has subgroups, else a shared-memory tree;
// ops/linear.py runs it with 8 lanes and 1 row on a GPU, a CPU adapter runs linear_q4_rows.wgsl);
// TILE tokens per work-group (1: decode GEMV, 8: prefill tiled GEMM), each 32 codes decoded once
// for the TILE tokens.
const TILE: i32 = ${TILE};
const LANES: u32 = ${LANES}u;
const ROWS: i32 = ${ROWS};
const GROUP_ROWS: u32 = 64u / LANES * u32(ROWS);
struct Params {
    ic: i32, oc: i32, row0: i32, rows: i32, tokens: i32, vecs: i32, vecs_per_block: i32, blocks: i32,
    has_bias: i32, act: i32, offset: f32,
}
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> sz: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> part: array<f32, 64>;

fn sum8(li: u32, v: f32) -> f32 {  // the sum of v over the 8 lanes li / 8 * 8 .. + 7 (uniform control flow)
    ${SUM8}
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = i32(li % LANES);
    let o0 = i32(wg.x * GROUP_ROWS + (li / LANES) * u32(ROWS));
    let t0 = i32(wg.y) * TILE;
    var acc: array<f32, TILE * ROWS>;
    var xrow: array<i32, TILE>;
    for (var t = 0; t < TILE; t++) { xrow[t] = min(t0 + t, p.tokens - 1) * (p.ic / 4); }
    for (var i = 0; i < TILE * ROWS; i++) { acc[i] = 0.0; }
    let shifts_lo = vec4<u32>(0u, 4u, 8u, 12u);
    let shifts_hi = vec4<u32>(16u, 20u, 24u, 28u);
    var codes: array<vec4<f32>, 8 * ROWS>;
    var scales: array<vec2<f32>, ROWS>;
    for (var k = lane; k < p.vecs; k += i32(LANES)) {
        for (var r = 0; r < ROWS; r++) {
            let orow = min(o0 + r, p.rows - 1);
            let wv = w[orow * p.vecs + k];
            scales[r] = sz[orow * p.blocks + k / p.vecs_per_block];
            for (var c = 0; c < 4; c++) {
                codes[r * 8 + 2 * c] = vec4<f32>((vec4<u32>(wv[c]) >> shifts_lo) & vec4<u32>(15u)) - p.offset;
                codes[r * 8 + 2 * c + 1] = vec4<f32>((vec4<u32>(wv[c]) >> shifts_hi) & vec4<u32>(15u)) - p.offset;
            }
        }
        for (var t = 0; t < TILE; t++) {
            let base = xrow[t] + k * 8;
            var xa: array<vec4<f32>, 8>;
            var xs = vec4<f32>(0.0);
            for (var c = 0; c < 8; c++) {
                xa[c] = x[base + c];
                xs += xa[c];
            }
            let xsum = xs.x + xs.y + xs.z + xs.w;
            for (var r = 0; r < ROWS; r++) {
                var d = 0.0;
                for (var c = 0; c < 8; c++) { d += dot(codes[r * 8 + c], xa[c]); }
                acc[t * ROWS + r] += scales[r].x * d + scales[r].y * xsum;
            }
        }
    }
    if (LANES > 1u) {  // with ROWS 1
        for (var t = 0; t < TILE; t++) { acc[t] = sum8(li, acc[t]); }
    }
    if (lane != 0) { return; }
    for (var r = 0; r < ROWS; r++) {
        let o = o0 + r;
        if (o >= p.rows) { break; }
        var b = 0.0;
        if (p.has_bias != 0) { b = bias[o]; }
        for (var t = 0; t < TILE; t++) {
            if (t0 + t >= p.tokens) { break; }
            var v = acc[t * ROWS + r] + b;
            if (p.act == 1) { v = max(v, 0.0); } else if (p.act == 2) { v = clamp(v, 0.0, 6.0); }
            y[(t0 + t) * p.oc + p.row0 + o] = v;
        }
    }
}
