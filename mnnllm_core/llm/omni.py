"""MNN's Omni: an Llm with a vision encoder beside it (pymnn's names).

Prompts carry images as `<img>PATH</img>` / `<img><hw>H,W</hw>PATH</img>` (or image parts in
structured messages, or images passed by name beside the prompt). Encoding a prompt runs the
encoder on each image and expands its placeholder as the encoder's family does (vision.py:
vision_start, one image_pad per image token, vision_end; SmolVLM's tiles and global image);
prefill writes the image embeddings over the image_pad rows and, for Qwen3-VL, feeds their
deepstack features (deepstack.py). With
`is_mrope` the prompt's position ids are MNN's M-RoPE rows [3, seq]; generated tokens take the
token count as every position, as MNN's decode does. A conversation reuses the KV cache only
where tokens, positions and images are all the same as before.
Audio encoders and talkers are refused with what is missing.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import FormatError, MnnllmError, UnsupportedError
from . import arguments
from .config import LlmConfig
from .llm import Llm, Messages
from .deepstack import DEEPSTACK_INPUT, NO_DEEPSTACK, deepstack_rows, graph_takes_deepstack
from .multimodal import (IMG_TAG, ImageRows, MropePositions, PromptPlan, decode_key, inline_image_parts,
                         named_image, parse_image_content)
from .runtime import init_runtime
from .vision import VisionEncoder, token_id
from .vision_encoders import create_vision_encoder

log = logging.getLogger(__name__)


class Omni(Llm):
    def __init__(self, config: LlmConfig):
        super().__init__(config)
        self.vision: VisionEncoder | None = None
        self._keys: list[tuple] = []  # one per history token (see PromptPlan.keys)
        self._plan: PromptPlan | None = None  # the prompt being generated from
        self._pending: PromptPlan | None = None  # the last encoded prompt, until generation starts
        self._images: dict[str, Any] = {}
        self._takes_deepstack = False  # the LLM graph has a deepstack_embeds input (Qwen3-VL)

    # -- load --------------------------------------------------------------------
    def load(self) -> "Omni":
        missing = [name for name, flag in (("an audio encoder (is_audio)", self.config.is_audio),
                                           ("a talker (has_talker)", self.config.has_talker)) if flag]
        if missing:
            key = "is_audio" if self.config.is_audio else "has_talker"
            raise UnsupportedError(f"this model needs {' and '.join(missing)}, which mnnllm does not implement yet "
                                   "(only vision encoders, is_visual)", file=self.config.origin(key), field=key)
        super().load()
        if self.prefix_cache is not None:  # its files are keyed by token ids, and image rows share theirs
            log.warning("prefix cache off: a multimodal prompt's KV cache depends on its images, not only its ids")
            self.prefix_cache = None
        if self.config.is_visual:
            self.vision = create_vision_encoder(self.config, self._processor_runtime(), self.tokenizer)
            log.info("loaded the vision encoder %s", self.config.visual_model)
        return self

    def _processor_runtime(self):
        """MNN's processor runtime: the `mllm` object's backend keys when given, else the LLM's runtime."""
        return init_runtime(self.config, mllm=True) if self.config.get("mllm") else self.runtime_manager

    # -- prompts -----------------------------------------------------------------
    def tokenizer_encode(self, prompt: str, images: Mapping[str, Any] | None = None) -> list[int]:
        """MNN's Omni::tokenizer_encode: the ids of `prompt` with its <img> tags encoded (images named
        in the tags are paths or keys of `images`); the next generate() from these ids uses them."""
        prompt = arguments.text(prompt, "prompt")
        images = arguments.optional_mapping(images, "images")
        arguments.require_loaded(self, "tokenizer_encode")
        plan = self._encode_plan(prompt, {**self._images, **(images or {})})
        self._pending = plan
        return list(plan.ids)

    def _encode_plan(self, text: str, images: Mapping[str, Any]) -> PromptPlan:
        vision_before = self.vision.vision_us if self.vision is not None else 0
        plan = self._encode(text, images)
        self.context.vision_us = (self.vision.vision_us if self.vision is not None else 0) - vision_before
        return plan

    def _encode(self, text: str, images: Mapping[str, Any]) -> PromptPlan:
        ids: list[int] = []
        positions = MropePositions()
        rows: list[ImageRows] = []
        cursor = 0
        for match in IMG_TAG.finditer(text):
            self._add_text(text[cursor:match.start()], ids, positions)
            name, height, width = parse_image_content(match.group(1))
            out = self._vision().encode(named_image(images, name), height, width)
            if out.embeds.shape[1] != self.embedding.hidden:
                raise FormatError(f"the vision encoder gives {out.embeds.shape[1]} values per token, the LLM takes "
                                  f"{self.embedding.hidden}", file=self.config.visual_model, field="image_embeds")
            where = np.flatnonzero(np.asarray(out.ids) == token_id(self.config, "image_pad"))
            if len(where) != len(out.embeds):
                raise FormatError(f"the image stands for {len(where)} image_pad ids but has {len(out.embeds)} rows",
                                  file=self.config.visual_model, field="image_embeds")
            rows.append(ImageRows(where + len(ids), out.embeds, out.deepstack))
            ids.extend(out.ids)
            if out.grid is not None:  # start, the grid's tokens, end
                positions.add_image(out.grid)
            else:
                positions.add_text(len(out.ids))
            cursor = match.end()
        self._add_text(text[cursor:], ids, positions)
        return PromptPlan.build(ids, positions, rows)

    def _add_text(self, text: str, ids: list[int], positions: MropePositions) -> None:
        if text:
            piece = self.tokenizer.encode(text)
            ids.extend(piece)
            positions.add_text(len(piece))

    def _vision(self) -> VisionEncoder:
        if self.vision is None:
            raise UnsupportedError("this model has no vision encoder (is_visual is false), so it takes no images",
                                   file=self.config.origin("is_visual") or self.config.source, field="is_visual")
        return self.vision

    def _prompt_ids(self, prompt: Messages) -> list[int]:
        images = dict(self._images)
        if not isinstance(prompt, str):
            prompt, inline = inline_image_parts(prompt)
            images.update(inline)
        text = self.prompt.apply_chat_template(prompt) if self.config.use_template else str(prompt)
        return self.tokenizer_encode(text, images)

    def response(self, prompt: Messages, stream: bool = False, max_new_tokens: int | None = None,
                 images: Mapping[str, Any] | None = None, *, constraint=None, logits_processor=None,
                 logprobs: int | None = None):
        """Llm.response, with `images` (name -> path, array or PIL image) that <img>NAME</img> tags name."""
        images = arguments.optional_mapping(images, "images")
        self._images = dict(images or {})
        try:
            return super().response(prompt, stream, max_new_tokens, constraint=constraint,
                                    logits_processor=logits_processor, logprobs=logprobs)
        finally:
            self._images = {}

    # -- generation state ------------------------------------------------------------
    def _plan_for(self, prompt_ids: Sequence[int]) -> PromptPlan:
        pending = self._pending
        if pending is not None and pending.ids == list(prompt_ids):
            return pending
        pad = self.config.get("image_pad")
        if pad is not None and pad in prompt_ids:
            raise MnnllmError("these ids hold image_pad tokens but no image: encode the prompt with "
                              "tokenizer_encode (or response) so its images are known", field="input_ids")
        return PromptPlan.text(prompt_ids)

    def cached_prefix(self, prompt_ids: Sequence[int]) -> int:
        prompt_ids = arguments.token_ids(prompt_ids, "prompt_ids")
        keys = self._plan_for(prompt_ids).keys
        common = 0
        for a, b in zip(self._keys, keys):
            if a != b:
                break
            common += 1
        return max(min(common, len(prompt_ids) - 1), 0)

    def _start(self, prompt_ids: list[int]) -> list[int]:
        plan = self._plan_for(prompt_ids)
        new = super()._start(prompt_ids)
        del self._keys[len(self.context.history_tokens):]
        self._plan, self._pending = plan, None
        return new

    def _prefill_span(self, seq: int) -> slice | None:
        """Where the tokens about to run sit in the prompt plan, when they are its tokens."""
        past = len(self.context.history_tokens)
        plan = self._plan
        if plan is None or past + seq > len(plan.ids):
            return None
        return slice(past, past + seq)

    def _image_index(self, ids: list[int]) -> np.ndarray | None:
        """Each token's row of the prompt plan's image rows (-1 for text), when `ids` are the plan's."""
        span = self._prefill_span(len(ids))
        if span is None or self._plan.image_embeds is None or self._plan.ids[span] != ids:
            return None
        return self._plan.image_index[span]

    def _input_embeddings(self, ids: list[int]) -> np.ndarray:
        rows = super()._input_embeddings(ids)
        index = self._image_index(ids)
        if index is not None:
            where = index >= 0
            rows[where, 0] = self._plan.image_embeds[index[where]]
        return rows

    def _extra_input_names(self) -> list[str]:
        self._takes_deepstack = self.config.has_deepstack and graph_takes_deepstack(self.config.llm_model)
        return super()._extra_input_names() + ([DEEPSTACK_INPUT] if self._takes_deepstack else [])

    def _extra_feeds(self, ids: list[int]) -> dict[str, np.ndarray]:
        feeds = super()._extra_feeds(ids)
        if self._takes_deepstack:
            index = self._image_index(ids)
            feeds[DEEPSTACK_INPUT] = NO_DEEPSTACK if index is None else deepstack_rows(self._plan.deepstack, index)
        return feeds

    def _position_ids(self, seq_len: int) -> np.ndarray:
        if not self.config.is_mrope:
            return super()._position_ids(seq_len)
        span = self._prefill_span(seq_len)
        if span is not None:
            return np.ascontiguousarray(self._plan.positions[:, span])
        past = len(self.context.history_tokens)
        return np.repeat(np.arange(past, past + seq_len, dtype=np.int32)[None, :], 3, axis=0)

    def _commit(self, ids: list[int]) -> None:
        span = self._prefill_span(len(ids))
        if span is not None and self._plan.ids[span] == ids:
            self._keys.extend(self._plan.keys[span])
        else:
            past = len(self.context.history_tokens)
            self._keys.extend(decode_key(t, past + i) for i, t in enumerate(ids))
        super()._commit(ids)

    def _forget(self) -> None:
        super()._forget()
        self._keys.clear()
        self._plan = None

    def vision_placement(self) -> dict:
        """Where the vision encoder's ops ran (empty before the first image)."""
        arguments.require_loaded(self, "vision_placement")
        return self._vision().placement()

