"""MNN's `Embedding` (embedding.cpp; pymnn's `create(config, embedding_model=True)`): a text
encoder that turns a text into one pooled, L2-normalized vector.

load: runtime, tokenizer, prompt, DiskEmbedding, then `Module.load` with MNN's names, inputs
`input_ids`, `attention_mask`, `position_ids` and the output `sentence_embeddings` (pooling and
normalization are in the graph). `txt_embedding(text)` applies the chat template (the exporter's
wraps the text in [CLS] ... [SEP]) and encodes it; `ids_embedding(ids)` runs one independent
forward: positions 0..n-1 and MNN's `attention_mask`, [1, 1, n, n] of 1.0 for "int" models (added
to every score, it changes nothing: the attention is bidirectional), causal for "float". Both return [1, hidden] float32,
the shape of MNN's `VARP`. An embedding model does not generate: `generate`, `response`,
`forward` and the streams raise UnsupportedError, where pymnn returns None.
"""
from __future__ import annotations

import logging
import time
from typing import Any, NoReturn, Sequence

import numpy as np

from ..errors import ConfigError, ContextLengthError, FormatError, MnnllmError, UnsupportedError
from ..express.module import Module
from ..express.static_module import Config
from . import arguments
from .config import LlmConfig
from .disk_embedding import DiskEmbedding
from .llm import Llm, Messages
from .model_kind import SENTENCE_EMBEDDINGS
from .prompt import Prompt
from .runtime import init_runtime
from .tokenizer import create_tokenizer

log = logging.getLogger(__name__)

INPUT_NAMES = ["input_ids", "attention_mask", "position_ids"]
OUTPUT_NAME = SENTENCE_EMBEDDINGS


