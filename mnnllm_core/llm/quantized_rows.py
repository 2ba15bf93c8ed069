"""Rows of a block-quantized [vocab, hidden] table, read one token at a time (MNN's DiskEmbedding, quantized).

Two places hold such a table, both described by `tie_embeddings` in llm_config.json
([weight_offset, alpha_offset, alpha_size, quant_bit, quant_block]):
- the tied lm_head inside `llm.mnn.weight` (weight_offset > 0: the first code byte after the
  Convolution's header), alphas fp16 by default (`alpha_dtype`);
- `embeddings_int8.bin` / `embeddings_int4.bin` (`--embed_bit 8|4 --seperate_embed`; weight_offset 0
  names `embedding_file`): all codes, then the alphas as fp32.

Codes are packed over the row-major [vocab, hidden] codes, most significant bits first (4 bit: high
nibble first; 3 bit: a bit stream). The alphas per (row, block) are one scale when symmetric
(w = scale * (u - 2^(b-1))) or a (zero, scale) pair (w = zero + scale * (u - 2^(b-1))); which one
follows, as in MNN, from alpha_size against the row count that the code bytes give.
MNN 3.6.1's runtime reads 2- and 3-bit rows with its 4-bit routine, 32 bytes from a buffer of 16 / 24
(the rest is heap memory: its tokens on a 2-bit tied model change from run to run); this reader
decodes them as the exporter wrote them, and says so.
"""
from __future__ import annotations

import logging

import numpy as np

from ..core.weights.file import ExternalWeightFile
from ..errors import ConfigError, FormatError, shorten

FIELD = "tie_embeddings"
log = logging.getLogger(__name__)

BITS = (2, 3, 4, 8, 16)
_ALPHA_BYTES = {"fp16": 2, "fp32": 4}


def tie_count(tie: dict, name: str, minimum: int, file: str | None) -> int:
    """An integer of tie_embeddings: a float or a bool there would silently misplace every row."""
    value = tie.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"tie_embeddings.{name} must be an integer >= {minimum}, got {shorten(repr(value), 40)}",
                          file=file, field=f"tie_embeddings.{name}")
    return value


