"""mnnllm's WebGPU backend: an out-of-tree plugin running the LLM op set as WGSL kernels through wgpu-py."""
