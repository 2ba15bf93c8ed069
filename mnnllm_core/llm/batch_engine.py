"""Continuous batching beside `Llm`: several independent sequences decode together, one forward
a step, each in its own KV slot (core/kv_slots.py).

`submit` queues a request (prompt ids, max_new_tokens, its own sampler and seed); `step` admits
queued requests into free slots (the free slot whose cached history shares the longest prefix
with the prompt, so a slot is a prompt cache), runs one forward of every running sequence's rows
(batch_plan.py: a decode row each, prompt chunks within the token budget), samples each sequence
from its own row's logits with its own sampler, and finishes each on its own stop token, budget
or cancel. A finished or cancelled sequence frees its slot at once; its cached rows stay for the
next prompt that shares them.

Exactness: a sequence's rows see only its own slot's cache, and every other op works row by row,
so its tokens are those of the same request run alone up to the summation order of a linear over
B rows instead of one (float32 rounding; greedy tokens equal on the reference prompts,
tests/test_batch_engine.py). The engine runs AR generation only (no speculative drafts), on models
whose attention mask is MNN's scalar float mask with "full" attention; the backend's Attention
must be slot-aware (else UnsupportedError saying why: the caller runs requests one at a time).
The engine uses only the Llm's public `BatchHost` protocol (batch_host.py).
Steps of a new shape run the per-op loop once (and resize); a shape seen again replays. Decode
rows run in slot order, so the same slots decoding give the same row table (the same BatchMeta,
`_row_table`) whoever came first: a request taking a freed slot leaves a backend's bindings and
recording of that table as they were (the cpu's replayed batched step records again only when
the table or a cache's storage changes).

On a static-shape backend (the runtime says `static_shapes`) a step of decode rows only is padded
(batch_plan.pad_decode) to the smallest of `batch_sizes` (default BATCH_SIZES) holding its rows,
in slot order (the same slots running, the same row table):
each size is one module clone, resized once and kept for the engine's life (apart from the LRU
of other shapes), and a decode step replays it (one submit, one readback) as streams come and go
(a backend that records the row table, vulkan, records a size again when the streams in its rows
change, never resizes). The padding rows are one group in the KV slot after the engine's slots,
which no sequence uses: each step it keeps nothing and takes the padding rows, so they attend
only to each other and no sequence's cache sees them. `sized_memory()` reports what the sizes hold
(logged as each size is first recorded).
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..core.kv_meta import KVMeta
from ..core.kv_slots import BatchMeta, SlotRows, slot_refusal
from ..core.pipeline import STATEFUL
from ..core.op_params import AttentionParams
from ..errors import ConfigError, ContextLengthError, MnnllmError, UnsupportedError
from .attention_mask import step_mask
from .batch_plan import BATCH_SIZES, StepPlan, pad_decode, plan_step
from .context import LlmContext
from .conversation import Conversation
from .kv_reuse import reuse_enabled

if TYPE_CHECKING:
    from ..express.module import NetModule
    from .batch_host import BatchHost
    from .sampler import Sampler

log = logging.getLogger(__name__)

TOKEN_BUDGET = 64  # rows a step runs at most: decode rows first, prompt chunks in what is left
CLONES = 8  # resized module clones kept, one per step shape (rows, first logits row, batched)

WAITING, PREFILL, DECODE, FINISHED = "waiting", "prefill", "decode", "finished"


@dataclass(eq=False)
class BatchSequence:
    """One request in the engine. `tokens`: emitted so far (the stop token included, as `generate`
    reports it); `finish_reason`: "stop", "length" (max_new_tokens or the context's end) or "cancelled"."""

    id: int
    prompt: list[int]
    max_new_tokens: int
    sampler: "Sampler"
    tokens: list[int] = field(default_factory=list)
    state: str = WAITING
    finish_reason: str | None = None
    cached: int = 0  # prompt tokens taken from the slot's cache
    slot: "Slot | None" = field(default=None, repr=False)
    pending: list[int] = field(default_factory=list, repr=False)  # prompt tokens not run yet
    budget: int = 0
    cancelled: bool = False

    @property
    def finished(self) -> bool:
        return self.state == FINISHED


class Slot:
    """One KV slot: its history (the tokens its caches hold) and KV meta, and the sequence in it.
    Slot 0 is the Llm's own conversation (its caches are the one-sequence ones)."""

    def __init__(self, index: int, conversation: Conversation | None = None):
        self.index = index
        if conversation is None:
            conversation = Conversation(LlmContext())
            conversation.attach(KVMeta(), [])
        self.conversation = conversation
        self.sequence: BatchSequence | None = None

    def shared_prefix(self, prompt: Sequence[int]) -> int:
        """Leading tokens of `prompt` the slot holds, less the last prompt token (it must run for logits)."""
        common = 0
        for a, b in zip(self.conversation.history, prompt):
            if a != b:
                break
            common += 1
        return max(min(common, len(prompt) - 1), 0)


class BatchEngine:
    """Up to `slots` sequences of one loaded Llm at once. Not thread-safe: one thread calls
    `step`; `cancel` may come from another (it takes effect at the next step). While a step
    runs the Llm is busy (its own calls raise ConcurrentUseError). Slot 0 is the Llm's own
    conversation, taken first when prefixes tie: a step of that slot alone is the Llm's
    one-sequence step (no batch table; a decode step replays as one compiled program), so one
    stream through the engine runs as fast as alone."""

    def __init__(self, llm: "BatchHost", slots: int = 4, token_budget: int = TOKEN_BUDGET,
                 batch_sizes: Sequence[int] | None = None):
        if llm.module is None:
            raise MnnllmError("the Llm is not loaded: call load() first", field="llm")
        if not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"slots must be an integer >= 1, got {slots!r}", field="parallel")
        if not isinstance(token_budget, int) or token_budget <= slots:
            raise ConfigError(f"token_budget must be an integer above the {slots} slots (each decoding slot takes "
                              f"a row every step), got {token_budget!r}", field="token_budget")
        if batch_sizes is None:
            batch_sizes = BATCH_SIZES if llm.runtime_manager.static_shapes else ()
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in batch_sizes) \
                or list(batch_sizes) != sorted(set(batch_sizes)):
            raise ConfigError(f"batch_sizes must be ascending integers >= 1, got {batch_sizes!r}", field="batch_sizes")
        refusal = batch_refusal(llm)
        if refusal is not None:
            raise UnsupportedError(f"continuous batching: {refusal}", field="parallel")
        self.llm = llm
        cfg = llm.config
        self.mask = step_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, 0, 1)  # the scalar one
        self.token_budget = token_budget
        self.slots = [Slot(0, llm.conversation)] + [Slot(i) for i in range(1, slots)]
        self.waiting: deque[BatchSequence] = deque()
        self.running: list[BatchSequence] = []  # in admission order
        self.batch_sizes = tuple(batch_sizes)
        self._clones: OrderedDict[tuple[int, int, bool], "NetModule"] = OrderedDict()
        self.sized: dict[int, "NetModule"] = {}  # padded decode steps: one clone per size, never evicted
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards `waiting` against submit/cancel from other threads
        self.steps = 0
        self.rows_run = 0
        self.padding_run = 0  # padding rows run (padded decode steps)
        self._batch: tuple | None = None  # (the row table, its BatchMeta) of the last batched step

    # -- requests ----------------------------------------------------------------------
    def submit(self, prompt_ids: Sequence[int], max_new_tokens: int | None = None,
               sampler: "Sampler | None" = None) -> BatchSequence:
        """Queue a request; it runs once a slot is free."""
        llm = self.llm
        prompt = llm.tokenizer.check_ids(list(prompt_ids))
        if not prompt:
            raise MnnllmError("the prompt encodes to no tokens", field="input_ids")
        limit = llm.config.max_all_tokens
        if len(prompt) >= limit:
            raise ContextLengthError(f"the prompt has {len(prompt)} tokens; max_all_tokens is {limit}, which leaves "
                                     "no room for a reply", file=llm.config.origin("max_all_tokens"),
                                     field="max_all_tokens")
        budget = llm.reply_budget(max_new_tokens)
        sequence = BatchSequence(next(self._ids), prompt, budget, sampler or llm.make_sampler({}))
        with self._lock:
            self.waiting.append(sequence)
        return sequence

    def cancel(self, sequence: BatchSequence) -> None:
        """Stop a sequence: queued, it never runs; running, its slot is free from the next step on."""
        sequence.cancelled = True

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def slots_in_use(self) -> int:
        return len(self.running)

    def run(self) -> None:
        """Step until every submitted sequence has finished."""
        while not self.idle:
            self.step()

    # -- one step ----------------------------------------------------------------------
    def step(self) -> list[tuple[BatchSequence, int]]:
        """Admit, run one forward, sample: the (sequence, token) pairs emitted by this step."""
        self._drop_cancelled()
        self._admit()
        decoding = sorted((s for s in self.running if s.state == DECODE), key=lambda s: s.slot.index)
        plan = plan_step([(s, s.tokens[-1]) for s in decoding],
                         [(s, s.pending) for s in self.running if s.state == PREFILL], self.token_budget)
        if plan is None:
            return []
        padded = pad_decode(plan, self.batch_sizes, lambda sequence: sequence.slot.index)
        plan = plan if padded is None else padded
        with self.llm.exclusive("a batch step"):
            logits = self._forward(plan)
        emitted = []
        for part in plan.parts:
            sequence = part.owner
            sequence.slot.conversation.commit(part.tokens)
            if sequence.state == PREFILL:
                del sequence.pending[:len(part.tokens)]
                if sequence.pending:
                    continue
                sequence.state = DECODE
                sequence.budget = min(sequence.max_new_tokens,
                                      self.llm.config.max_all_tokens - len(sequence.slot.conversation))
                if sequence.budget <= 0:
                    self._finish(sequence, "length")
                    continue
            token = sequence.sampler.sample(logits[part.last_row - plan.logits_from],
                                            sequence.slot.conversation.history)
            sequence.tokens.append(token)
            emitted.append((sequence, token))
            if self.llm.tokenizer.is_stop(token):
                self._finish(sequence, "stop")
            elif len(sequence.tokens) >= sequence.budget:
                self._finish(sequence, "length")
        self.steps += 1
        self.rows_run += plan.rows - plan.padding
        self.padding_run += plan.padding
        return emitted

    def _drop_cancelled(self) -> None:
        with self._lock:
            for sequence in [s for s in self.waiting if s.cancelled]:
                self.waiting.remove(sequence)
                sequence.state, sequence.finish_reason = FINISHED, "cancelled"
        for sequence in [s for s in self.running if s.cancelled]:
            self._finish(sequence, "cancelled")

    def _admit(self) -> None:
        """Queued requests into free slots, first come first served; each takes the free slot
        holding the longest prefix of its prompt (none when reuse_kv/prompt_cache turn reuse off)."""
        reuse = reuse_enabled(self.llm.config)
        while True:
            free = [slot for slot in self.slots if slot.sequence is None]
            with self._lock:
                if not free or not self.waiting:
                    return
                sequence = self.waiting.popleft()
            slot = max(free, key=lambda s: (s.shared_prefix(sequence.prompt) if reuse else 0, s.index == 0))
            common = slot.shared_prefix(sequence.prompt) if reuse else 0
            slot.conversation.rewind(common)
            slot.sequence, sequence.slot = sequence, slot
            sequence.cached, sequence.pending, sequence.state = common, sequence.prompt[common:], PREFILL
            self.running.append(sequence)

    def _finish(self, sequence: BatchSequence, reason: str) -> None:
        sequence.state, sequence.finish_reason = FINISHED, reason
        if sequence in self.running:
            self.running.remove(sequence)
        if sequence.slot is not None:
            sequence.slot.sequence = None

    def _forward(self, plan: StepPlan) -> np.ndarray:
        """One forward of the plan's rows; the logits [rows from plan.logits_from, vocab]."""
        llm = self.llm
        groups, positions = [], []
        for part in plan.parts:
            conversation = part.owner.slot.conversation
            conversation.start_step(len(part.tokens))
            past = len(conversation)
            groups.append(SlotRows(part.owner.slot.index, part.start, len(part.tokens), conversation.meta))
            positions.append(np.arange(past, past + len(part.tokens), dtype=np.int32))
        if plan.padding:  # the slot after the engine's: empty each step, then the padding rows
            groups.append(SlotRows(len(self.slots), plan.rows - plan.padding, plan.padding, KVMeta(add=plan.padding)))
            positions.append(np.arange(plan.padding, dtype=np.int32))
        ids = plan.tokens
        position_ids = np.concatenate(positions).reshape(1, -1)
        if llm.config.is_mrope:
            position_ids = np.repeat(position_ids, 3, axis=0)
        feeds = {**llm.token_inputs(ids), "attention_mask": self.mask, "position_ids": position_ids,
                 "logits_index": np.array([plan.logits_from], np.int32)}
        alone = len(groups) == 1 and groups[0].slot == 0  # the Llm's own one-sequence step
        key = (plan.rows, plan.logits_from, not alone)
        meta = llm.runtime_manager.kv_meta
        meta.batch = None if alone else self._row_table(groups)
        first = plan.sized and plan.rows not in self.sized
        try:
            outputs = self._clone(key, plan.sized).forward(feeds)
            if first:
                log.info("batched decode steps of %d rows resized and recorded: %.1f MiB of step buffers kept "
                         "(sizes %s)", plan.rows, step_bytes(self.sized[plan.rows]) / 2**20, sorted(self.sized))
        except BaseException:
            self._clones.pop(key, None)  # an interrupted run may leave its clone half resized
            if plan.sized:
                self.sized.pop(plan.rows, None)
            raise
        finally:
            meta.batch = None
        logits = outputs[0]
        return logits.reshape(-1, logits.shape[-1])

    def _row_table(self, groups: list[SlotRows]) -> BatchMeta:
        """The step's BatchMeta: the last step's object while the table is the same (the same
        slots' rows, their metas the same objects), so a backend binding per table (the cpu's
        slot attention) knows it at a glance."""
        table = tuple((g.slot, g.start, g.count, id(g.meta)) for g in groups)
        if self._batch is None or self._batch[0] != table:
            self._batch = (table, BatchMeta(tuple(groups)))
        return self._batch[1]

    def sized_memory(self) -> dict[int, int]:
        """Per padded size recorded so far, the bytes of the step buffers its clone holds (the
        distinct storages of its tensors, as the tensors size them): what keeping the sizes costs
        beyond the weights and KV caches, which every clone shares."""
        return {size: step_bytes(module) for size, module in sorted(self.sized.items())}

    def _clone(self, key: tuple[int, int, bool], sized: bool = False) -> "NetModule":
        if sized:
            module = self.sized.get(key[0])
            if module is None:
                module = self.sized[key[0]] = self.llm.module.clone()
            return module
        module = self._clones.get(key)
        if module is None:
            module = self._clones[key] = self.llm.module.clone()
            while len(self._clones) > CLONES:
                self._clones.popitem(last=False)
        self._clones.move_to_end(key)
        return module


