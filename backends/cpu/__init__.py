"""mnnllm's reference backend: numpy on the cpu, fp32 arithmetic."""
