"""Where an export reads from: a HuggingFace folder (config.json, *.safetensors, tokenizer.json) or a GGUF file.

Both give the same three things: an HF-style config dict, tensors by their HF name
(`model.layers.0.self_attn.q_proj.weight`, ...) read lazily in row ranges, and the
tokenizer as a tokenizer.json dict plus the few tokenizer_config values an export
needs. Nothing is loaded whole: safetensors are memory-mapped and parsed here with
numpy (an 8-byte header length, a JSON header, raw little-endian tensors); GGUF
tensors are dequantized row range by row range with the `gguf` package.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from mnnllm_core.errors import ConfigError, FormatError, UnsupportedError
from mnnllm_core.json_depth import MAX_DEPTH, loads_bounded

_SAFETENSORS_DTYPES = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8"),
}
_MAX_HEADER = 100 << 20


@dataclass
class LazyTensor:
    """A 1-D or 2-D tensor read on demand: `rows(r0, r1)` returns fp32 rows [r0, r1)."""

    name: str
    shape: tuple[int, ...]
    read_rows: Callable[[int, int], np.ndarray] = field(repr=False)

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.read_rows(start, stop)

    def load(self) -> np.ndarray:
        return self.rows(0, self.shape[0])

    def row_range(self, start: int, stop: int, name: str) -> "LazyTensor":
        """Rows [start, stop) as a tensor of its own (one projection of a fused qkv or gate_up weight)."""
        if not 0 <= start < stop <= self.shape[0]:
            raise FormatError(f"tensor {self.name!r} of {self.shape[0]} rows has no rows [{start}, {stop}) for "
                              f"{name}", field=self.name)
        return LazyTensor(name, (stop - start,) + self.shape[1:], lambda a, b: self.read_rows(start + a, start + b))


def expert_matrix(tensor: LazyTensor, expert: int, name: str, transpose: bool = False) -> LazyTensor:
    """Matrix `expert` of a fused [experts, rows, cols] tensor as a 2-D tensor; `transpose` for a
    checkpoint that stores it [in, out] (Llama 4) rather than a Linear's [out, in]."""
    if len(tensor.shape) != 3 or not 0 <= expert < tensor.shape[0]:
        raise FormatError(f"tensor {tensor.name!r} of shape {tensor.shape} has no expert matrix {expert}",
                          field=tensor.name)
    if transpose:
        return LazyTensor(name, tensor.shape[:0:-1], lambda a, b: tensor.rows(expert, expert + 1)[0].T[a:b])
    return LazyTensor(name, tensor.shape[1:], lambda a, b: tensor.rows(expert, expert + 1)[0, a:b])


def permute_rows(tensor: LazyTensor, order: np.ndarray, name: str) -> LazyTensor:
    """Row r of the result is row order[r] of `tensor` (a per-head reordering of a projection)."""
    order = np.asarray(order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(tensor.shape[0])):
        raise FormatError(f"{name}: not a permutation of the {tensor.shape[0]} rows of {tensor.name!r}",
                          field=tensor.name)

    def rows(start: int, stop: int) -> np.ndarray:
        wanted = order[start:stop]
        low, high = int(wanted.min()), int(wanted.max()) + 1
        return tensor.rows(low, high)[wanted - low]

    return LazyTensor(name, tensor.shape, rows)


def concat_rows(parts: list[LazyTensor], name: str) -> LazyTensor:
    """Tensors of the same row width stacked into one (MNN's fused gate_up Linear of an expert)."""
    if len({p.shape[1:] for p in parts}) != 1:
        raise FormatError(f"{name}: cannot stack rows of shapes {[p.shape for p in parts]}",
                          field=parts[0].name)
    starts = np.cumsum([0] + [p.shape[0] for p in parts])

    def rows(start: int, stop: int) -> np.ndarray:
        chunks = [p.rows(max(start, a) - a, min(stop, b) - a) for p, a, b in zip(parts, starts[:-1], starts[1:])
                  if max(start, a) < min(stop, b)]
        return np.concatenate(chunks)

    return LazyTensor(name, (int(starts[-1]),) + parts[0].shape[1:], rows)


@dataclass
class TokenizerSpec:
    """A tokenizer as tokenizer.json describes it, plus what tokenizer_config / generation_config add."""

    tokenizer_json: dict[str, Any]
    bos_token: str | None = None
    eos_token: str | None = None
    chat_template: str | None = None
    stop_ids: list[int] = field(default_factory=list)
    prefix_ids: list[int] = field(default_factory=list)
    clean_up_spaces: bool = False


