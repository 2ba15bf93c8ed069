// GatherV2: out[o, i, j] = params[o, index[i], j] over `outer` x `count` x `inner` elements, an
// index below 0 counted from the end of the axis (`extent`), one out of range giving 0 (as MNN).
struct Params { total: i32, count: i32, inner: i32, extent: i32, row: u32 }
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read> index: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let n = i32(id.x + id.y * p.row);
    if (n >= p.total) { return; }
    let j = n % p.inner;
    let i = (n / p.inner) % p.count;
    let o = n / (p.inner * p.count);
    var at = index[i];
    if (at < 0) { at += p.extent; }
    if (at < 0 || at >= p.extent) {
        out[n] = 0u;
    } else {
        out[n] = params[(o * p.extent + at) * p.inner + j];
    }
}
