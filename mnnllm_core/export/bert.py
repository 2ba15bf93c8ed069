"""BERT-style text encoders (BGE, GTE's BERT models, MiniLM): absolute position and token type
embeddings, post-LayerNorm layers with biased linears and GELU, bidirectional attention, and a
pooled, L2-normalized sentence embedding, as MNN's llmexport writes them for `Embedding`.

The pooling is the model's: sentence-transformers' `1_Pooling/config.json` when the folder has one
(CLS or mean tokens), else CLS, MNN's choice for every BERT model. `ModelArgs.read` refuses what
changes the math and is not built (relative positions, a decoder, another pooling).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mnnllm_core.errors import ConfigError, UnsupportedError
from mnnllm_core.json_depth import loads_bounded

from .config import ConfigReader
from .sources import LazyTensor, Source

POOLINGS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens"}  # -> sentence-transformers' flag
# HF's hidden_act -> MNN UnaryOp: exact erf GELU, or the tanh approximation.
ACTIVATIONS = {"gelu": "GELU_STANDARD", "gelu_new": "GELU", "gelu_pytorch_tanh": "GELU"}
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")
LINEARS = QKV + ("attention.output.dense", "intermediate.dense", "output.dense")
NORMS = ("attention.output.LayerNorm", "output.LayerNorm")
_POOLING_FILE = "1_Pooling/config.json"
# sentence-transformers' pooling flags that, set, ask for something not built here.
_OTHER_POOLINGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                   "pooling_mode_lasttoken")


@dataclass
class ModelArgs:
    """The config.json fields of a BERT encoder; `from_dict` refuses keys it does not understand."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    act: str
    pooling: str = "cls"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, config: dict[str, Any], file: str | None = None, pooling: str = "cls") -> "ModelArgs":
        r = ConfigReader(config, file)
        hidden, heads = r.size("hidden_size"), r.size("num_attention_heads")
        if hidden % heads:
            raise r.error(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}", "hidden_size")
        act = r.require("hidden_act", tuple(ACTIVATIONS), "gelu")
        r.require("position_embedding_type", ("absolute",), "absolute")
        r.require("is_decoder", (False,), False)
        r.require("add_cross_attention", (False,), False)
        r.ignore("attention_probs_dropout_prob", "hidden_dropout_prob", "tie_word_embeddings", "gradient_checkpointing",
                 "use_cache", "classifier_dropout")
        args = cls(model_type=r.get("model_type"), hidden_size=hidden, num_hidden_layers=r.size("num_hidden_layers"),
                   num_attention_heads=heads, intermediate_size=r.size("intermediate_size"),
                   vocab_size=r.size("vocab_size"), max_position_embeddings=r.size("max_position_embeddings", 512),
                   type_vocab_size=r.size("type_vocab_size", 2), layer_norm_eps=r.number("layer_norm_eps", 1e-12),
                   act=ACTIVATIONS[act], pooling=pooling)
        r.finish()
        return args


def pooling_of(folder: str | Path) -> str:
    """The pooling sentence-transformers' config in `folder` names; "cls" (MNN's) without one."""
    path = Path(folder) / _POOLING_FILE
    if not path.is_file():
        return "cls"
    try:
        config = loads_bounded(path.read_text(encoding="utf-8"), str(path), ConfigError)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the pooling config: {exc}", file=str(path)) from None
    if not isinstance(config, dict):
        raise ConfigError("the pooling config must be a JSON object", file=str(path))
    chosen = [mode for mode, flag in POOLINGS.items() if config.get(flag)]
    other = [key for key in _OTHER_POOLINGS if config.get(key)]
    if other or len(chosen) != 1:
        field = other[0] if other else "pooling_mode_cls_token"
        raise UnsupportedError(f"pooling {', '.join(other + chosen) or 'none'} (supported: exactly one of "
                               f"{', '.join(POOLINGS.values())})", file=str(path), field=field)
    return chosen[0]


class Model:
    """The checkpoint's tensor names (BertModel's, with or without a `bert.` prefix)."""

    def __init__(self, args: ModelArgs, source: Source):
        self.args = args
        self.prefix = "bert." if source.has("bert.embeddings.word_embeddings.weight") else ""

    def name(self, key: str) -> str:
        return self.prefix + key

    def embedding(self) -> str:
        return self.name("embeddings.word_embeddings.weight")

    def position_table(self, source: Source) -> np.ndarray:
        table = source.tensor(self.name("embeddings.position_embeddings.weight")).load()
        if table.shape != (self.args.max_position_embeddings, self.args.hidden_size):
            raise UnsupportedError(f"position embeddings of shape {table.shape}, expected "
                                   f"({self.args.max_position_embeddings}, {self.args.hidden_size})",
                                   file=source.path, field=self.name("embeddings.position_embeddings.weight"))
        return table

    def token_type_row(self, source: Source) -> np.ndarray:
        """Token type 0's row: a single text is all type 0, as MNN's exporter bakes it in."""
        return source.tensor(self.name("embeddings.token_type_embeddings.weight")).rows(0, 1).reshape(-1)

    def embedding_norm(self) -> str:
        return self.name("embeddings.LayerNorm")

    def layer(self, i: int, part: str) -> str:
        """`part`: one of LINEARS or NORMS."""
        return self.name(f"encoder.layer.{i}.{part}")

    def weight(self, source: Source, name: str) -> LazyTensor:
        return source.tensor(f"{name}.weight")

    def bias(self, source: Source, name: str) -> LazyTensor:
        return source.tensor(f"{name}.bias")

    def parameter_count(self, source: Source) -> int:
        """Elements the weight file is built from, as the writer counts them: linear weights and the
        norms' gamma and beta (the embedding table goes to embeddings_bf16.bin)."""
        norms = [self.embedding_norm()]
        linears = []
        for i in range(self.args.num_hidden_layers):
            norms += [self.layer(i, p) for p in NORMS]
            linears += [self.layer(i, p) for p in LINEARS]
        tensors = [source.tensor(f"{n}.{kind}") for n in norms for kind in ("weight", "bias")]
        tensors += [source.tensor(f"{n}.weight") for n in linears]
        return sum(int(np.prod(t.shape, dtype=np.int64)) for t in tensors)


def chat_template(tokenizer_json: dict[str, Any]) -> str:
    """MNN's embedding template: the text between the special tokens HF's post-processor puts
    around a single sequence ([CLS] ... [SEP]), so `txt_embedding` tokenizes as HF's `tokenizer(text)`."""
    before, after = _wrapping(tokenizer_json.get("post_processor"))
    # MNN's llmexport writes `messages | map(attribute='content') | join('')`, which MNN 3.6.1's
    # jinja renders as a JSON list (["text"]); a loop renders the text alike in both engines.
    return before + "{% for message in messages %}{{ message['content'] }}{% endfor %}" + after


def _wrapping(post: Any) -> tuple[str, str]:
    if not isinstance(post, dict):
        return "", ""
    kind = post.get("type")
    if kind == "BertProcessing":
        return post["cls"][0], post["sep"][0]
    if kind == "Sequence":
        for child in post.get("processors", []):
            found = _wrapping(child)
            if found != ("", ""):
                return found
        return "", ""
    if kind != "TemplateProcessing":
        return "", ""
    parts: tuple[list[str], list[str]] = ([], [])
    seen_text = False
    for piece in post.get("single", []):
        if "Sequence" in piece:
            seen_text = True
        elif "SpecialToken" in piece:
            parts[seen_text].append(piece["SpecialToken"]["id"])
    return "".join(parts[0]), "".join(parts[1])