class Source:
    """The interface every source implements."""

    path: str
    config: dict[str, Any]

    def tensor(self, name: str) -> LazyTensor:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        raise NotImplementedError

    def tokenizer(self) -> TokenizerSpec:
        raise NotImplementedError

    def elements(self) -> int:
        """Values in all its tensors: what an export reads (for an estimate of its time)."""
        raise NotImplementedError


def open_source(path: str | os.PathLike) -> Source:
    """A HF folder or a .gguf file; anything else is a ConfigError naming the path."""
    p = Path(path)
    if p.is_dir():
        return HFSource(p)
    if p.is_file() and p.suffix == ".gguf":
        return GGUFSource(p)
    if not p.exists():
        raise ConfigError("not found: no such file or folder", file=str(p))
    raise ConfigError("export source must be a HuggingFace model folder or a .gguf file", file=str(p))


# ---------------------------------------------------------------------------
# HuggingFace folder
# ---------------------------------------------------------------------------

def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


class HFSource(Source):
    """config.json + model*.safetensors + tokenizer.json (+ tokenizer_config.json, generation_config.json)."""

    def __init__(self, folder: Path):
        self.path = str(folder)
        self.config = _read_json(folder / "config.json")
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FormatError("no *.safetensors file in the model folder", file=str(folder))
        self._tensors: dict[str, LazyTensor] = {}
        for f in files:
            for t in _read_safetensors(f):
                self._tensors[t.name] = t
        self._folder = folder

    def has(self, name: str) -> bool:
        return name in self._tensors

    def elements(self) -> int:
        return sum(int(np.prod(t.shape, dtype=np.int64)) for t in self._tensors.values())

    def tensor(self, name: str) -> LazyTensor:
        try:
            return self._tensors[name]
        except KeyError:
            raise FormatError(f"tensor {name!r} is missing", file=self.path, field=name) from None

    def tokenizer(self) -> TokenizerSpec:
        tj = _read_json(self._folder / "tokenizer.json")
        tc_path = self._folder / "tokenizer_config.json"
        tc = _read_json(tc_path) if tc_path.exists() else {}
        vocab = _vocab_of(tj)
        bos, eos = _token_text(tc.get("bos_token")), _token_text(tc.get("eos_token"))
        stop = [vocab[eos]] if eos in vocab else []
        gen_path = self._folder / "generation_config.json"
        if gen_path.exists():
            gen_eos = _read_json(gen_path).get("eos_token_id")
            stop += [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        template = tc.get("chat_template")
        if template is None and (self._folder / "chat_template.jinja").exists():
            template = (self._folder / "chat_template.jinja").read_text(encoding="utf-8")
        return TokenizerSpec(tj, bos_token=bos, eos_token=eos, chat_template=template,
                             stop_ids=sorted(set(stop)), prefix_ids=_template_prefix(tj.get("post_processor")),
                             clean_up_spaces=tc.get("clean_up_tokenization_spaces") is True)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = loads_bounded(f.read(), str(path), ConfigError)
    except FileNotFoundError:
        raise ConfigError("file is missing", file=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not valid JSON: {exc}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a JSON object", file=str(path))
    return data


def _read_safetensors(path: Path) -> list[LazyTensor]:
    """Parse the header and map each tensor's bytes; every offset is checked against the file size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError("file too short for a safetensors header", file=str(path))
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, _MAX_HEADER):
            raise FormatError(f"header length {n} exceeds the file", file=str(path), field="header")
        try:
            header = loads_bounded(f.read(n), str(path), FormatError, field="header")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise FormatError(f"header is not JSON: {exc}", file=str(path), field="header") from None
        if not isinstance(header, dict):
            raise FormatError("header is not a JSON object", file=str(path), field="header")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    data = np.frombuffer(mapped, dtype=np.uint8, offset=8 + n)
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            start, stop = (int(o) for o in info["data_offsets"])
        except KeyError as exc:
            raise UnsupportedError(f"tensor {name!r}: dtype or field {exc} not supported", file=str(path),
                                   field=name) from None
        except (TypeError, ValueError):
            raise FormatError(f"tensor {name!r}: malformed header entry", file=str(path), field=name) from None
        count = int(np.prod(shape, dtype=np.int64))
        if not 0 <= start <= stop <= data.size or stop - start != count * dtype.itemsize:
            raise FormatError(f"tensor {name!r}: data_offsets [{start}, {stop}) do not hold {shape} "
                              f"{info['dtype']} within the file", file=str(path), field=name)
        array = data[start:stop].view(dtype).reshape(shape)
        tensors.append(LazyTensor(name, shape, _safetensors_reader(array, info["dtype"] == "BF16", mapped,
                                                                   8 + n + start)))
    return tensors


def _safetensors_reader(array: np.ndarray, bf16: bool, mapped: mmap.mmap, base: int) -> Callable[[int, int], np.ndarray]:
    """Rows as fp32 copies; the mapped pages they came from are dropped at once, so RSS stays at a chunk."""
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))  # a 0-d tensor is one row

    def rows(start: int, stop: int) -> np.ndarray:
        part = array[start:stop]
        out = _bf16_to_f32(part) if bf16 else np.array(part, dtype=np.float32)
        first = (base + start * row_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        end = base + stop * row_bytes
        if end > first:
            mapped.madvise(mmap.MADV_DONTNEED, first, end - first)
        return out
    return rows


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _vocab_of(tj: dict[str, Any]) -> dict[str, int]:
    model = tj.get("model", {})
    vocab = model.get("vocab", {})
    if isinstance(vocab, list):  # Unigram: [token, score] by id
        vocab = {item[0]: i for i, item in enumerate(vocab)}
    vocab = dict(vocab)
    for added in tj.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    return vocab


def _template_prefix(post: Any) -> list[int]:
    """Special ids a TemplateProcessing puts before the text (what MNN finds by encoding 'A')."""
    if not isinstance(post, dict):
        return []
    if post.get("type") == "Sequence":
        for child in post.get("processors", []):
            ids = _template_prefix(child)
            if ids:
                return ids
        return []
    if post.get("type") != "TemplateProcessing":
        return []
    prefix: list[int] = []
    for item in post.get("single", []):
        if "Sequence" in item:
            return prefix
        special = item.get("SpecialToken", {})
        prefix += post.get("special_tokens", {}).get(special.get("id"), {}).get("ids", [])
    return []


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

# GGUF tensor names -> HF names; "{i}" is the layer.
_GGUF_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
    "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
    "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}

# GGUF metadata suffix -> HF config key (prefixed by the architecture).
_GGUF_CONFIG = {
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
    "rope.dimension_count": "head_dim",
}

# llama.cpp's pre-tokenizer names whose HF pre_tokenizer is GPT-2's ByteLevel with its regex.
_GPT2_PRE = {"gpt2", "smollm", "default"}
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4


class GGUFSource(Source):
    """A GGUF file; q/k rows are un-permuted back to HF's order (llama.cpp's converter permutes them per head)."""

    def __init__(self, path: Path):
        import gguf

        self.path = str(path)
        try:
            self._reader = gguf.GGUFReader(str(path))
        except RecursionError:  # its reader recurses once per level of a metadata array of arrays
            raise FormatError(f"metadata arrays nested deeper than {MAX_DEPTH}", file=self.path) from None
        except (ValueError, OSError, struct.error, IndexError) as exc:
            raise FormatError(f"not a readable GGUF file: {exc}", file=self.path) from None
        for key, f in self._reader.fields.items():
            if len(f.types) > MAX_DEPTH:  # one type per level of a nested array
                raise FormatError(f"metadata arrays nested deeper than {MAX_DEPTH}", file=self.path, field=key)
        arch = self._field("general.architecture")
        self.config: dict[str, Any] = {"model_type": arch}
        for suffix, key in _GGUF_CONFIG.items():
            value = self._field(f"{arch}.{suffix}", None)
            if value is not None:
                self.config[key] = value
        names = {t.name: t for t in self._reader.tensors}
        if "rope_freqs.weight" in names:  # llama.cpp's per-frequency factors (llama3 rope scaling)
            raise UnsupportedError("GGUF rope_freqs (per-frequency rope factors) is not read", file=self.path,
                                   field="rope_freqs.weight")
        scaling = self._field(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":  # handed to the config reader, which knows linear and refuses the rest
            self.config["rope_scaling"] = {"rope_type": scaling,
                                           "factor": self._field(f"{arch}.rope.scaling.factor", None)}
        self.config["tie_word_embeddings"] = "output.weight" not in names
        if "vocab_size" not in self.config and "token_embd.weight" in names:
            self.config["vocab_size"] = int(names["token_embd.weight"].shape[-1])
        self._tensors: dict[str, Any] = {}
        for name, t in names.items():
            hf = _hf_name(name)
            if hf is not None:
                self._tensors[hf] = t

    def _field(self, key: str, default: Any = ...) -> Any:
        f = self._reader.fields.get(key)
        if f is None:
            if default is ...:
                raise FormatError("metadata key is missing", file=self.path, field=key)
            return default
        return f.contents()

    def has(self, name: str) -> bool:
        return name in self._tensors

    def elements(self) -> int:
        return sum(int(t.n_elements) for t in self._tensors.values())

    def tensor(self, name: str) -> LazyTensor:
        from gguf.quants import dequantize

        t = self._tensors.get(name)
        if t is None:
            raise FormatError(f"tensor {name!r} is missing", file=self.path, field=name)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        data, qtype = t.data, t.tensor_type
        src_rows = self._row_order(name, shape[0])

        def rows(start: int, stop: int) -> np.ndarray:
            raw = data[start:stop] if src_rows is None else data[src_rows[start:stop]]
            out = dequantize(np.asarray(raw), qtype).astype(np.float32, copy=False)
            return out.reshape((stop - start,) + shape[1:]) if len(shape) > 1 else out.reshape(-1)

        return LazyTensor(name, shape, rows)

    def _row_order(self, name: str, n_rows: int) -> np.ndarray | None:
        """For q/k: the GGUF row holding each HF row (llama.cpp stores each head's halves interleaved)."""
        if self.config["model_type"] != "llama":
            return None
        if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            heads = self.config["num_attention_heads"]
        elif name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            heads = self.config.get("num_key_value_heads", self.config["num_attention_heads"])
        else:
            return None
        head_dim = n_rows // heads
        r = np.arange(n_rows)
        h, rem = np.divmod(r, head_dim)
        t, i = np.divmod(rem, head_dim // 2)
        return h * head_dim + 2 * i + t

    def tokenizer(self) -> TokenizerSpec:
        model = self._field("tokenizer.ggml.model")
        if model != "gpt2":
            raise UnsupportedError(f"GGUF tokenizer model {model!r} (only byte-level BPE, 'gpt2')",
                                   file=self.path, field="tokenizer.ggml.model")
        pre = self._field("tokenizer.ggml.pre", "default")
        if pre in _GPT2_PRE:
            pre_tokenizer: dict[str, Any] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                             "use_regex": True}
        elif pre == "qwen2":
            pre_tokenizer = {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        else:
            raise UnsupportedError(f"GGUF pre-tokenizer {pre!r}", file=self.path, field="tokenizer.ggml.pre")
        tokens: list[str] = self._field("tokenizer.ggml.tokens")
        types = self._field("tokenizer.ggml.token_type", [1] * len(tokens))
        merges: list[str] = self._field("tokenizer.ggml.merges")
        added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": kind != _TOKEN_CONTROL, "special": kind == _TOKEN_CONTROL}
                 for i, (tok, kind) in enumerate(zip(tokens, types)) if kind in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)]
        tj = {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": pre_tokenizer, "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
        }
        bos_id = self._field("tokenizer.ggml.bos_token_id", None)
        eos_id = self._field("tokenizer.ggml.eos_token_id", None)
        stop = [i for i in (eos_id, self._field("tokenizer.ggml.eot_token_id", None)) if i is not None]
        add_bos = bool(self._field("tokenizer.ggml.add_bos_token", False))
        return TokenizerSpec(
            tj, bos_token=tokens[bos_id] if bos_id is not None else None,
            eos_token=tokens[eos_id] if eos_id is not None else None,
            chat_template=self._field("tokenizer.chat_template", None), stop_ids=sorted(set(stop)),
            prefix_ids=[bos_id] if add_bos and bos_id is not None else [])


def _hf_name(gguf_name: str) -> str | None:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit():
        key = ".".join(["blk", "{i}"] + parts[2:])
        hf = _GGUF_NAMES.get(key)
        return hf.format(i=parts[1]) if hf else None
    return _GGUF_NAMES.get(gguf_name)
