// Fused RoPE on q and k (rotate-half form), one invocation per (token, head): heads
// [0, heads) are q's, [heads, heads + kv_heads) k's. cos/sin rows are cs_stride apart, laid out
// [first half | second half] of rope_dim; dims past rope_dim are copied. An optional per-head
// norm comes first; flags: 1 on, 2 RMS, 4 beta.
struct Params {
    seq: i32, heads: i32, kv_heads: i32, dim: i32, rope_dim: i32, cs_stride: i32,
    q_eps: f32, k_eps: f32, q_flags: i32, k_flags: i32,
}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> cosines: array<f32>;
@group(0) @binding(3) var<storage, read> sines: array<f32>;
@group(0) @binding(4) var<storage, read_write> qo: array<f32>;
@group(0) @binding(5) var<storage, read_write> ko: array<f32>;
@group(0) @binding(6) var<storage, read> qg: array<f32>;
@group(0) @binding(7) var<storage, read> qb: array<f32>;
@group(0) @binding(8) var<storage, read> kg: array<f32>;
@group(0) @binding(9) var<storage, read> kb: array<f32>;
@group(0) @binding(10) var<uniform> p: Params;

fn raw(isq: bool, i: i32) -> f32 {
    if (isq) { return q[i]; }
    return k[i];
}

fn store(isq: bool, i: i32, v: f32) {
    if (isq) { qo[i] = v; } else { ko[i] = v; }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let per = p.heads + p.kv_heads;
    let n = i32(id.x);
    if (n >= p.seq * per) { return; }
    let t = n / per;
    let h = n % per;
    let isq = h < p.heads;
    var base = (t * p.kv_heads + h - p.heads) * p.dim;
    var flags = p.k_flags;
    var eps = p.k_eps;
    if (isq) {
        base = (t * p.heads + h) * p.dim;
        flags = p.q_flags;
        eps = p.q_eps;
    }
    var mean = 0.0;
    var inv = 1.0;
    if ((flags & 1) != 0) {
        if ((flags & 2) == 0) {
            for (var i = 0; i < p.dim; i++) { mean += raw(isq, base + i); }
            mean /= f32(p.dim);
        }
        var sq = 0.0;
        for (var i = 0; i < p.dim; i++) {
            let d = raw(isq, base + i) - mean;
            sq += d * d;
        }
        inv = 1.0 / sqrt(sq / f32(p.dim) + eps);
    }
    let half_dim = p.rope_dim / 2;
    let cb = t * p.cs_stride;
    for (var i = 0; i < p.dim; i++) {
        // element i of this head, normed when the flags say so, then rotated
        var v = raw(isq, base + i);
        var partner_i = i + half_dim;
        if (i >= half_dim) { partner_i = i - half_dim; }
        var u = raw(isq, base + partner_i);
        if ((flags & 1) != 0) {
            if (isq) {
                v = (v - mean) * inv * qg[i];
                u = (u - mean) * inv * qg[partner_i];
                if ((flags & 4) != 0) { v += qb[i]; u += qb[partner_i]; }
            } else {
                v = (v - mean) * inv * kg[i];
                u = (u - mean) * inv * kg[partner_i];
                if ((flags & 4) != 0) { v += kb[i]; u += kb[partner_i]; }
            }
        }
        if (i < half_dim) {
            store(isq, base + i, v * cosines[cb + i] - u * sines[cb + i]);
        } else if (i < 2 * half_dim) {
            store(isq, base + i, v * cosines[cb + i] + u * sines[cb + i]);
        } else {
            store(isq, base + i, v);
        }
    }
}
