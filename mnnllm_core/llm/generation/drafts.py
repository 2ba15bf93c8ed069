"""The draft modules of MNN's MTP and Eagle layouts, loaded beside the main model.

* MTP (`mtp_model`, default `mtp.mnn`): inputs `input_embed` [seq,1,hidden] (the next token's
  embedding), `hidden_states` [seq,hidden] (the main model's output at the token before),
  `attention_mask`, `position_ids`, `logits_index`; output `logits` [1, heads * seq, vocab]:
  head k guesses the token k + 1 places after the input token.
* Eagle: `eagle_fc` (`eagle_fc.mnn`: `fc_hidden` -> `hidden_states`) maps the main model's
  hidden state into the draft's; `eagle_model` (`eagle.mnn`: the MTP inputs -> `logits` over
  the draft vocabulary and `out_hidden_states`) makes one step; `eagle_d2t` (`eagle_d2t.mnn`,
  an MNN Variable file: one int32 Const) maps draft token i to target token i + d2t[i].

Each `.mnn` reads its weights from `<file>.weight`. An Eagle step with Attention ops (a real
export's decoder layer) keeps a KV cache of its own: it loads on a derived runtime manager
(the same runtimes, its own KV meta, as a LoRA does) and draft_kv.py steers that meta as
MNN's eagle.cpp does; an MTP module with Attention ops likewise. A linear-attention draft, or
Attention in eagle_fc, is refused, naming the file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ...errors import ConfigError, FormatError, MnnllmError, UnsupportedError
from ...express.module import Module, NetModule
from ...express.static_module import Config
from ...schema.reader import op_type_name, read_net_file

if TYPE_CHECKING:
    from .target import DraftingTarget

DRAFT_INPUTS = ["input_embed", "hidden_states", "attention_mask", "position_ids", "logits_index"]
MTP_OUTPUTS = ["logits"]
EAGLE_OUTPUTS = ["logits", "out_hidden_states"]
FC_INPUTS, FC_OUTPUTS = ["fc_hidden"], ["hidden_states"]


class DraftModule:
    """One draft graph; `run` feeds it with MNN's inputs and checks what comes back."""

    def __init__(self, target: "DraftingTarget", key: str, inputs: list[str], outputs: list[str]):
        self.path = path = getattr(target.config, key)
        self.key = key
        if not os.path.isfile(path):
            problem = "is not a regular file" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"{key} names a file that {problem}: {path}",
                              file=target.config.origin(key) or target.config.source, field=key)
        net = read_net_file(path)
        types = {op_type_name(op.type) for op in net.oplists or []}
        self.attends = "Attention" in types
        if "LinearAttention" in types or (self.attends and key not in ("eagle_model", "mtp_model")):
            raise UnsupportedError(f"{key}: a draft's own KV cache is supported for Attention ops in an Eagle step or "
                                   "an MTP module, not for linear attention or elsewhere", file=path, field="oplists")
        manager = target.runtime_manager.derive() if self.attends else target.runtime_manager
        self.kv_meta = manager.kv_meta if self.attends else None  # the draft's own, for draft_kv.py
        main_weights = manager.external_file
        manager.set_external_file(path + ".weight")
        try:
            self.module: NetModule = Module.load(inputs, outputs, path, manager, Config(rearrange=True))
        except MnnllmError as err:
            raise FormatError(f"{key}: {err.reason}", file=path, field=err.field or "inputs") from err
        finally:
            manager.external_file = main_weights
        self.inputs = inputs
        self.outputs = outputs

    def run(self, feeds: dict[str, np.ndarray], widths: dict[str, int]) -> list[np.ndarray]:
        """The outputs as [rows, width] arrays; a width other than `widths[name]` is the file's fault."""
        try:
            raw = self.module.forward({name: feeds[name] for name in self.inputs})
        except MnnllmError as err:
            raise FormatError(f"{self.key} failed to run: {err.reason}", file=self.path,
                              field=err.field or "oplists") from err
        out = []
        for name, value in zip(self.outputs, raw):
            width = widths[name]
            if value.size == 0 or value.size % width:
                raise FormatError(f"{self.key} output {name} has shape {list(value.shape)}, not rows of {width}",
                                  file=self.path, field=name)
            out.append(np.asarray(value, np.float32).reshape(-1, width))
        return out


def draft_feeds(embeds: np.ndarray, hidden: np.ndarray) -> dict[str, np.ndarray]:
    """MNN's draft inputs for `rows` independent positions (the drafts here attend to nothing)."""
    rows = hidden.shape[0]
    return {"input_embed": embeds.reshape(rows, 1, -1).astype(np.float32, copy=False),
            "hidden_states": hidden.astype(np.float32, copy=False),
            "attention_mask": np.zeros((1, 1, 1, 1), np.float32),
            "position_ids": np.zeros((1, rows), np.int32), "logits_index": np.zeros(1, np.int32)}


@dataclass
class MtpDraft:
    module: DraftModule

    @classmethod
    def load(cls, target: "DraftingTarget") -> "MtpDraft":
        return cls(DraftModule(target, "mtp_model", DRAFT_INPUTS, MTP_OUTPUTS))


@dataclass
class EagleDraft:
    fc: DraftModule
    step: DraftModule
    d2t: np.ndarray  # int64 [draft vocab]: target token = i + d2t[i]

    @classmethod
    def load(cls, target: "DraftingTarget") -> "EagleDraft":
        step = DraftModule(target, "eagle_model", DRAFT_INPUTS, EAGLE_OUTPUTS)
        fc = DraftModule(target, "eagle_fc", FC_INPUTS, FC_OUTPUTS)
        return cls(fc, step, read_d2t(target, target.embedding.vocab))


def read_d2t(target: "DraftingTarget", vocab: int) -> np.ndarray:
    """eagle_d2t: the first int32 Const of the Variable file, checked to map into the vocabulary."""
    path = target.config.eagle_d2t
    if not os.path.isfile(path):
        raise ConfigError(f"eagle_d2t names a file that does not exist: {path}",
                          file=target.config.origin("eagle_d2t") or target.config.source, field="eagle_d2t")
    net = read_net_file(path)
    for op in net.oplists or []:
        blob = op.main if op_type_name(op.type) == "Const" else None
        if blob is not None and blob.int32s is not None and len(blob.int32s):
            d2t = np.asarray(blob.int32s, np.int64)
            targets = np.arange(d2t.size) + d2t
            if targets.min() < 0 or targets.max() >= vocab:
                raise FormatError(f"eagle_d2t maps draft tokens to {targets.min()} .. {targets.max()}, outside the "
                                  f"vocabulary of {vocab}", file=path, field="int32s")
            return d2t
    raise FormatError("eagle_d2t holds no int32 constant (the draft-to-target token offsets)", file=path,
                      field="oplists")


def load_drafts(target: "DraftingTarget", kind: str):
    """The draft of `kind` ("mtp" / "eagle"), loaded once per Llm and files and kept on it."""
    keys = ("mtp_model",) if kind == "mtp" else ("eagle_model", "eagle_fc", "eagle_d2t")
    wanted = (kind,) + tuple(getattr(target.config, key) for key in keys)
    if target.drafts is None or target.drafts[0] != wanted:
        if target.module is None or "hidden_states" not in target.module.output_names:
            raise ConfigError(f"speculative_type {kind} needs the main model's hidden_states output: set it before "
                              "load (the model was loaded without it)", file=target.config.origin("speculative_type"),
                              field="speculative_type")
        target.drafts = (wanted, (MtpDraft if kind == "mtp" else EagleDraft).load(target))
    return target.drafts[1]
