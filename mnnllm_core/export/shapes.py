"""Every tensor an export writes, checked against the config before anything is written.

The graph takes its sizes from the config (hidden_size, vocab_size, heads, head_dim), the weight
file from the tensors: a checkpoint whose tensors disagree (an embedding stored transposed, a norm
weight of another shape) would export into a model that runs and answers wrong. The checks hold
for every architecture, as each names its tensors through `llama.Model` (`norms`, `layer_tensors`,
`linear`): the embedding and lm_head are [vocab, hidden]; the final and per-layer norms are
[hidden], a per-head q/k norm [head_dim]; a layer's attention projections have its heads' rows
(q, k, v) or columns (o); a dense MLP's down_proj reads what its gate_proj writes; an MoE layer's
router has a row per expert, each expert's fused gate_up and its down the config's
moe_intermediate_size; and every matrix of a layer reads or writes the hidden state. A
disagreement is a FormatError naming the tensor, the shape the config asks for and the one found.
"""
from __future__ import annotations

from collections.abc import Iterable

from mnnllm_core.errors import FormatError

from .llama import Model
from .sources import LazyTensor, Source


def check_shapes(model: Model, source: Source) -> None:
    """Raise a FormatError for the first tensor whose shape the config does not allow."""
    a = model.args
    expect_shape(source, source.tensor(model.embedding()), (a.vocab_size, a.hidden_size))
    expect_shape(source, source.tensor(model.lm_head()), (a.vocab_size, a.hidden_size))
    expect_shape(source, source.tensor(model.final_norm()), (a.hidden_size,))
    for layer in range(a.num_hidden_layers):
        _check_layer(model, source, layer)


def _check_layer(model: Model, source: Source, layer: int) -> None:
    a, spec = model.args, model.attention(layer)
    head_dim = spec.head_dim or a.head_dim
    for name in model.norms(layer):
        size = head_dim if name in (spec.q_norm, spec.k_norm) else a.hidden_size
        expect_shape(source, source.tensor(name), (size,))
    tensors = {t.name: t for t in model.layer_tensors(source, layer)}
    if model.mixer(layer) == "attention" and model.linear_attention(layer) is None:
        kv_rows = (spec.kv_heads or a.num_key_value_heads) * head_dim
        q_rows = a.num_attention_heads * head_dim
        for proj, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            _expect_part(source, tensors.get(f"{model.linear(layer, proj)}.weight"), 0, rows, "rows")
        _expect_part(source, tensors.get(f"{model.linear(layer, 'o_proj')}.weight"), 1, q_rows, "columns")
    gate = tensors.get(f"{model.linear(layer, 'gate_proj')}.weight")
    if gate is not None and len(gate.shape) == 2:
        _expect_part(source, tensors.get(f"{model.linear(layer, 'down_proj')}.weight"), 1, gate.shape[0], "columns")
    experts = model.mlp(layer).experts
    if experts:
        ffn = a.moe_intermediate_size
        expect_shape(source, source.tensor(model.router(layer)), (experts, a.hidden_size))
        for e in range(experts):
            expect_shape(source, model.expert_weight(source, layer, e, "gate_up"), (2 * ffn, a.hidden_size))
            expect_shape(source, model.expert_weight(source, layer, e, "down"), (a.hidden_size, ffn))
    _expect_hidden_side(source, (t for t in tensors.values() if len(t.shape) == 2), a.hidden_size)


def expect_shape(source: Source, tensor: LazyTensor, shape: tuple[int, ...]) -> None:
    """A FormatError naming `tensor` unless it has exactly `shape`."""
    if tuple(tensor.shape) != shape:
        raise FormatError(f"tensor {tensor.name!r} has shape {tuple(tensor.shape)}, the config asks for {shape}",
                          file=source.path, field=tensor.name)


def _expect_part(source: Source, tensor: LazyTensor | None, axis: int, size: int, what: str) -> None:
    """`tensor` (when the model has it) with `size` along `axis`."""
    if tensor is None or len(tensor.shape) == 2 and tensor.shape[axis] == size:
        return
    wanted = (size, "*") if axis == 0 else ("*", size)
    raise FormatError(f"tensor {tensor.name!r} has shape {tuple(tensor.shape)}, the config asks for {size} {what}: "
                      f"({', '.join(map(str, wanted))})", file=source.path, field=tensor.name)


def _expect_hidden_side(source: Source, matrices: Iterable[LazyTensor], hidden: int) -> None:
    """Every matrix of a layer reads the hidden state (its columns) or writes it (its rows)."""
    for tensor in matrices:
        if hidden not in tensor.shape:
            raise FormatError(f"tensor {tensor.name!r} has shape {tuple(tensor.shape)}: neither side is the "
                              f"hidden size {hidden} of the config", file=source.path, field=tensor.name)
