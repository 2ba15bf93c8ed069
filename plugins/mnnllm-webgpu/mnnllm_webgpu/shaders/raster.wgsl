// One Raster region of 4-byte elements over a box of 3 dims (the last fastest):
// dst[dst.w + i . dst.xyz] = src[src.w + i . src.xyz].
struct Params { size: vec4<i32>, src: vec4<i32>, dst: vec4<i32>, row: u32 }
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    if (i >= p.size.w) { return; }
    let z = i % p.size.z;
    let rest = i / p.size.z;
    let y = rest % p.size.y;
    let x = rest / p.size.y;
    dst[p.dst.w + x * p.dst.x + y * p.dst.y + z * p.dst.z] = src[p.src.w + x * p.src.x + y * p.src.y + z * p.src.z];
}
