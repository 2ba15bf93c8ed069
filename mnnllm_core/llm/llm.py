"""MNN's Llm: createLLM -> load (runtime, tokenizer, prompt, disk embedding, sampler,
Module::load, module pool) -> response / generate / forward.

Names follow pymnn's `MNN.llm` so an MNN user finds their way: `create`, `load`,
`response`, `generate`, `forward`, `tokenizer_encode/decode`, `apply_chat_template`,
`set_config`, `reset`, `context`.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..core.backend import SETTINGS
from ..errors import (ConcurrentUseError, ConfigError, ContextLengthError, FormatError, KVStateError, MnnllmError,
                      UnsupportedError, shorten)
from ..express.module import Module, NetModule
from ..express.runtime_manager import RuntimeManager
from ..express.static_module import Config
from . import arguments
from .attention_mask import check_attention_type, check_mask_input, step_mask, tree_depths, tree_mask
from .chunked_prefill import prefill_chunk, release_long_step, run_in_chunks
from .config import LlmConfig
from .config_keys import check_keys
from .context import STOPPED, LlmContext
from .conversation import Conversation
from .disk_embedding import DiskEmbedding
from .generation import ARGeneration, create_generation, needs_hidden_states
from .guided import GuidedSampler, check_guidance, guided_generation, guided_sampler
from .kv_reuse import reuse_enabled
from .module_pool import ModulePool
from .per_layer_embedding import INPUT_NAME as PLE_INPUT
from .per_layer_embedding import PerLayerEmbedding, has_per_layer_embedding
from .prefix_cache import PrefixCache, model_caches
from .prompt import Prompt
from .pymnn_compat import PymnnMethods
from .runtime import backend_choices, init_runtime, schedule_config
from .sampler import Sampler, SamplerConfig
from .tokenizer import create_tokenizer

log = logging.getLogger(__name__)

INPUT_NAMES = ["input_ids", "attention_mask", "position_ids", "logits_index"]

Messages = str | Sequence[dict[str, str]] | Sequence[tuple[str, str]]


class Llm(PymnnMethods):
    """One conversation on one model. Its state (the history and the KV cache that mirrors it)
    has one user at a time: a call made while another thread is inside a step, or a stream
    resumed after something else moved the conversation on, raises ConcurrentUseError and
    leaves the state as it was. Use one Llm per thread (clones of a model share nothing)."""

    def __init__(self, config: LlmConfig, base: "Llm | None" = None):
        self.config = config
        self.base = base  # a loaded Llm whose packed weights this one shares where they agree (LoRA)
        self.context = LlmContext()
        self.conversation = Conversation(self.context)  # the only writer of the history and the KV meta
        self.runtime_manager: RuntimeManager | None = None
        self.module: NetModule | None = None
        self.pool: ModulePool | None = None
        self.tokenizer = None
        self.prompt: Prompt | None = None
        self.embedding: DiskEmbedding | None = None
        self.per_layer: PerLayerEmbedding | None = None  # Gemma 4's ple_embeddings input, when the config has one
        self.sampler: Sampler | None = None
        self.prefix_cache: PrefixCache | None = None
        self.drafts = None  # the draft modules of speculative_type mtp/eagle, loaded on first use
        self.hidden_states: np.ndarray | None = None  # [rows, hidden] of the last step, when loaded
        self.generation = ARGeneration(self)
        self._decode_mask: np.ndarray | None = None
        self._decode_position = np.zeros((1, 1), np.int32)
        self._logits_index = {False: np.array([-1], np.int32), True: np.array([0], np.int32)}
        self._busy = threading.Lock()  # held while the history or the KV cache changes
        self._steps = 0  # changes of the conversation so far: a live stream notices it was superseded
        self.last_guided: GuidedSampler | None = None  # the guided sampler of the last response() that had one

    # -- load --------------------------------------------------------------------
    def load(self) -> "Llm":
        start = time.perf_counter()
        cfg = self.config
        self._check_model_files()
        check_attention_type(cfg.attention_type, cfg.sliding_window,
                             cfg.origin("attention_type") or cfg.origin("sliding_window"))
        self.runtime_manager = self._runtime_over_base() if self.base is not None else init_runtime(cfg)
        self.tokenizer = create_tokenizer(cfg.tokenizer_file)
        self.prompt = Prompt(cfg, self.tokenizer.bos_token)
        self.embedding = DiskEmbedding(cfg)
        self.per_layer = PerLayerEmbedding(cfg, self.embedding.vocab) if has_per_layer_embedding(cfg) else None
        self._init_sampler()
        self.runtime_manager.set_external_file(cfg.llm_weight)
        outputs = ["logits"] + (["hidden_states"] if cfg.hidden_states or needs_hidden_states(cfg) else [])
        base = self.base.module if self.base is not None else None
        try:
            self.module = Module.load(INPUT_NAMES + self._extra_input_names(), outputs, cfg.llm_model,
                                      self.runtime_manager,
                                      Config(rearrange=True, base=base))
        except UnsupportedError as err:
            _refuse_text_encoder(cfg.llm_model, err)
            raise
        if self.per_layer is not None:
            self.per_layer.check_graph(self.module.info.input_dims.get(PLE_INPUT, []), cfg.llm_model)
        if cfg.attention_mask == "float":
            check_mask_input(cfg.attention_type, self.module.info.input_dims.get("attention_mask", []), cfg.llm_model,
                             cfg.origin("attention_type"))
        self.pool = ModulePool(self.module)
        self.conversation.attach(self.runtime_manager.kv_meta, model_caches(self.module))
        self.prefix_cache = PrefixCache.for_model(cfg, self.runtime_manager.config.backend_type, self.conversation)
        self._decode_mask = self._attention_mask(1)
        self.generation = create_generation(self)
        self.context.load_us = int((time.perf_counter() - start) * 1e6)
        log.info("loaded %s in %.2f s on %s", cfg.llm_model, self.context.load_us / 1e6,
                 self.runtime_manager.config.backend_type)
        return self

    def _runtime_over_base(self) -> RuntimeManager:
        """The base's runtimes with a KV meta of this Llm's own; the runtime keys must agree with the base's."""
        if self.base.module is None:
            raise ConfigError("the base Llm is not loaded: call load() on it first", field="base")
        theirs = self.base.runtime_manager
        if theirs.config.backend_type not in backend_choices(self.config):
            raise ConfigError(f"backend_type {self.config.runtime_options().backend_type!r} differs from the base's "
                              f"{theirs.config.backend_type!r}", file=self.config.origin("backend_type"),
                              field="backend_type")
        wanted = schedule_config(self.config, theirs.config.backend_type)
        for key in SETTINGS:
            if wanted.setting(key) != theirs.config.setting(key):
                raise ConfigError(f"{key} {wanted.setting(key)!r} differs from the base's "
                                  f"{theirs.config.setting(key)!r}: a model over a base shares its runtime",
                                  file=self.config.origin(key), field=key)
        return theirs.derive()

    def create_lora(self, lora_path: str) -> "Llm":
        """MNN's Llm::create_lora: a loaded Llm running `lora_path` (a graph in this model's folder, e.g.
        the `lora.mnn` of `mnnllm export --lora-split`) over this model's weight file and packed weights."""
        lora_path = arguments.text(lora_path, "lora_path")
        arguments.require_loaded(self, "create_lora")
        config = copy.deepcopy(self.config)
        config.set_config({"llm_model": lora_path}, "create_lora")
        return Llm(config, base=self).load()

    def _check_model_files(self) -> None:
        check_model_files(self.config)

    def _init_sampler(self) -> None:
        try:
            sampler_config = SamplerConfig.from_config(self.config.to_dict())
        except ConfigError as err:  # name the file (or --set) that set the offending key
            raise ConfigError(err.reason, file=self.config.origin(err.field or "sampler_type"),
                              field=err.field) from None
        self.sampler = Sampler(sampler_config)

    def set_config(self, config: dict[str, Any] | str, source: str = "set_config") -> None:
        """Merge keys as MNN's set_config does; sampler keys take effect at once. An unknown key is
        refused as the CLI's --set refuses it (config_keys.py). `source` names where the keys came
        from in later errors (e.g. "--set")."""
        config = arguments.instance(config, (Mapping, str), "config", optional=False)
        source = arguments.text(source, "source")
        check_keys(_keys_of(config), self.config.to_dict(), source)
        self.config.set_config(config, source)
        if self.sampler is not None:
            self._init_sampler()
            self.generation = create_generation(self)
        if self.prompt is not None:
            self.prompt = Prompt(self.config, self.tokenizer.bos_token)

    @property
    def kv_meta(self):
        arguments.require_loaded(self, "kv_meta")
        return self.runtime_manager.kv_meta

    def exclusive(self, what: str) -> AbstractContextManager[None]:
        """Hold the Llm while a step changes the conversation or the KV cache (`what` names the
        step in the error): another thread inside a step makes entering it a ConcurrentUseError,
        and a live stream of this Llm is superseded. Part of the `BatchHost` protocol."""
        return self._held(arguments.text(what, "what"))

    @contextmanager
    def _held(self, what: str) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            raise ConcurrentUseError(f"{what} while another thread is running this Llm: an Llm serves one "
                                     f"caller at a time (use one Llm per thread, or serialize the calls)")
        try:
            self._steps += 1
            yield
        finally:
            self._busy.release()

    # -- text ------------------------------------------------------------------------
    def tokenizer_encode(self, prompt: str) -> list[int]:
        prompt = arguments.text(prompt, "prompt")
        arguments.require_loaded(self, "tokenizer_encode")
        return self.tokenizer.encode(prompt)

    def tokenizer_decode(self, token: int | Sequence[int]) -> str:
        """One token id (pymnn's form) or a list of them."""
        token = arguments.token_id_or_ids(token, "token")
        arguments.require_loaded(self, "tokenizer_decode")
        if isinstance(token, int):
            return self.tokenizer.decode_id(token)
        return self.tokenizer.decode(token)

    def apply_chat_template(self, prompt: Messages, tools: Sequence[dict] | None = None) -> str:
        """The prompt text; `tools` (OpenAI tool objects) reach the template's `tools` variable."""
        prompt = arguments.messages(prompt, "prompt")
        tools = arguments.optional_mappings(tools, "tools")
        arguments.require_loaded(self, "apply_chat_template")
        return self.prompt.apply_chat_template(prompt, tools=tools)

    # -- forward ---------------------------------------------------------------------
    def _attention_mask(self, seq_len: int) -> np.ndarray:
        """("full" float: a scalar, the causal mask is Attention's.)"""
        cfg = self.config
        return step_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, len(self.conversation), seq_len)

    def _position_ids(self, seq_len: int) -> np.ndarray:
        past = len(self.conversation)
        if seq_len == 1 and not self.config.is_mrope:
            self._decode_position[0, 0] = past  # prepared once; the session copies it in
            return self._decode_position
        positions = np.arange(past, past + seq_len, dtype=np.int32).reshape(1, seq_len)
        return np.repeat(positions, 3, axis=0) if self.config.is_mrope else positions

    def _tree_inputs(self, parents: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """attention_mask and position_ids for a token tree after the cached history."""
        past, cfg = len(self.conversation), self.config
        mask = tree_mask(cfg.attention_mask, cfg.attention_type, cfg.sliding_window, past, parents)
        positions = (past + tree_depths(parents)).astype(np.int32).reshape(1, -1)
        return mask, np.repeat(positions, 3, axis=0) if cfg.is_mrope else positions

    def _input_embeddings(self, ids: list[int]) -> np.ndarray:
        """The `input_ids` input: [seq, 1, hidden] rows of the embedding table (Omni writes images over some)."""
        return self.embedding.embedding(ids)

    def _extra_input_names(self) -> list[str]:
        """Graph inputs beyond INPUT_NAMES that every step feeds (Gemma 4: ple_embeddings; Omni adds
        deepstack_embeds)."""
        return [PLE_INPUT] if self.per_layer is not None else []

    def _extra_feeds(self, ids: list[int]) -> dict[str, np.ndarray]:
        """The values of _extra_input_names for a step running `ids` (after _input_embeddings)."""
        return {PLE_INPUT: self.per_layer.rows(ids)} if self.per_layer is not None else {}

    def token_inputs(self, ids: list[int]) -> dict[str, np.ndarray]:
        """The graph inputs a step's tokens decide, in row order: `input_ids` (their embedding rows)
        and the extra inputs (Gemma 4's ple_embeddings); the caller adds the mask, position ids and
        logits index. Part of the `BatchHost` protocol."""
        ids = arguments.token_ids(ids, "ids")
        arguments.require_loaded(self, "token_inputs")
        return self._token_feeds(self.tokenizer.check_ids(ids))

    def _token_feeds(self, ids: list[int]) -> dict[str, np.ndarray]:
        """`token_inputs` of ids already checked (each forward's, so they are not checked twice)."""
        return {"input_ids": self._input_embeddings(ids), **self._extra_feeds(ids)}

    def _commit(self, ids: list[int]) -> None:
        """Tokens that ran through the model join the history (the KV cache holds them now)."""
        self.conversation.commit(ids)

    def forward(self, input_ids: Sequence[int], all_logits: bool | None = None,
                parents: Sequence[int] | None = None) -> np.ndarray:
        """Run the new tokens through the model (appending them to the KV cache); returns
        the logits of the last token ([vocab]) or, with all_logits, of every token. With
        `parents` the tokens are a tree (parents[i]: the index of token i's parent, -1 for a
        root, which follows the cache): each attends to the cache and its ancestors only, at
        position past + depth (speculative tree verification); all of them join the history."""
        input_ids = arguments.token_ids(input_ids, "input_ids")
        all_logits = arguments.optional_flag(all_logits, "all_logits")
        parents = arguments.optional_indices(parents, "parents")
        arguments.require_loaded(self, "forward")
        ids = self.tokenizer.check_ids(input_ids)
        if not ids:
            raise MnnllmError("forward needs at least one token", field="input_ids")
        if parents is not None and len(parents) != len(ids):
            raise MnnllmError(f"forward got {len(parents)} parents for {len(ids)} tokens", field="parents")
        all_logits = self.config.all_logits if all_logits is None else all_logits
        with self.exclusive("forward"):
            return self._forward(ids, bool(all_logits), parents)

    def _forward(self, ids: list[int], all_logits: bool, parents: list[int] | None = None) -> np.ndarray:
        chunk = prefill_chunk(self.config)
        if parents is None and 0 < chunk < len(ids):
            return run_in_chunks(self._forward, ids, all_logits, chunk)
        past = len(self.conversation)
        seq = len(ids)
        if past + seq > self.config.max_all_tokens:
            raise ContextLengthError(f"{past} cached + {seq} new tokens exceed max_all_tokens "
                                     f"{self.config.max_all_tokens}", file=self.config.origin("max_all_tokens"),
                                     field="max_all_tokens")
        prepared = seq == 1 and self.config.attention_mask == "float" and self.config.attention_type == "full"
        if parents is not None:
            mask, positions = self._tree_inputs(parents)
        else:
            mask = self._decode_mask if prepared else self._attention_mask(seq)
            positions = self._position_ids(seq)
        feeds = {**self._token_feeds(ids), "attention_mask": mask, "position_ids": positions,
                 "logits_index": self._logits_index[bool(all_logits)]}
        conversation = self.conversation
        conversation.start_step(seq)
        try:
            outputs = self.pool.get(seq, all_logits).forward(feeds, consume=True)
        except BaseException as err:
            self.pool.discard(seq, all_logits)  # an interrupted run may leave its clone half resized
            if isinstance(err, ContextLengthError):  # the KV cache's capacity: name max_all_tokens beside it
                raise ContextLengthError(f"{err.reason}; max_all_tokens is {self.config.max_all_tokens}: lower it "
                                         "to what the KV cache holds", file=self.config.origin("max_all_tokens"),
                                         field="max_all_tokens") from err
            raise
        release_long_step(self.pool, seq, all_logits)
        self._commit(ids)
        if conversation.cached != len(conversation):
            cached = conversation.cached
            self._forget()
            raise KVStateError(f"the KV cache holds {cached} tokens after a step, the history "
                               f"{past + seq}: the conversation was reset", field="kv_meta")
        if self.prefix_cache is not None:
            self.prefix_cache.saved_after(conversation.history)
        if len(outputs) > 1:
            self._keep_hidden_states(outputs[1])
        logits = outputs[0]
        return logits.reshape(-1, logits.shape[-1]) if all_logits else logits.reshape(-1)

    def _keep_hidden_states(self, hidden: np.ndarray) -> None:
        """The step's `hidden_states` output as [rows, hidden_size] (the drafts of mtp/eagle read it)."""
        width = self.config.hidden_size
        if hidden.size == 0 or hidden.size % width:
            raise FormatError(f"the hidden_states output has shape {list(hidden.shape)}, not rows of hidden_size "
                              f"{width}", file=self.config.llm_model, field="hidden_states")
        self.hidden_states = np.array(hidden, np.float32).reshape(-1, width)

    # -- generation --------------------------------------------------------------------
    def reply_budget(self, max_new_tokens: int | None) -> int:
        """The new tokens a reply may have: `max_new_tokens`, or the config's when None; a
        ConfigError naming the field (and the config file) when it is not an integer >= 1.
        Part of the `BatchHost` protocol."""
        budget = self.config.max_new_tokens if max_new_tokens is None else max_new_tokens
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {shorten(repr(budget), 40)}",
                              field="max_new_tokens",
                              file=self.config.origin("max_new_tokens") if max_new_tokens is None else None)
        return int(budget)

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        """How many leading tokens of `prompt_ids` the next generation takes from the KV cache:
        the common prefix with the history, less the last prompt token (it must run for logits);
        none when `reuse_kv`/`prompt_cache` turn reuse off (kv_reuse.py)."""
        prompt_ids = arguments.token_ids(prompt_ids, "prompt_ids")
        if not reuse_enabled(self.config):
            return 0
        common = 0
        for a, b in zip(self.conversation.history, prompt_ids):
            if a != b:
                break
            common += 1
        return max(min(common, len(prompt_ids) - 1), 0)

    def _start(self, prompt_ids: list[int]) -> list[int]:
        """Reuse the KV cache for the longest common prefix of the history; return what is new."""
        with self.exclusive("starting a generation"):
            return self._cut_to_prefix(prompt_ids)

    def _cut_to_prefix(self, prompt_ids: list[int]) -> list[int]:
        if not prompt_ids:
            raise MnnllmError("the prompt encodes to no tokens", field="input_ids")
        if len(prompt_ids) > self.config.max_all_tokens:
            raise ContextLengthError(f"the prompt has {len(prompt_ids)} tokens; max_all_tokens is "
                                     f"{self.config.max_all_tokens}", file=self.config.origin("max_all_tokens"),
                                     field="max_all_tokens")
        common = self.cached_prefix(prompt_ids)
        if self.prefix_cache is not None:  # a longer prefix saved on disk by an earlier process
            common = self.prefix_cache.restore(prompt_ids, common)
        self.conversation.rewind(common)
        ctx = self.context
        ctx.prompt_len, ctx.gen_seq_len = len(prompt_ids), 0
        ctx.prefill_us = ctx.decode_us = ctx.sample_us = 0
        ctx.output_tokens = []
        return prompt_ids[common:]

    def make_sampler(self, overrides: Mapping[str, Any]) -> Sampler:
        """A sampler of the config with `overrides` (sampler keys) merged over it, for one call
        of generate/stream_ids/stream_text; the config and `self.sampler` stay as they are."""
        overrides = arguments.mapping(overrides, "overrides")
        return Sampler(SamplerConfig.from_config({**self.config.to_dict(), **overrides}))

    def guide(self, constraint=None, logits_processor=None, logprobs: int | None = None,
              sampler: Sampler | None = None) -> GuidedSampler:
        """A sampler for one reply of generate/stream_ids/stream_text (guided.py): `constraint` (a
        Constraint, or a JSON schema dict) masks the logits, `logits_processor` (callable(ids, logits)
        -> logits, or a list) edits them first, `logprobs` (how many top alternatives) records each
        token's log-probability in its `.logprobs`; `sampler` (default: the model's) then chooses."""
        sampler = arguments.instance(sampler, Sampler, "sampler")
        constraint, processors, logprobs = check_guidance(constraint, logits_processor, logprobs)
        arguments.require_loaded(self, "guide")
        return guided_sampler(self, sampler or self.sampler, constraint, processors, logprobs)

    def _generation_for(self, sampler: "Sampler | GuidedSampler | None"):
        if isinstance(sampler, GuidedSampler):
            return guided_generation(self, sampler)
        return self.generation if sampler is None else create_generation(self, sampler)

    def generate(self, input_ids: Sequence[int], max_new_tokens: int | None = None,
                 sampler: Sampler | None = None) -> list[int]:
        """Greedy/sampled continuation of `input_ids` (a whole prompt); the new token ids."""
        self.reply_budget(max_new_tokens)
        input_ids = arguments.token_ids(input_ids, "input_ids")
        sampler = arguments.instance(sampler, (Sampler, GuidedSampler), "sampler")
        arguments.require_loaded(self, "generate")
        return list(self.stream_ids(input_ids, max_new_tokens, sampler))

    def stream_ids(self, input_ids: Sequence[int], max_new_tokens: int | None = None,
                   sampler: Sampler | None = None) -> Iterator[int]:
        """The new token ids one by one. Closing the iterator early (a cancelled request) leaves
        the engine consistent: the history holds exactly the tokens the KV cache holds. Resumed
        after another call changed the conversation (a second stream, reset, forward), it raises
        ConcurrentUseError instead of continuing from someone else's cache."""
        budget = self.reply_budget(max_new_tokens)
        input_ids = arguments.token_ids(input_ids, "input_ids")
        sampler = arguments.instance(sampler, (Sampler, GuidedSampler), "sampler")
        arguments.require_loaded(self, "stream_ids")
        new = self._start(self.tokenizer.check_ids(input_ids))
        steps = self._generation_for(sampler).generate(new, budget)
        mine = self._steps
        while True:
            if self._steps != mine:
                steps.close()
                raise ConcurrentUseError("this stream was superseded: another generation, reset or forward "
                                         "changed the conversation since its last token; finish or close "
                                         "a stream before starting another on the same Llm")
            token = next(steps, None)
            if token is None:
                return
            mine = self._steps
            yield token

    def _prompt_ids(self, prompt: Messages) -> list[int]:
        text = self.prompt.apply_chat_template(prompt) if self.config.use_template else str(prompt)
        limit = self.config.max_all_tokens
        if self.tokenizer.exceeds(text, limit):
            raise ContextLengthError(f"the prompt ({len(text)} characters) has more than {limit} tokens, "
                                     f"max_all_tokens", file=self.config.origin("max_all_tokens"),
                                     field="max_all_tokens")
        return self.tokenizer.encode(text)

    def response(self, prompt: Messages, stream: bool = False, max_new_tokens: int | None = None, *,
                 constraint=None, logits_processor=None, logprobs: int | None = None):
        """Answer a prompt (str) or a conversation (list of {role, content}).

        With stream=True, an iterator of text pieces; otherwise the whole answer. The
        stop token is not part of the text. Multi-turn: pass the whole conversation;
        the KV cache of the common prefix is reused. `constraint`, `logits_processor` and
        `logprobs` as in `guide()`; the reply's guided sampler is then `self.last_guided`
        (its `.logprobs`), and a constrained reply cut short ends with status CONSTRAINT_UNFINISHED.
        """
        prompt = arguments.messages(prompt, "prompt")
        stream = arguments.flag(stream, "stream")
        self.reply_budget(max_new_tokens)
        constraint, logits_processor, logprobs = check_guidance(constraint, logits_processor, logprobs)
        arguments.require_loaded(self, "response")
        sampler = None
        if constraint is not None or logits_processor or logprobs is not None:
            sampler = self.last_guided = self.guide(constraint, logits_processor, logprobs)
        ids = self._prompt_ids(prompt)
        pieces = self.stream_text(ids, max_new_tokens, sampler)
        return pieces if stream else "".join(pieces)

    def stream_text(self, ids: Sequence[int], max_new_tokens: int | None = None,
                    sampler: Sampler | None = None) -> Iterator[str]:
        """The answer to prompt ids as text pieces, the stop token left out. Stopped early
        (Ctrl-C, or the consumer closing the iterator), the status is STOPPED and the history
        holds the prompt and every token that ran through the model, the KV cache agreeing with it."""
        ids = arguments.token_ids(ids, "ids")
        self.reply_budget(max_new_tokens)
        sampler = arguments.instance(sampler, (Sampler, GuidedSampler), "sampler")
        arguments.require_loaded(self, "stream_text")
        decoder = self.tokenizer.stream()
        try:
            for token in self.stream_ids(ids, max_new_tokens, sampler):
                if self.tokenizer.is_stop(token):
                    break
                piece = decoder.put(token)
                if piece:
                    yield piece
        except (KeyboardInterrupt, GeneratorExit):
            self.context.status = STOPPED
            raise
        tail = decoder.flush()
        if tail:
            yield tail

    def reset(self) -> None:
        """Forget the conversation: the KV cache is emptied on the next forward (the history is
        the truth; forward cuts the cache back to it). A live stream is superseded."""
        with self.exclusive("reset"):
            self._forget()

    def _forget(self) -> None:
        self.conversation.forget()

    def placement(self) -> dict:
        """Where the ops of the most recently used clone ran (empty before the first forward)."""
        arguments.require_loaded(self, "placement")
        modules = self.pool.modules() or [self.module]
        return modules[-1].placement()


