// Fused RoPE on q and k (rotate-half form) without per-head norms: one invocation per rotated
// pair (i, i + rope_dim / 2) of a (token, head), and one per element past rope_dim (copied), so
// that neighbouring invocations read neighbouring elements (lavapipe reads a storage buffer lane
// by lane: rope.wgsl's invocation per head walks 64 elements a head apart). Heads [0, heads)
// are q's, [heads, heads + kv_heads) k's; cos/sin rows are cs_stride apart, laid out
// [first half | second half] of rope_dim.
struct Params { seq: i32, heads: i32, kv_heads: i32, dim: i32, rope_dim: i32, cs_stride: i32, row: i32 }
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> cosines: array<f32>;
@group(0) @binding(3) var<storage, read> sines: array<f32>;
@group(0) @binding(4) var<storage, read_write> qo: array<f32>;
@group(0) @binding(5) var<storage, read_write> ko: array<f32>;
@group(0) @binding(6) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let half_dim = p.rope_dim / 2;
    let lanes = p.dim - half_dim;  // invocations of one head
    let per = p.heads + p.kv_heads;
    let n = i32(id.x) + i32(id.y) * p.row;  // over 65535 work-groups folded into y (device.fold)
    if (n >= p.seq * per * lanes) { return; }
    let head = n / lanes;
    let j = n % lanes;
    let t = head / per;
    let h = head % per;
    let isq = h < p.heads;
    var base = (t * p.kv_heads + h - p.heads) * p.dim;
    if (isq) { base = (t * p.heads + h) * p.dim; }
    if (j >= half_dim) {  // past rope_dim: element j + half_dim copied
        let i = base + j + half_dim;
        if (isq) { qo[i] = q[i]; } else { ko[i] = k[i]; }
        return;
    }
    let a = base + j;
    let b = a + half_dim;
    var v = k[a];
    var u = k[b];
    if (isq) {
        v = q[a];
        u = q[b];
    }
    let c = t * p.cs_stride + j;
    let first = v * cosines[c] - u * sines[c];
    let second = u * cosines[c + half_dim] + v * sines[c + half_dim];
    if (isq) {
        qo[a] = first;
        qo[b] = second;
    } else {
        ko[a] = first;
        ko[b] = second;
    }
}
