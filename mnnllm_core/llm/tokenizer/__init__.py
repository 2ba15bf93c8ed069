"""Tokenizers of MNN-LLM exports: `create_tokenizer(path)` reads any of MNN's formats."""
from .base import StreamDecoder, Tokenizer
from .factory import create_tokenizer
from .reader import TokenizerType

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerType", "create_tokenizer"]
