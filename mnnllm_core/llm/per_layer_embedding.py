"""Gemma 4's per-layer embeddings (PLE): the graph's extra input `ple_embeddings` that the engine
fills for every step, as MNN's `Llm::embedding` does.

MNN 3.6's exporter writes the per-layer embedding table to `ple_embed_file` (raw bf16
[vocab, ple_embed_dim], ple_embed_dim = layers x hidden_size_per_layer_input) and the graph
declares an input `ple_embeddings` [1, seq, ple_embed_dim]. Per step the engine reads the row of
each new token (the same ids as `input_ids`), multiplies it by `ple_embed_scale` and feeds it;
the graph does the rest. Rows are read from the mapped file like DiskEmbedding's, never the whole
table. `ple_quant` (a quantized table) is not implemented.
"""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from ..errors import ConfigError, FormatError, UnsupportedError, shorten
from .config import LlmConfig
from .disk_embedding import BF16Rows

INPUT_NAME = "ple_embeddings"


def has_per_layer_embedding(config: LlmConfig) -> bool:
    """MNN's LlmConfig::has_ple: the key `ple_embed_file` is present at all."""
    return "ple_embed_file" in config


class PerLayerEmbedding:
    """The `ple_embeddings` rows of token ids: [1, seq, ple_embed_dim] float32, scaled."""

    def __init__(self, config: LlmConfig, vocab: int):
        """`vocab`: the rows of the token embedding table; the PLE table must have as many."""
        self.path = config.ple_embed_file
        dim, scale, quant = config.get("ple_embed_dim"), config.get("ple_embed_scale", 1.0), config.ple_quant
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"ple_embed_dim must be an integer >= 1, got {shorten(repr(dim), 40)}",
                              file=config.origin("ple_embed_dim") or config.source, field="ple_embed_dim")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ConfigError(f"ple_embed_scale must be a finite number, got {shorten(repr(scale), 40)}",
                              file=config.origin("ple_embed_scale"), field="ple_embed_scale")
        if quant:
            raise UnsupportedError(f"a quantized per-layer embedding table (ple_quant {quant}) is not implemented; "
                                   "export it as bf16", file=config.origin("ple_quant"), field="ple_quant")
        if not os.path.isfile(self.path):
            raise ConfigError(f"ple_embed_file names a file that does not exist: {self.path}",
                              file=config.origin("ple_embed_file"), field="ple_embed_file")
        self.dim = dim
        self.scale = np.float32(scale)
        self.table = BF16Rows(self.path, dim, "ple_embed_dim")
        if self.table.vocab < vocab:
            raise FormatError(f"{self.table.vocab} rows of ple_embed_dim {dim}, fewer than the {vocab} tokens of the "
                              f"embedding table (the file is truncated or ple_embed_dim is wrong)", file=self.path,
                              field="ple_embed_file")
        self.config_origin = config.origin("ple_embed_dim")

    def check_graph(self, input_dims: Sequence[int], graph: str) -> None:
        """The graph's `ple_embeddings` must take rows of ple_embed_dim."""
        if not input_dims or int(input_dims[-1]) != self.dim:
            raise ConfigError(f"ple_embed_dim is {self.dim} but the graph's input {INPUT_NAME} has dims "
                              f"{list(input_dims)} ({graph})", file=self.config_origin, field="ple_embed_dim")

    def rows(self, ids: Sequence[int]) -> np.ndarray:
        """The `ple_embeddings` input of these tokens: [1, len(ids), ple_embed_dim]."""
        out = np.empty((1, len(ids), self.dim), np.float32)
        for i, token in enumerate(ids):
            if not 0 <= int(token) < self.table.vocab:
                raise FormatError(f"token id {token} is outside the per-layer embedding table of "
                                  f"{self.table.vocab}", file=self.path, field="input_ids")
            out[0, i] = self.table.row(int(token))
        if self.scale != 1:
            out *= self.scale
        return out
