// Cast on raw 32-bit words. mode 0: float -> int (toward zero), 1: int -> float, 2: a copy.
struct Params { total: i32, mode: i32, row: u32 }
@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    if (i >= p.total) { return; }
    let w = x[i];
    if (p.mode == 0) {
        y[i] = bitcast<u32>(i32(bitcast<f32>(w)));
    } else if (p.mode == 1) {
        y[i] = bitcast<u32>(f32(bitcast<i32>(w)));
    } else {
        y[i] = w;
    }
}
