"""`mnnllm bench`: llama-bench / llm_bench style device and backend benchmarks."""
