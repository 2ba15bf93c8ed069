"""Small draft modules in MNN's MTP and Eagle layouts (see llm/generation/drafts.py).

No trained draft exists for the models here, so these are linear: the main model's final
hidden state h_t and the embedding e_{t+1} of the token it chose are concatenated, and

* MTP: one Linear [2H -> heads * H] guesses h_{t+1+k} for each head k, then the main model's
  lm_head gives each head's logits; with `attention` the features first pass a decoder layer
  at width 2H (f + o(Attention(...)) over its own KV cache) and only the rows from
  `logits_index` on (-1: the last, as MNN feeds it) go to the heads;
* Eagle: `eagle_fc` is a Linear [H -> H] (the identity when fitted); one `eagle` step is a
  Linear [2H -> H] guessing h_{t+1} (`out_hidden_states`) and an lm_head over a draft
  vocabulary (the most frequent tokens), mapped back by `eagle_d2t`. With `attention` the step
  is a small decoder layer, as a real Eagle export has: after the Linear x, out = x +
  o(Attention(RoPE(q(x), k(x)), v(x), attention_mask)) over the draft's own KV cache, the
  rotary angles from `position_ids` (what llm/generation/draft_kv.py feeds it).

`random_*` drafts have random weights (they guess badly, which speculative decoding must
survive); `fit_drafts` solves for the Linears by ridge least squares on hidden states the
main model itself produces over some token sequences, which gives real acceptance.
Each file is written beside its destination and renamed into place.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from mnnllm_core.core.weights.file import ExternalWeightFile
from mnnllm_core.core.weights.op_weights import OpWeights
from mnnllm_core.errors import FormatError
from mnnllm_core.files import written_beside
from mnnllm_core.schema.MNN.AttentionParam import AttentionParamT
from mnnllm_core.schema.MNN.BinaryOpOperation import BinaryOpOperation
from mnnllm_core.schema.MNN.CastParam import CastParamT
from mnnllm_core.schema.MNN.DataType import DataType
from mnnllm_core.schema.MNN.OpParameter import OpParameter
from mnnllm_core.schema.MNN.OpType import OpType
from mnnllm_core.schema.MNN.RoPEParam import RoPEParamT
from mnnllm_core.schema.MNN.UnaryOpOperation import UnaryOpOperation
from mnnllm_core.schema.reader import op_type_name, read_net_file

from .decoder import from_c4, linear, to_c4
from .graph import NHWC, GraphBuilder
from .sources import LazyTensor
from .weights import WeightWriter

if TYPE_CHECKING:
    from mnnllm_core.llm.config import LlmConfig
    from mnnllm_core.llm.llm import Llm

PROJECTION_BITS = 8  # the fitted Linears are small and want precision
HEAD_BITS, HEAD_BLOCK = 4, 64  # lm_heads are large and read every draft step


@dataclass
class DraftAttention:
    """A draft's attention layer at width W (Eagle: H, MTP: 2H): q [heads*dim, W], k and v
    [kv_heads*dim, W], o [W, heads*dim]."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    heads: int
    kv_heads: int
    theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.q.shape[0] // self.heads


@dataclass
class MtpWeights:
    heads: np.ndarray  # [heads * H, 2H]: rows k*H .. (k+1)*H guess h_{t+1+k} from [h_t, e_{t+1}]
    lm_head: np.ndarray  # [vocab, H]
    attention: DraftAttention | None = None  # a decoder layer over the features (width 2H)

    @property
    def count(self) -> int:
        return self.heads.shape[0] // self.lm_head.shape[1]


@dataclass
class EagleWeights:
    fc: np.ndarray  # [H, H]
    step: np.ndarray  # [H, 2H]: [hidden, e] -> the next draft hidden state
    lm_head: np.ndarray  # [draft vocab, H]
    d2t: np.ndarray  # [draft vocab] int: target token = i + d2t[i]
    attention: DraftAttention | None = None  # a decoder layer after `step` (the draft has a KV cache)


def main_lm_head(config: "LlmConfig") -> np.ndarray:
    """The main model's lm_head as fp32 [vocab, H], dequantized from llm.mnn's last Convolution."""
    net = read_net_file(config.llm_model)
    convolutions = [op for op in net.oplists or [] if op_type_name(op.type) == "Convolution"]
    if not convolutions:
        raise FormatError("no Convolution (lm_head) in the model", file=config.llm_model, field="oplists")
    op = convolutions[-1]
    name = op.name.decode() if isinstance(op.name, bytes) else str(op.name)
    with ExternalWeightFile(config.llm_weight) as weights:
        return OpWeights(name, op.main, weights, config.llm_model).convolution().dequantize()


