"""Generation strategies (MNN's GenerationStrategy): autoregressive for now."""
from .ar import ARGeneration

__all__ = ["ARGeneration"]