def check_model_files(config: LlmConfig) -> None:
    """A file the config names that is not there: the key and the config file at fault (before a
    load, and before `mnnllm bench` starts its first run)."""
    for key in ("llm_model", "tokenizer_file"):
        path = getattr(config, key)
        if not os.path.isfile(path):
            problem = "is not a regular file" if os.path.exists(path) else "does not exist"
            raise ConfigError(f"{key} names a file that {problem}: {path}", file=config.origin(key) or config.source,
                              field=key)


def _keys_of(config: Mapping[str, Any] | str) -> Mapping[str, Any]:
    """The top-level keys of set_config's argument (JSON text that does not parse to an object is
    the config's own error to report)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return {}
    return config if isinstance(config, Mapping) else {}


def _refuse_text_encoder(graph: str, err: UnsupportedError) -> None:
    """A graph that lacks an LLM's inputs because it is a text encoder (it outputs MNN's
    `sentence_embeddings`): say how to load it instead."""
    if err.field != "inputs":
        return
    from .model_kind import is_text_encoder
    if is_text_encoder(graph):
        raise UnsupportedError("this is an embedding model (its graph outputs sentence_embeddings, not logits): "
                               "load it with create(config, embedding_model=True) or run `mnnllm embed`",
                               file=graph, field="inputs") from err