def random_mtp(hidden: int, vocab: int, heads: int, seed: int = 0) -> MtpWeights:
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(2 * hidden)
    return MtpWeights(rng.normal(0, scale, (heads * hidden, 2 * hidden)).astype(np.float32),
                      rng.normal(0, 1.0 / np.sqrt(hidden), (vocab, hidden)).astype(np.float32))


def random_eagle(hidden: int, vocab: int, draft_vocab: int, seed: int = 0) -> EagleWeights:
    rng = np.random.default_rng(seed)
    tokens = np.sort(rng.choice(vocab, size=min(draft_vocab, vocab), replace=False))
    return EagleWeights(rng.normal(0, 1.0 / np.sqrt(hidden), (hidden, hidden)).astype(np.float32),
                        rng.normal(0, 1.0 / np.sqrt(2 * hidden), (hidden, 2 * hidden)).astype(np.float32),
                        rng.normal(0, 1.0 / np.sqrt(hidden), (tokens.size, hidden)).astype(np.float32),
                        tokens - np.arange(tokens.size))


def random_attention(hidden: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0,
                     gain: float = 1.0) -> DraftAttention:
    """Random q/k/v/o (o scaled by `gain`: a small gain keeps a fitted step's guesses mostly its own)."""
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.normal(0, scale / np.sqrt(cols), (rows, cols))).astype(np.float32)
    return DraftAttention(weight(heads * head_dim, hidden), weight(kv_heads * head_dim, hidden),
                          weight(kv_heads * head_dim, hidden), weight(hidden, heads * head_dim, gain), heads, kv_heads)


