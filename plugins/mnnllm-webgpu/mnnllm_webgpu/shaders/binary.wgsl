// Float BinaryOp over a broadcast of up to 4 dims: c[i] = a[ia] op b[ib], then a fused relu/relu6.
// BROADCAST false (both inputs of the output's size): no index arithmetic (lavapipe divides lane by
// lane). op: 0 add, 1 sub, 2 mul, 3 div, 4 a * silu(b), 5 max, 6 min; act: 0 none, 1 relu, 2 relu6.
struct Params { dims: vec4<i32>, sa: vec4<i32>, sb: vec4<i32>, total: i32, op: i32, act: i32, row: u32 }
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

const BROADCAST: bool = ${BROADCAST};

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = i32(id.x + id.y * p.row);
    if (i >= p.total) { return; }
    var ia = i;
    var ib = i;
    if (BROADCAST) {
        var rest = i;
        ia = 0;
        ib = 0;
        for (var d = 3; d >= 0; d--) {
            let k = rest % p.dims[d];
            rest = rest / p.dims[d];
            ia += k * p.sa[d];
            ib += k * p.sb[d];
        }
    }
    let x = a[ia];
    let y = b[ib];
    var r: f32;
    switch p.op {
        case 0: { r = x + y; }
        case 1: { r = x - y; }
        case 2: { r = x * y; }
        case 3: { r = x / y; }
        case 4: { r = x * (y / (1.0 + exp(-y))); }
        case 5: { r = max(x, y); }
        default: { r = min(x, y); }
    }
    if (p.act == 1) { r = max(r, 0.0); } else if (p.act == 2) { r = clamp(r, 0.0, 6.0); }
    c[i] = r;
}