def batch_refusal(llm: "BatchHost") -> str | None:
    """Why this loaded Llm cannot run batches of sequences, or None."""
    from .omni import Omni
    from .text_embedding import Embedding
    if isinstance(llm, (Omni, Embedding)):
        return f"{type(llm).__name__} models run one sequence at a time (images and embeddings are not batched)"
    cfg = llm.config
    if cfg.attention_mask != "float" or cfg.attention_type != "full":
        return (f"attention_mask {cfg.attention_mask!r} with attention_type {cfg.attention_type!r}: batches take "
                "MNN's scalar float mask with full attention")
    pipeline = llm.module.static_module.session.pipeline
    executions = [e for _, e in pipeline.executions.values()]
    stateful = [e for node, (_, e) in pipeline.executions.items() if pipeline.info.nodes[node].op.type in STATEFUL]
    return slot_refusal(executions, stateful)


def step_bytes(module: "NetModule") -> int:
    """Bytes of the storages a resized module's tensors hold apart from its constants (several
    tensors sharing one storage count once, at the largest)."""
    pipeline = module.static_module.session.pipeline
    sizes: dict[int, int] = {}
    for tensor in pipeline.tensors:
        if tensor.storage is not None and tensor.index not in pipeline.info.constants:
            key = id(tensor.storage)
            sizes[key] = max(sizes.get(key, 0), tensor.nbytes)
    return sum(sizes.values())


def kv_bytes_per_token(llm: "BatchHost") -> int:
    """fp32 bytes of one token's keys and values over every Attention layer (an upper bound where
    the backend stores the KV cache narrower)."""
    total = 0
    for _, execution in llm.module.static_module.session.pipeline.executions.values():
        params = getattr(execution, "params", None)
        if isinstance(params, AttentionParams) and params.kv_cache and params.heads is not None:
            total += 2 * params.heads[1] * params.heads[2] * 4
    return total
