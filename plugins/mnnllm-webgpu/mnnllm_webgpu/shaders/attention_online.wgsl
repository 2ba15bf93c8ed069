${ENABLE}
// Attention, one work-group per (query t, head h) (a decode step: its few work-groups spread over
// the threads), the rest in attention_online_common.wgsl: keys go by 8 at a time, one per
// invocation (the dot product a vec4 at a time), the 8 scores' max and sum by subgroup ops into a
// running max and sum (the sum and the partial output rescaled when the max grows), then each
// invocation adds the 8 value rows, their weights passed by subgroupShuffle, into its share of
// the output (vec4 number lane, lane + 8, ...).
${COMMON}
@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let th = i32(wg.x + wg.y * p.row);
    if (th >= p.seq * p.heads) { return; }  // uniform per work-group
    let lane = i32(li);
    let h = th % p.heads;
    let t = balanced_query(th / p.heads);
    let qh = t * p.heads + h;  // the (query, head) row of q and o
    let group = p.heads / p.kv_heads;
    let g = h / group;
    let past = step[0];
    let total = step[1];
    if (p.write_cache != 0 && h % group == 0 && t < p.kv_seq) { append_row(t, g, past, lane); }
    var qv: array<vec4<f32>, D4>;
    for (var d = 0; d < D4; d++) { qv[d] = q[qh * D4 + d]; }
    var end = total;
    if (p.mask_mode == 1) { end = min(total, past + t + 1); }  // causally blocked keys weigh 0
    var top = NEG_INF;
    var sum = 0.0;
    if (p.has_sinks != 0) {  // the sink's logit: in the denominator from the start
        top = sinks[h];
        sum = 1.0;
    }
    var acc: array<vec4<f32>, PER_LANE>;
    for (var c = 0; c < end; c += 8) {
        let j = c + lane;
        var s = NEG_INF;
        if (j < end) {
            var dot4 = vec4<f32>(0.0);
            for (var d = 0; d < D4; d++) { dot4 += qv[d] * key(j, g, d, past); }
            s = (dot4.x + dot4.y + dot4.z + dot4.w) * p.scale;
            if (p.mask_mode >= 2) {
                let start = total - p.mask_cols;
                if (j >= start) {
                    let bits = mask[(p.mask_rows - p.seq + t) * p.mask_cols + j - start];
                    if (p.mask_mode == 2) { s += bitcast<f32>(bits); } else if (bits == 0u) { s = NEG_INF; }
                }
            }
        }
        let new_top = max(top, subgroupMax(s));
        if (new_top <= NEG_INF) { continue; }  // every key so far masked out
        let rescale = exp(top - new_top);
        let w = exp(s - new_top);
        sum = sum * rescale + subgroupAdd(w);
        for (var i = 0; i < PER_LANE; i++) { acc[i] *= rescale; }
        for (var kk = 0; kk < 8; kk++) {
            let wk = subgroupShuffle(w, u32(kk));
            if (c + kk >= end) { break; }
            for (var i = 0; i < PER_LANE; i++) {
                let d = lane + 8 * i;
                if (d < D4) { acc[i] += wk * value(c + kk, g, d, past); }
            }
        }
        top = new_top;
    }
    let inv = 1.0 / sum;
    for (var i = 0; i < PER_LANE; i++) {
        let d = lane + 8 * i;
        if (d < D4) { o[qh * D4 + d] = acc[i] * inv; }
    }
}
