"""Qwen3-VL's `deepstack_embeds` LLM input, as MNN's Omni feeds it: for a step whose tokens
hold image rows, [layers, seq, hidden] with each image row's deepstack features (the vision
encoder's `deepstack_feature`) and zeros for every other token; the graph adds layer i's slice
to the hidden states after its i-th decoder layer. Any other step (decode, a text-only prompt)
gets MNN's zeros of shape [3, 1, 1], which broadcast to nothing added."""
from __future__ import annotations

import numpy as np

from ..schema.reader import op_type_name, read_net_file

DEEPSTACK_INPUT = "deepstack_embeds"
NO_DEEPSTACK = np.zeros((3, 1, 1), np.float32)


def graph_takes_deepstack(graph_path: str) -> bool:
    """Whether the LLM graph has the input (Qwen3.5 sets has_deepstack but its graph has none)."""
    net = read_net_file(graph_path)
    names = [n.decode() if isinstance(n, bytes) else n for n in (net.tensorName or [])]
    return any(op_type_name(op.type) == "Input" and op.outputIndexes is not None and len(op.outputIndexes) == 1
               and names[int(op.outputIndexes[0])] == DEEPSTACK_INPUT for op in (net.oplists or []))


def deepstack_rows(features: np.ndarray | None, index: np.ndarray) -> np.ndarray:
    """The input for a step: `index` holds each token's row of `features` [layers, rows, hidden]
    (-1 for a text token)."""
    where = index >= 0
    if features is None or not where.any():
        return NO_DEEPSTACK
    rows = np.zeros((features.shape[0], len(index), features.shape[2]), np.float32)
    rows[:, where] = features[:, index[where]]
    return rows
