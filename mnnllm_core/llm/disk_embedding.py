"""MNN's DiskEmbedding: per token, seek and read one row, dequantize it, write it out.

The table is never loaded: rows come from `embeddings_bf16.bin` (raw bf16 [vocab, hidden]), or,
quantized (`quantized_rows.py`), from the tied lm_head's rows in the weight file or from
`embeddings_int8.bin` / `embeddings_int4.bin` (`tie_embeddings` describes either), all
memory-mapped, so only the pages of the requested rows are touched. A row must be finite.
"""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np

from ..core.weights.file import ExternalWeightFile
from ..core.weights.finite import check_finite
from ..errors import ConfigError, FormatError
from .config import LlmConfig
from .quantized_rows import QuantizedRows

log = logging.getLogger(__name__)


class BF16Rows:
    """A raw bf16 table [rows, width] on disk (no header), memory-mapped: MNN's exporter writes the
    token embeddings (`embeddings_bf16.bin`) and Gemma 4's per-layer embeddings this way.
    `width_field` names the config key that gave the width, for the error of a file that is not
    a whole number of rows."""

    def __init__(self, path: str, width: int, width_field: str):
        self.file = ExternalWeightFile(path)
        self.width = width
        self.row_bytes = width * 2
        if self.file.size % self.row_bytes:
            raise FormatError(f"{self.file.size} bytes is not a whole number of bf16 rows of {width}",
                              file=path, field=width_field)
        self.vocab = self.file.size // self.row_bytes

    def row(self, token: int) -> np.ndarray:
        """Row `token` as float32 (a bf16 is the high half of a float32)."""
        raw = self.file.read(token * self.row_bytes, self.row_bytes, op_name="embedding", field="row")
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)


class DiskEmbedding:
    def __init__(self, config: LlmConfig):
        self.hidden = int(config.hidden_size)
        self.bytes_read = 0
        tie = config.tie_embeddings
        if isinstance(tie, dict) and tie.get("weight_offset") == 0:  # MNN: the table is embedding_file, quantized
            self._init_quantized(config, tie, str(config.embedding_file))
        elif os.path.exists(config.embedding_file):
            self.source = "bf16"
            self.table = BF16Rows(config.embedding_file, self.hidden, "hidden_size")
            self.file, self.row_bytes, self.vocab = self.table.file, self.table.row_bytes, self.table.vocab
        elif isinstance(tie, dict):  # the tied lm_head's rows; a named embedding file that was never written is ignored
            self._init_quantized(config, tie, str(config.llm_weight))
        else:
            raise ConfigError(f"no embedding: {config.embedding_file} does not exist and llm_config has no "
                              f"tie_embeddings", file=config.origin("tie_embeddings"), field="tie_embeddings")

    def _init_quantized(self, config: LlmConfig, tie: dict, path: str) -> None:
        if not os.path.exists(path):
            raise ConfigError(f"tie_embeddings.weight_offset 0 names the embedding file {path}, which does not exist",
                              file=config.origin("embedding_file"), field="embedding_file")
        self.source = "quantized"
        self.rows = QuantizedRows(path, tie, self.hidden, config.origin("tie_embeddings"))
        self.file, self.vocab = self.rows.file, self.rows.vocab
        self.row_bytes, self.alpha_row_bytes = self.rows.row_bytes, self.rows.alpha_row_bytes

    def embedding(self, ids: Sequence[int]) -> np.ndarray:
        """[len(ids), 1, hidden] float32 - the `input_ids` input of the graph."""
        out = np.empty((len(ids), 1, self.hidden), np.float32)
        for i, token in enumerate(ids):
            if not 0 <= int(token) < self.vocab:
                raise FormatError(f"token id {token} is outside the embedding table of {self.vocab}",
                                  file=self.file.path, field="input_ids")
            out[i, 0] = self._row(int(token))
        return out

    def _row(self, token: int) -> np.ndarray:
        """Row `token`, which must be finite (a corrupt file decodes to NaN or infinity)."""
        if self.source == "bf16":
            self.bytes_read += self.row_bytes
            row = self.table.row(token)
        else:
            self.bytes_read += self.rows.bytes_per_row
            row = self.rows.row(token)
        check_finite(row, f"token {token}'s row, value", "embedding", str(self.file.path), "embedding")
        return row
