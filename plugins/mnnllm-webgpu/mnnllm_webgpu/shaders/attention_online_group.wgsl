${ENABLE}
// Attention, one work-group per (query t, HEADS query heads of one kv head g) (a prefill: each key
// and value read once for the HEADS heads, ~0.6x the CPU time of attention_online.wgsl's one head
// a work-group), the rest in attention_online_common.wgsl: keys go by 8 at a time, one per
// invocation (the dot products a vec4 at a time), each head's 8 scores' max and sum by subgroup
// ops into its running max and sum (its sum and partial output rescaled when the max grows), then
// each invocation adds the 8 value rows, each head's weights passed by subgroupShuffle, into its
// share of each head's output (vec4 number lane, lane + 8, ...).
${COMMON}
const HEADS: i32 = ${HEADS};
@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let group = p.heads / p.kv_heads;
    let units = group / HEADS;  // work-groups of one (query, kv head)
    let th = i32(wg.x + wg.y * p.row);
    if (th >= p.seq * p.kv_heads * units) { return; }  // uniform per work-group
    let lane = i32(li);
    let unit = th % (p.kv_heads * units);
    let g = unit / units;
    let h0 = g * group + (unit % units) * HEADS;  // this work-group's first query head
    let t = balanced_query(th / (p.kv_heads * units));
    let past = step[0];
    let total = step[1];
    if (p.write_cache != 0 && h0 % group == 0 && t < p.kv_seq) { append_row(t, g, past, lane); }
    var qv: array<vec4<f32>, HEADS * D4>;  // head hh's vec4 d at hh * D4 + d
    for (var i = 0; i < HEADS * D4; i++) { qv[i] = q[(t * p.heads + h0) * D4 + i]; }
    var end = total;
    if (p.mask_mode == 1) { end = min(total, past + t + 1); }  // causally blocked keys weigh 0
    var top: array<f32, HEADS>;
    var sum: array<f32, HEADS>;
    var acc: array<vec4<f32>, HEADS * PER_LANE>;  // head hh's share i at hh * PER_LANE + i
    for (var hh = 0; hh < HEADS; hh++) {
        top[hh] = NEG_INF;
        sum[hh] = 0.0;
        if (p.has_sinks != 0) {  // the sink's logit: in the denominator from the start
            top[hh] = sinks[h0 + hh];
            sum[hh] = 1.0;
        }
    }
    for (var c = 0; c < end; c += 8) {
        let j = c + lane;
        var s: array<f32, HEADS>;
        for (var hh = 0; hh < HEADS; hh++) { s[hh] = NEG_INF; }
        if (j < end) {
            var dot4: array<vec4<f32>, HEADS>;  // zeroed by hand: naga declares a loop's locals once
            for (var hh = 0; hh < HEADS; hh++) { dot4[hh] = vec4<f32>(0.0); }
            for (var d = 0; d < D4; d++) {
                let kd = key(j, g, d, past);  // one key read for every head of the group
                for (var hh = 0; hh < HEADS; hh++) { dot4[hh] += qv[hh * D4 + d] * kd; }
            }
            var added = 0.0;
            var blocked = false;
            if (p.mask_mode >= 2) {
                let start = total - p.mask_cols;
                if (j >= start) {
                    let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
                    if (p.mask_mode == 2) { added = bitcast<f32>(bits); } else { blocked = bits == 0u; }
                }
            }
            for (var hh = 0; hh < HEADS; hh++) {
                s[hh] = (dot4[hh].x + dot4[hh].y + dot4[hh].z + dot4[hh].w) * p.scale + added;
                if (blocked) { s[hh] = NEG_INF; }
            }
        }
        var w: array<f32, HEADS>;
        var live = false;
        for (var hh = 0; hh < HEADS; hh++) {
            w[hh] = 0.0;
            let new_top = max(top[hh], subgroupMax(s[hh]));
            if (new_top <= NEG_INF) { continue; }  // every key so far masked out (w stays 0)
            live = true;
            let rescale = exp(top[hh] - new_top);
            w[hh] = exp(s[hh] - new_top);
            sum[hh] = sum[hh] * rescale + subgroupAdd(w[hh]);
            for (var i = 0; i < PER_LANE; i++) { acc[hh * PER_LANE + i] *= rescale; }
            top[hh] = new_top;
        }
        if (!live) { continue; }
        for (var kk = 0; kk < 8; kk++) {
            if (c + kk >= end) { break; }
            var wk: array<f32, HEADS>;
            for (var hh = 0; hh < HEADS; hh++) { wk[hh] = subgroupShuffle(w[hh], u32(kk)); }
            for (var i = 0; i < PER_LANE; i++) {
                let d = lane + 8 * i;
                if (d < D4) {
                    let vd = value(c + kk, g, d, past);  // one value read for every head of the group
                    for (var hh = 0; hh < HEADS; hh++) { acc[hh * PER_LANE + i] += wk[hh] * vd; }
                }
            }
        }
    }
    for (var hh = 0; hh < HEADS; hh++) {
        let inv = 1.0 / sum[hh];
        for (var i = 0; i < PER_LANE; i++) {
            let d = lane + 8 * i;
            if (d < D4) { o[(t * p.heads + h0 + hh) * D4 + d] = acc[hh * PER_LANE + i] * inv; }
        }
    }
}
