"""MNN's DiskEmbedding: per token, seek and read one row, dequantize it, write it out.

The table is never loaded: rows come from `embeddings_bf16.bin` (raw bf16 [vocab, hidden])
or from the tied lm_head's quantized rows in the weight file (`tie_embeddings` offsets),
both memory-mapped, so only the pages of the requested rows are touched.
"""
from __future__ import annotations

import logging
import os
from typing import Sequence

import numpy as np

from ..errors import ConfigError, FormatError, shorten
from ..express.weight_file import ExternalWeightFile
from .config import LlmConfig

log = logging.getLogger(__name__)


def _count(tie: dict, name: str, minimum: int, file: str | None) -> int:
    """An integer of tie_embeddings: a float or a bool there would silently misplace every row."""
    value = tie.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"tie_embeddings.{name} must be an integer >= {minimum}, got {shorten(repr(value), 40)}",
                          file=file, field=f"tie_embeddings.{name}")
    return value


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
        if os.path.exists(config.embedding_file):
            self.source = "bf16"
            self.table = BF16Rows(config.embedding_file, self.hidden, "hidden_size")
            self.file, self.row_bytes, self.vocab = self.table.file, self.table.row_bytes, self.table.vocab
        elif isinstance(tie, dict):
            self._init_tied(config, tie)
        else:
            raise ConfigError(f"no embedding: {config.embedding_file} does not exist and llm_config has no "
                              f"tie_embeddings", file=config.origin("tie_embeddings"), field="tie_embeddings")

    def _init_tied(self, config: LlmConfig, tie: dict) -> None:
        self.source = "tied"
        field = "tie_embeddings"
        where = config.origin(field)
        self.bits = _count(tie, "quant_bit", 1, where)
        self.block = _count(tie, "quant_block", 0, where) or self.hidden  # 0: one block per row, as MNN
        self.weight_offset = _count(tie, "weight_offset", 0, where)
        self.alpha_offset = _count(tie, "alpha_offset", 0, where)
        alpha_size = _count(tie, "alpha_size", 0, where)
        self.file = ExternalWeightFile(config.llm_weight)
        if self.bits == 16:  # fp16 rows, no alpha (MNN's exporter with --quant-bit 16)
            self.row_bytes, self.alpha_row_bytes = self.hidden * 2, 0
            self.vocab = (self.file.size - self.weight_offset) // self.row_bytes
            return
        if self.bits not in (4, 8) or self.hidden % self.block or (self.hidden * self.bits) % 8:
            raise ConfigError(f"tie_embeddings: unsupported quant_bit {self.bits} / quant_block {self.block}",
                              file=config.origin(field), field=field)
        self.blocks = self.hidden // self.block
        self.row_bytes = self.hidden * self.bits // 8
        self.alpha_row_bytes = self.blocks * 2 * (4 if tie.get("alpha_dtype") == "fp32" else 2)
        self.alpha_dtype = np.float32 if tie.get("alpha_dtype") == "fp32" else np.float16
        self.vocab = alpha_size // self.alpha_row_bytes
        if alpha_size % self.alpha_row_bytes or self.vocab == 0:
            raise ConfigError(f"tie_embeddings.alpha_size {alpha_size} is not a whole number of rows",
                              file=config.origin(field), field=field)
        for name, start, size in (("weight_offset", self.weight_offset, self.vocab * self.row_bytes),
                                  ("alpha_offset", self.alpha_offset, alpha_size)):
            if start + size > self.file.size:  # e.g. a quant_block that does not match alpha_size
                raise ConfigError(f"tie_embeddings: {self.vocab} rows of {self.hidden} ({self.bits} bit, block "
                                  f"{self.block}) at {name} {start} run past the end of the weight file "
                                  f"({self.file.size} bytes)", file=config.origin(field), field=f"{field}.{name}")

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
        if self.source == "bf16":
            self.bytes_read += self.row_bytes
            return self.table.row(token)
        codes = self.file.read(self.weight_offset + token * self.row_bytes, self.row_bytes,
                               op_name="embedding", field="tie_embeddings.weight_offset")
        if self.bits == 16:
            self.bytes_read += self.row_bytes
            return codes.view("<f2").astype(np.float32)
        alpha = self.file.read(self.alpha_offset + token * self.alpha_row_bytes, self.alpha_row_bytes,
                               op_name="embedding", field="tie_embeddings.alpha_offset")
        self.bytes_read += self.row_bytes + self.alpha_row_bytes
        if self.bits == 4:
            values = np.empty(self.hidden, np.uint8)
            values[0::2] = codes >> 4
            values[1::2] = codes & 0x0F
        else:
            values = codes
        pairs = alpha.view(self.alpha_dtype).astype(np.float32).reshape(self.blocks, 2)
        zero, scale = pairs[:, :1], pairs[:, 1:]
        signed = values.astype(np.float32).reshape(self.blocks, self.block) - np.float32(1 << (self.bits - 1))
        return (signed * scale + zero).reshape(-1)
