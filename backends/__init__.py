"""Backends shipped with mnnllm; each registers itself through the `mnnllm` entry points."""
