"""mnnllm's torch backend: an out-of-tree plugin that runs part of the op set on torch tensors."""