class QuantizedRows:
    """One table's layout, checked against the file's size, and its rows dequantized to fp32 on demand."""

    def __init__(self, path: str, tie: dict, hidden: int, where: str | None):
        self.hidden = hidden
        self.bits = tie_count(tie, "quant_bit", 1, where)
        block = tie_count(tie, "quant_block", 0, where)
        self.weight_offset = tie_count(tie, "weight_offset", 0, where)
        self.alpha_offset = tie_count(tie, "alpha_offset", 0, where)
        alpha_size = tie_count(tie, "alpha_size", 0, where)
        self.file = ExternalWeightFile(path)
        if self.bits not in BITS or (hidden * self.bits) % 8:
            raise ConfigError(f"tie_embeddings.quant_bit {self.bits}: rows of {hidden} values must fill whole "
                              f"bytes at one of {BITS[:-1]} bits (or 16 for fp16)", file=where,
                              field=f"{FIELD}.quant_bit")
        self.row_bytes = hidden * self.bits // 8
        if self.bits == 16:  # fp16 rows, no alpha (MNN's exporter with --quant_bit 16)
            self.block, self.blocks, self.alpha_row_bytes, self.symmetric = hidden, 1, 0, False
            self.vocab = (self.file.size - self.weight_offset) // self.row_bytes
            return
        dtype = tie.get("alpha_dtype", "fp16")
        if dtype not in _ALPHA_BYTES:
            raise ConfigError(f"tie_embeddings.alpha_dtype {shorten(repr(dtype), 40)} is not one of "
                              f"{sorted(_ALPHA_BYTES)}", file=where, field=f"{FIELD}.alpha_dtype")
        width = _ALPHA_BYTES[dtype]
        self.alpha_dtype = np.dtype("<f4" if width == 4 else "<f2")
        code_bytes = self.alpha_offset - self.weight_offset  # the codes end where the alphas start (MNN's row count)
        self.vocab, uneven = divmod(code_bytes, self.row_bytes) if code_bytes > 0 else (0, 1)
        if uneven or self.vocab == 0:
            raise ConfigError(f"tie_embeddings: alpha_offset - weight_offset = {code_bytes} bytes is not a whole "
                              f"number of {self.bits}-bit rows of {hidden} ({self.row_bytes} bytes)", file=where,
                              field=f"{FIELD}.alpha_offset")
        self.block = block or hidden  # 0: one block per row, as MNN
        self.blocks = hidden // self.block
        stored_values, rest = divmod(alpha_size, width * self.vocab)  # alpha values per row
        if hidden % self.block:
            said = f"; alpha_size stores {stored_values} values per row" if not rest else ""
            raise ConfigError(f"tie_embeddings.quant_block {block} does not divide hidden_size {hidden}{said} "
                              f"(MNN's runtime then reads {self.blocks} blocks of each row, so its tokens come "
                              "from memory it never wrote)", file=where, field=f"{FIELD}.quant_block")
        if rest or stored_values not in (self.blocks, 2 * self.blocks):
            raise ConfigError(f"tie_embeddings.alpha_size {alpha_size} is neither {self.vocab} rows x {self.blocks} "
                              f"blocks (quant_block {block}) x 1 (symmetric) nor x 2 (zero, scale) {dtype} values",
                              file=where, field=f"{FIELD}.alpha_size")
        self.symmetric = stored_values == self.blocks
        self.alpha_row_bytes = stored_values * width
        for name, start, size in (("weight_offset", self.weight_offset, code_bytes),
                                  ("alpha_offset", self.alpha_offset, alpha_size)):
            if start + size > self.file.size:
                raise FormatError(f"tie_embeddings: {self.vocab} rows of {hidden} ({self.bits} bit, block "
                                  f"{self.block}) at {name} {start} run past the end of the file "
                                  f"({self.file.size} bytes)", file=path, field=f"{FIELD}.{name}")
        self.centre = np.float32(1 << (self.bits - 1))
        if self.bits in (2, 3):
            log.warning("%s: %d-bit embedding rows are decoded as written; MNN 3.6.1's runtime reads them with its "
                        "4-bit routine past the row's end, so its tokens differ", path, self.bits)

    def row(self, token: int) -> np.ndarray:
        """float32 [hidden] of one token (the caller checked 0 <= token < vocab)."""
        codes = self.file.read(self.weight_offset + token * self.row_bytes, self.row_bytes,
                               op_name="embedding", field=f"{FIELD}.weight_offset")
        if self.bits == 16:
            return codes.view("<f2").astype(np.float32)
        alpha = self.file.read(self.alpha_offset + token * self.alpha_row_bytes, self.alpha_row_bytes,
                               op_name="embedding", field=f"{FIELD}.alpha_offset")
        values = unpack_row(codes, self.bits, self.hidden).astype(np.float32) - self.centre
        values = values.reshape(self.blocks, self.block)
        alphas = alpha.view(self.alpha_dtype).astype(np.float32).reshape(self.blocks, -1)
        scale = alphas[:, -1:]
        if self.symmetric:
            return (values * scale).reshape(-1)
        return (values * scale + alphas[:, :1]).reshape(-1)

    @property
    def bytes_per_row(self) -> int:
        return self.row_bytes + self.alpha_row_bytes


def unpack_row(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """`count` unsigned codes of `bits` bits packed most significant bit first."""
    if bits == 8:
        return packed[:count]
    if bits == 4:
        codes = np.empty(count, np.uint8)
        codes[0::2], codes[1::2] = packed >> 4, packed & 0x0F
        return codes
    stream = np.unpackbits(packed)[:count * bits].reshape(count, bits)
    return (stream * (1 << np.arange(bits - 1, -1, -1, dtype=np.uint8))).sum(axis=1, dtype=np.uint8)