class Embedding(Llm):
    """One text encoder; each call is independent (no history, no KV cache)."""

    def __init__(self, config: LlmConfig):
        if config.is_visual or config.is_audio or config.has_talker:
            raise ConfigError("an embedding model is a text encoder; this config is multimodal",
                              file=config.source, field="is_visual" if config.is_visual else
                              "is_audio" if config.is_audio else "has_talker")
        super().__init__(config)

    def load(self) -> "Embedding":
        start = time.perf_counter()
        cfg = self.config
        self._check_model_files()
        self.runtime_manager = init_runtime(cfg)
        self.tokenizer = create_tokenizer(cfg.tokenizer_file)
        self.prompt = Prompt(cfg, self.tokenizer.bos_token)
        self.embedding = DiskEmbedding(cfg)
        self.runtime_manager.set_external_file(cfg.llm_weight)
        try:
            self.module = Module.load(INPUT_NAMES, [OUTPUT_NAME], cfg.llm_model, self.runtime_manager,
                                      Config(rearrange=True))
        except (FormatError, UnsupportedError) as err:  # the graph lacks MNN's embedding inputs or output
            if err.field not in ("inputs", "outputName"):
                raise
            raise ConfigError(f"not an embedding model ({err.reason}): an LLM loads without embedding_model",
                              file=cfg.llm_model, field=err.field) from None
        self.context.load_us = int((time.perf_counter() - start) * 1e6)
        log.info("loaded the embedding model %s in %.2f s on %s", cfg.llm_model, self.context.load_us / 1e6,
                 self.runtime_manager.config.backend_type)
        return self

    def dim(self) -> int:
        """The embedding's length (MNN: `hidden_size`)."""
        return int(self.config.hidden_size)

    def txt_embedding(self, text: str) -> np.ndarray:
        """The pooled, normalized embedding of `text`, [1, hidden]."""
        text = arguments.text(text, "text")
        arguments.require_loaded(self, "txt_embedding")
        return self.ids_embedding(self.text_ids(text))

    def text_ids(self, text: str) -> list[int]:
        """The token ids txt_embedding embeds: the text in the chat template, encoded; a
        ContextLengthError past max_all_tokens."""
        text = arguments.text(text, "text")
        arguments.require_loaded(self, "text_ids")
        prompt = self.prompt.apply_chat_template(text)
        limit = self.config.max_all_tokens
        if self.tokenizer.exceeds(prompt, limit):
            raise self._too_long(f"the text ({len(text)} characters) has more than {limit} tokens")
        return self.tokenizer.encode(prompt)

    def ids_embedding(self, ids: Sequence[int]) -> np.ndarray:
        """The embedding of token ids as they are (no template), [1, hidden]."""
        ids = arguments.token_ids(ids, "ids")
        arguments.require_loaded(self, "ids_embedding")
        ids = self.tokenizer.check_ids(ids)
        if not ids:
            raise MnnllmError("an embedding needs at least one token", field="input_ids")
        if len(ids) > self.config.max_all_tokens:
            raise self._too_long(f"{len(ids)} tokens exceed the model's {self.config.max_all_tokens} positions")
        with self.exclusive("an embedding"):
            start = time.perf_counter()
            seq = len(ids)
            feeds = {"input_ids": self.embedding.embedding(ids), "attention_mask": self._attention_mask(seq),
                     "position_ids": np.arange(seq, dtype=np.int32).reshape(1, seq)}
            out = self.module.forward(feeds)[0]
            ctx = self.context
            ctx.prompt_len = ctx.all_seq_len = seq
            ctx.prefill_us = int((time.perf_counter() - start) * 1e6)
        if out.size != self.dim():
            raise FormatError(f"{OUTPUT_NAME} has {out.size} values, hidden_size is {self.dim()}",
                              file=self.config.llm_model, field=OUTPUT_NAME)
        return np.asarray(out, np.float32).reshape(1, -1)

    def _attention_mask(self, seq: int) -> np.ndarray:
        """MNN's Embedding::gen_attention_mask: "int" (encoders) all ones, nothing masked; "float"
        (decoder-based embedders) causal, the lowest float above the diagonal."""
        if self.config.attention_mask == "float":
            above = np.triu(np.ones((seq, seq), bool), 1)
            return np.where(above, np.finfo(np.float32).min, 0).astype(np.float32).reshape(1, 1, seq, seq)
        return np.ones((1, 1, seq, seq), np.float32)

    def embeddings(self, texts: Sequence[str]) -> np.ndarray:
        """Each text's embedding, one row each: [len(texts), hidden]."""
        texts = arguments.texts(texts, "texts")
        return np.concatenate([self.txt_embedding(t) for t in texts]) if texts else np.zeros((0, self.dim()),
                                                                                               np.float32)

    def placement(self) -> dict:
        arguments.require_loaded(self, "placement")
        return self.module.placement()

    def _too_long(self, message: str) -> ContextLengthError:
        return ContextLengthError(f"{message} (max_all_tokens; the exporter sets it to max_position_embeddings)",
                                  file=self.config.origin("max_all_tokens"), field="max_all_tokens")

    # -- what an embedding model does not do ---------------------------------------------
    def _not_generative(self, what: str) -> NoReturn:
        raise UnsupportedError(f"{what}: an embedding model does not generate text; use txt_embedding",
                               file=self.config.source, field=what)

    def forward(self, input_ids: Sequence[int], all_logits: bool | None = None) -> NoReturn:
        self._not_generative("forward")

    def generate(self, input_ids: Sequence[int], max_new_tokens: int | None = None, sampler: Any = None) -> NoReturn:
        self._not_generative("generate")

    def stream_ids(self, input_ids: Sequence[int], max_new_tokens: int | None = None,
                   sampler: Any = None) -> NoReturn:
        self._not_generative("stream_ids")

    def stream_text(self, ids: Sequence[int], max_new_tokens: int | None = None, sampler: Any = None) -> NoReturn:
        self._not_generative("stream_text")

    def response(self, prompt: Messages, stream: bool = False, max_new_tokens: int | None = None) -> NoReturn:
        self._not_generative("response")