def collect(llm: "Llm", sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per sequence, the main model's hidden state after every token ([n, H]), teacher-forced."""
    hidden_states = []
    for ids in sequences:
        llm.reset()
        llm.forward(list(ids), all_logits=True)
        if llm.hidden_states is None:
            raise FormatError("the model gave no hidden_states output (load it with hidden_states: true)",
                              file=llm.config.llm_model, field="hidden_states")
        hidden_states.append(llm.hidden_states.copy())
    llm.reset()
    return hidden_states


def _ridge(features: np.ndarray, targets: np.ndarray, ridge: float) -> np.ndarray:
    """W [out, in] minimising |features W^T - targets|^2 + lam |W|^2, lam = ridge * mean diagonal."""
    gram = features.T.astype(np.float64) @ features
    lam = ridge * np.trace(gram) / gram.shape[0]
    solved = np.linalg.solve(gram + lam * np.eye(gram.shape[0]), features.T.astype(np.float64) @ targets)
    return solved.T.astype(np.float32)


def fit_drafts(llm: "Llm", sequences: Sequence[Sequence[int]], heads: int = 3, draft_vocab: int = 2048,
               ridge: float = 1e-3) -> tuple[MtpWeights, EagleWeights]:
    """MTP and Eagle weights fitted to the model's hidden states over `sequences` (token ids the
    model should find typical: its own greedy answers fit best)."""
    states = collect(llm, sequences)
    hidden = llm.config.hidden_size
    features, targets = [], [[] for _ in range(heads)]
    for ids, h in zip(sequences, states):
        n = len(ids) - 1 - heads  # positions t with e_{t+1} and every head's target h_{t+1+k}
        if n <= 0:
            continue
        embeds = llm.embedding.embedding(list(ids[1:n + 1])).reshape(n, hidden)
        features.append(np.concatenate([h[:n], embeds], axis=1))
        for k in range(heads):
            targets[k].append(h[1 + k:1 + k + n])
    if not features:
        raise ValueError(f"the sequences are too short to fit {heads} heads (each needs more than {heads + 1} tokens)")
    x = np.concatenate(features)
    per_head = [_ridge(x, np.concatenate(t), ridge) for t in targets]
    lm_head = main_lm_head(llm.config)
    seen = np.concatenate([np.asarray(ids[1:]) for ids in sequences])
    counts = np.bincount(seen, minlength=lm_head.shape[0])
    tokens = np.sort(np.argsort(-counts, kind="stable")[:min(draft_vocab, lm_head.shape[0])])
    mtp = MtpWeights(np.concatenate(per_head), lm_head)
    eagle = EagleWeights(np.eye(hidden, dtype=np.float32), per_head[0], lm_head[tokens], tokens - np.arange(tokens.size))
    return mtp, eagle


# -- writing ---------------------------------------------------------------------------


def _tensor(name: str, array: np.ndarray) -> LazyTensor:
    return LazyTensor(name, tuple(array.shape), lambda a, b: array[a:b])


class _DraftFile:
    """One draft .mnn and its .weight, written beside the destination and renamed into place."""

    def __init__(self, path: Path):
        self.path = path
        self.g = GraphBuilder()
        self._weights = open(str(path) + ".weight.tmp", "wb")
        self.writer = WeightWriter(self._weights, PROJECTION_BITS, 0, lambda _: None)

    def linear(self, name: str, x: str, weight: np.ndarray, bits: int, block: int, output: str | None = None) -> str:
        self.writer.bits, self.writer.block = bits, block
        oc, ic = weight.shape
        out, _ = linear(self.g, self.writer, name, to_c4(self.g, name, x, ic), _tensor(name, weight))
        return from_c4(self.g, name, out, oc, rows=0, output=output)

    def conv(self, name: str, x: str, weight: np.ndarray) -> str:
        """A Linear on NC4HW4 `x` [rows, ic, 1, 1] to NC4HW4 [rows, oc, 1, 1] (8 bit)."""
        self.writer.bits, self.writer.block = PROJECTION_BITS, 0
        return linear(self.g, self.writer, name, x, _tensor(name, weight))[0]

    def finish(self, outputs: list[str]) -> None:
        self._weights.close()
        graph = self.g.finish(outputs, f"mnnllm-draft:{self.path.name}")
        os.replace(str(self.path) + ".weight.tmp", str(self.path) + ".weight")
        with written_beside(self.path) as f:
            f.write(graph)


def _draft_inputs(g: GraphBuilder, hidden: int) -> str:
    """MNN's five draft inputs; the linear drafts use the first two: [hidden_states, embedding]."""
    g.input("input_embed", [-1, 1, hidden], DataType.DT_FLOAT)
    g.input("hidden_states", [-1, hidden], DataType.DT_FLOAT)
    g.input("attention_mask", [1, 1, -1, -1], DataType.DT_FLOAT)
    g.input("position_ids", [1, -1], DataType.DT_INT32)
    g.input("logits_index", [1], DataType.DT_INT32)
    embeds = g.reshape("/draft/embed_rows", ["input_embed"], [-1, hidden], NHWC)
    return g.concat("/draft/features", ["hidden_states", embeds], axis=1)


def write_mtp(folder: str | os.PathLike, weights: MtpWeights, name: str = "mtp.mnn") -> Path:
    path = Path(folder) / name
    hidden = weights.lm_head.shape[1]
    f = _DraftFile(path)
    features = _draft_inputs(f.g, hidden)
    if weights.attention is not None:
        attended = _attention_layer(f, to_c4(f.g, "/mtp/layer", features, 2 * hidden), features, weights.attention,
                                    "/mtp/layer/out", "/mtp/layer")
        end = f.g.const_int("/mtp/rows_end", [1 << 30], [1])
        axis, stride = f.g.const_int("/mtp/rows_axis", [0], [1]), f.g.const_int("/mtp/rows_stride", [1], [1])
        features = f.g.strided_slice("/mtp/rows", [attended, "logits_index", end, axis, stride], DataType.DT_INVALID, 1)
    guesses = f.linear("/mtp/heads/Linear", features, weights.heads, PROJECTION_BITS, 0)
    rows = f.g.reshape("/mtp/head_rows", [guesses], [-1, hidden], NHWC)
    logits = f.linear("/mtp/lm_head/Linear", rows, weights.lm_head, HEAD_BITS, HEAD_BLOCK)
    f.g.reshape("logits", [logits], [1, -1, weights.lm_head.shape[0]], NHWC)
    f.finish(["logits"])
    return path


def write_eagle(folder: str | os.PathLike, weights: EagleWeights) -> dict[str, Path]:
    """eagle.mnn, eagle_fc.mnn and eagle_d2t.mnn in `folder`."""
    folder = Path(folder)
    hidden = weights.fc.shape[0]
    fc = _DraftFile(folder / "eagle_fc.mnn")
    fc.g.input("fc_hidden", [-1, hidden], DataType.DT_FLOAT)
    fc.linear("/eagle/fc/Linear", "fc_hidden", weights.fc, PROJECTION_BITS, 0, output="hidden_states")
    fc.finish(["hidden_states"])
    step = _DraftFile(folder / "eagle.mnn")
    features = _draft_inputs(step.g, hidden)
    if weights.attention is None:
        out_hidden = step.linear("/eagle/step/Linear", features, weights.step, PROJECTION_BITS, 0,
                                 output="out_hidden_states")
    else:
        x = step.linear("/eagle/step/Linear", features, weights.step, PROJECTION_BITS, 0)
        out_hidden = _attention_layer(step, to_c4(step.g, "/eagle/layer", x, hidden), x, weights.attention,
                                      "out_hidden_states", "/eagle/layer")
    logits = step.linear("/eagle/lm_head/Linear", out_hidden, weights.lm_head, HEAD_BITS, HEAD_BLOCK)
    step.g.reshape("logits", [logits], [1, -1, weights.lm_head.shape[0]], NHWC)
    step.finish(["logits", "out_hidden_states"])
    d2t = GraphBuilder()
    d2t.const_int("d2t", [int(v) for v in weights.d2t], [int(weights.d2t.size)])
    path = folder / "eagle_d2t.mnn"
    with written_beside(path) as out:
        out.write(d2t.finish(["d2t"], "mnnllm-draft:eagle_d2t"))
    return {"eagle_model": folder / "eagle.mnn", "eagle_fc": folder / "eagle_fc.mnn", "eagle_d2t": path}


def _rotary(g: GraphBuilder, head_dim: int, theta: float, prefix: str) -> tuple[str, str]:
    """cos and sin [rows, head_dim] of position_ids (rotate-half layout: the angles twice)."""
    cast = CastParamT()
    cast.srcT, cast.dstT = DataType.DT_VARIANT, DataType.DT_FLOAT
    positions = g.op(OpType.Cast, f"{prefix}/rotary/positions", ["position_ids"], [f"{prefix}/rotary/positions"],
                     OpParameter.CastParam, cast)
    column = g.reshape(f"{prefix}/rotary/column", [positions], [-1, 1], NHWC)
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    half = g.binary(f"{prefix}/rotary/angles", BinaryOpOperation.MUL, column,
                    g.const_float(f"{prefix}/rotary/inv_freq", inv_freq.astype(np.float32)))
    angles = g.concat(f"{prefix}/rotary/angles_twice", [half, half], 1)
    return (g.unary(f"{prefix}/rotary/cos", UnaryOpOperation.COS, angles),
            g.unary(f"{prefix}/rotary/sin", UnaryOpOperation.SIN, angles))


def _attention_layer(f: _DraftFile, x_c4: str, x: str, a: DraftAttention, output: str, prefix: str) -> str:
    """x + o(Attention(RoPE(q, k), v)) as `output` [rows, width]; the Attention keeps its KV cache."""
    g = f.g
    q, k, v = (f.conv(f"{prefix}/{p}_proj/Linear", x_c4, w) for p, w in (("q", a.q), ("k", a.k), ("v", a.v)))
    cos, sin = _rotary(g, a.head_dim, a.theta, prefix)
    rope = RoPEParamT()
    rope.ropeCutHeadDim = rope.headDim = a.head_dim
    rope.numHead, rope.kvNumHead = a.heads, a.kv_heads
    q_rot, k_rot = f"{prefix}/rope_q", f"{prefix}/rope_k"
    g.op(OpType.RoPE, f"{prefix}/FusedRoPE", [q, k, cos, sin], [q_rot, k_rot], OpParameter.RoPEParam, rope)
    param = AttentionParamT()
    param.kvCache, param.layerIndex, param.kvSharedLayerIndex, param.outputC4 = True, 0, -1, True
    context = g.op(OpType.Attention, f"{prefix}/FusedAttention", [q_rot, k_rot, v, "attention_mask"],
                   [f"{prefix}/o_proj/Linear/pre_convert"], OpParameter.AttentionParam, param)
    attended = from_c4(g, f"{prefix}/o_proj/Linear", f.conv(f"{prefix}/o_proj/Linear", context, a.o),
                       a.o.shape[0], rows=0)
    return g.binary(output, BinaryOpOperation.ADD, x, attended)
