// The adapter's subgroup size, as a work-group of one invocation sees it (device.subgroup_size).
@group(0) @binding(0) var<storage, read_write> out: array<u32>;

@compute @workgroup_size(1)
fn main(@builtin(subgroup_size) size: u32) {
    out[0] = size;
}
