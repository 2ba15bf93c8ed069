${ENABLE}
// Append a step's keys and values to the KV cache: `count` floats of k and of v (token-major rows
// of row_floats) at row step[0] (past), which the host writes before each submit, so a replayed
// step writes each token where the host's bookkeeping says; the cache holds KV (f32, or f16
// rounded to nearest).
struct Params { count: i32, row_floats: i32, row: u32 }
@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> ck: array<${KV}>;
@group(0) @binding(3) var<storage, read_write> cv: array<${KV}>;
@group(0) @binding(4) var<storage, read> step: array<i32>;  // past, total
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    if (i >= p.count) { return; }
    let at = step[0] * p.row_floats + i;
    ck[at] = ${KV}(k[i]);
    cv[at] = ${KV}(v[i]);
}
