"""Weights, from the file to the backend: `file` (llm.mnn.weight, read by offset), `const_blob`
(constants inline in the graph), `quant` (MNN's quantized storage decoded: IDSTQuan, block
scales, HQQ), `formats` (what a backend's creator receives: QuantizedWeight, FloatWeight,
ConvolutionWeights, MoEExpert), `op_weights` (an op's weights read lazily at load),
`moe_experts` (an MoE op's experts and their ExpertProgram), `cache` (packed weights kept on
disk across loads, `use_mmap`)."""
