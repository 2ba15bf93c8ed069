// Linear layer y[t, row0 + o] = sum_c x[t, c] * w[o, c] (+ bias[o]), then relu/relu6, for one chunk
// of `rows` output rows (a weight larger than one storage binding is split into chunks).
// A work-group is 8 output rows x 8 lanes x TILE tokens: the lanes of a row take its words in turn
// (neighbouring lanes read neighbouring words), each word dequantized once for the TILE tokens,
// and the 8 lanes' sums are added by a shared-memory tree. TILE is 1 for decode (a GEMV), 8 for
// prefill (a tiled GEMM); the host makes one pipeline of each.
// Weights: row o's codes at words [o * words, (o + 1) * words), `per` codes per word of `bits`
// bits each (code n of a word in bits [bits * n, bits * (n + 1))); bits 32: the word is an fp32
// weight. value = code - offset, w = value * scale + zero with sz[o * blocks + c / block] =
// (scale, zero), as MNN dequantizes. aligned != 0 (a block holds whole words): a word's codes
// share one (scale, zero), applied once per word to its sums (sum x*value and sum x).
const TILE: i32 = ${TILE};
struct Params {
    ic: i32, oc: i32, row0: i32, rows: i32, tokens: i32, words: i32, bits: i32, offset: f32,
    block: i32, blocks: i32, aligned: i32, has_bias: i32, act: i32,
}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> sz: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> part: array<f32, 512>;  // [TILE][64]

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = i32(li % 8u);
    let o = i32(wg.x * 8u + li / 8u);
    let t0 = i32(wg.y) * TILE;
    let live = o < p.rows;
    let orow = min(o, p.rows - 1);
    var acc: array<f32, TILE>;
    var xrow: array<i32, TILE>;
    for (var t = 0; t < TILE; t++) {
        acc[t] = 0.0;
        xrow[t] = min(t0 + t, p.tokens - 1) * p.ic;
    }
    let per = 32 / p.bits;
    let mask = select((1u << u32(p.bits)) - 1u, 0xFFFFFFFFu, p.bits == 32);
    for (var k = lane; k < p.words; k += 8) {
        let word = w[orow * p.words + k];
        let c0 = k * per;
        if (p.bits == 32) {
            let v = bitcast<f32>(word);
            for (var t = 0; t < TILE; t++) { acc[t] += x[xrow[t] + c0] * v; }
        } else if (p.aligned != 0) {
            let s = sz[orow * p.blocks + c0 / p.block];
            for (var t = 0; t < TILE; t++) {
                var dotv = 0.0;
                var xs = 0.0;
                for (var n = 0; n < per; n++) {
                    let xv = x[xrow[t] + c0 + n];
                    dotv += xv * (f32((word >> u32(p.bits * n)) & mask) - p.offset);
                    xs += xv;
                }
                acc[t] += s.x * dotv + s.y * xs;
            }
        } else {
            for (var n = 0; n < per; n++) {
                let c = c0 + n;
                if (c >= p.ic) { break; }
                let s = sz[orow * p.blocks + c / p.block];
                let v = (f32((word >> u32(p.bits * n)) & mask) - p.offset) * s.x + s.y;
                for (var t = 0; t < TILE; t++) { acc[t] += x[xrow[t] + c] * v; }
            }
        }
    }
    for (var t = 0; t < TILE; t++) { part[t * 64 + i32(li)] = acc[t]; }
    workgroupBarrier();
    for (var s = 4; s > 0; s >>= 1) {
        if (lane < s) {
            for (var t = 0; t < TILE; t++) { part[t * 64 + i32(li)] += part[t * 64 + i32(li) + s]; }
        }
        workgroupBarrier();
    }
    if (lane == 0 && live) {
        var b = 0.0;
        if (p.has_bias != 0) { b = bias[o]; }
        for (var t = 0; t < TILE; t++) {
            if (t0 + t >= p.tokens) { break; }
            var r = part[t * 64 + i32(li)] + b;
            if (p.act == 1) { r = max(r, 0.0); } else if (p.act == 2) { r = clamp(r, 0.0, 6.0); }
            y[(t0 + t) * p.oc + p.row0 + o] = r;
        }
    }
}
