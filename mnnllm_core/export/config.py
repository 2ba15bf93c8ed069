"""Reading a HF config.json in both the transformers 4 and 5 layouts, so that nothing is silently dropped.

transformers 5 moved `rope_theta` / `rope_scaling` into `rope_parameters` (one dict per layer
type for Gemma 3) and writes `layer_types`; transformers 4 configs carry the same facts as
top-level keys and per-model rules. `ConfigReader` answers both, notes every key an architecture
reads, and `finish()` turns any key that was neither read nor known to leave inference alone into
an UnsupportedError naming it: a key that changes the math must never fall back to a default.
"""
from __future__ import annotations

from typing import Any

from mnnllm_core.errors import ConfigError, UnsupportedError

from .rope import ROPE_TYPES, RopeSpec, yarn_attention_factor

FULL, SLIDING = "full_attention", "sliding_attention"

# Keys that do not change what a greedy forward pass computes: bookkeeping, training-only
# settings (dropout, init, router losses), token ids and generation defaults.
INERT_KEYS = frozenset({
    "_name_or_path", "name_or_path", "architectures", "auto_map", "model_type", "transformers_version", "dtype",
    "torch_dtype", "use_cache", "initializer_range", "attention_dropout", "hidden_dropout", "embd_pdrop",
    "resid_pdrop", "dropout", "classifier_dropout", "output_router_logits", "router_aux_loss_coef",
    "router_jitter_noise", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "max_position_embeddings", "id2label", "label2id", "output_attentions",
    "output_hidden_states", "return_dict", "torchscript", "is_decoder", "is_encoder_decoder", "add_cross_attention",
    "cross_attention_hidden_size", "tie_encoder_decoder", "tokenizer_class", "chunk_size_feed_forward",
    "problem_type", "pruned_heads", "task_specific_params", "finetuning_task", "prefix", "pretraining_tp",
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
    "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens", "use_bfloat16",
    "_attn_implementation_autoset", "tf_legacy_loss", "use_return_dict", "is_llama_config", "transformers.js_config",
})


def language_part(config: dict[str, Any], file: str | None, outer_keys: tuple[str, ...]) -> tuple[dict[str, Any], bool]:
    """A composite (vision-language) config's `text_config`, with the outer `tie_word_embeddings`, and True;
    a text-only config unchanged, and False. `outer_keys`: the composite's keys that leave the text model
    alone (token ids, the other towers' configs); any other outer key is refused like an unread one."""
    if "text_config" not in config:
        return config, False
    outer = ConfigReader(config, file)
    outer.ignore("text_config", "tie_word_embeddings", *outer_keys)
    outer.finish()
    text = dict(config["text_config"])
    if "tie_word_embeddings" in config:
        text["tie_word_embeddings"] = config["tie_word_embeddings"]
    return text, True


class ConfigReader:
    """One architecture's view of config.json: typed getters that remember what was read."""

    def __init__(self, config: dict[str, Any], file: str | None = None):
        self.config = config
        self.file = file
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.config.get(key)
        return default if value is None else value

    def error(self, message: str, key: str) -> ConfigError:
        return ConfigError(message, file=self.file, field=key)

    def unsupported(self, message: str, key: str) -> UnsupportedError:
        return UnsupportedError(f"{self.config.get('model_type')}: {message}", file=self.file, field=key)

    def size(self, key: str, default: int | None = None) -> int:
        """A positive integer; missing without a default, or anything else, is a ConfigError."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(f"{key} must be a positive integer, got {self.config.get(key)!r}", key)
        return value

    def number(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"{key} must be a number, got {value!r}", key)
        return float(value)

    def flag(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise self.error(f"{key} must be true or false, got {value!r}", key)
        return value

    def require(self, key: str, allowed: tuple, default: Any = None) -> Any:
        """A key whose only supported values are `allowed` (an activation, a flag that must be off)."""
        value = self.get(key, default)
        if value not in allowed:
            raise self.unsupported(f"{key} {value!r} (supported: {', '.join(map(repr, allowed))})", key)
        return value

    def ignore(self, *keys: str) -> None:
        """Keys this architecture knows are redundant (e.g. a pattern that `layer_types` already spells out)."""
        self.read.update(keys)

    # -- layer types and rotary -------------------------------------------------

    def layer_types(self, layers: int, default: list[str]) -> list[str]:
        """`layer_types` (transformers 5) or the architecture's transformers 4 rule."""
        types = self.get("layer_types")
        if types is None:
            return default
        if not isinstance(types, list) or len(types) != layers or any(t not in (FULL, SLIDING) for t in types):
            raise self.unsupported(f"layer_types must list {layers} of {FULL!r}/{SLIDING!r}, got {types!r}",
                                   "layer_types")
        return list(types)

    def rope(self, default_theta: float, layer_type: str | None = None,
             legacy_theta_key: str = "rope_theta", legacy_scaling: bool = True, partial: bool = False,
             yarn: bool = False, text_mrope: bool = False) -> RopeSpec:
        """The rotary table of one layer type, from `rope_parameters` (nested by layer type or not) or from
        the transformers 4 keys (`legacy_theta_key`, `rope_scaling`, `partial_rotary_factor`).
        `partial`: the architecture rotates part of each head (a factor below 1 is refused otherwise);
        `yarn`: its graph scales the cos/sin table by YaRN's attention factor (yarn is refused otherwise);
        `text_mrope`: M-RoPE sections are accepted, as text positions are equal in every section."""
        params = self.get("rope_parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise self.error(f"rope_parameters must be an object, got {params!r}", "rope_parameters")
            if layer_type is not None and layer_type in params:
                params = params[layer_type]
            elif any(isinstance(v, dict) for v in params.values()):
                raise self.error(f"rope_parameters has no entry for {layer_type!r}", "rope_parameters")
            theta = params.get("rope_theta", self.get(legacy_theta_key, default_theta))
            return self._rope_spec(dict(params, rope_theta=theta), "rope_parameters", partial, yarn, text_mrope)
        scaling = self.get("rope_scaling") if legacy_scaling else None
        if scaling is not None and not isinstance(scaling, dict):
            raise self.error(f"rope_scaling must be an object, got {scaling!r}", "rope_scaling")
        spec = dict(scaling or {})
        spec["rope_theta"] = self.number(legacy_theta_key, default_theta)
        if self.has("partial_rotary_factor"):
            spec.setdefault("partial_rotary_factor", self.get("partial_rotary_factor"))
        return self._rope_spec(spec, "rope_scaling", partial, yarn, text_mrope)

    def _rope_spec(self, p: dict[str, Any], key: str, partial: bool = False, yarn: bool = False,
                   text_mrope: bool = False) -> RopeSpec:
        kind = p.get("rope_type", p.get("type", "default"))
        kinds = ROPE_TYPES + (("yarn",) if yarn else ())
        if kind not in kinds:
            raise self.unsupported(f"rope type {kind!r} (supported: {', '.join(kinds)})", key)
        factor = p.get("partial_rotary_factor", 1.0)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
            raise self.error(f"partial_rotary_factor must be in (0, 1], got {factor!r}", key)
        if factor != 1.0 and not partial and kind != "proportional":
            raise self.unsupported(f"partial_rotary_factor {p['partial_rotary_factor']!r}", key)
        known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
        if text_mrope:
            known |= {"mrope_section", "mrope_interleaved"}
        if kind in ("linear", "proportional"):
            known |= {"factor"}
        if kind == "llama3":
            known |= {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
        if kind == "yarn":
            known |= {"factor", "beta_fast", "beta_slow", "truncate", "original_max_position_embeddings",
                      "attention_factor", "mscale", "mscale_all_dim"}
        unknown = sorted(set(p) - known)
        if unknown:
            raise self.unsupported(f"rope parameter(s) {', '.join(unknown)} of rope type {kind!r}", key)
        theta = p["rope_theta"]
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
            raise self.error(f"rope_theta must be a positive number, got {theta!r}", key)
        if kind == "proportional":
            return RopeSpec(float(theta), kind, float(p.get("factor", 1.0)), partial_rotary_factor=float(factor))
        if kind == "default":
            return RopeSpec(float(theta), partial_rotary_factor=float(factor))
        try:
            if kind == "linear":
                return RopeSpec(float(theta), kind, float(p["factor"]), partial_rotary_factor=float(factor))
            original = p.get("original_max_position_embeddings",
                             self.get("original_max_position_embeddings", self.get("max_position_embeddings")))
            if kind == "yarn":
                return self._yarn_spec(p, float(theta), int(original), float(factor))
            return RopeSpec(float(theta), kind, float(p["factor"]), float(p["low_freq_factor"]),
                            float(p["high_freq_factor"]), int(original), float(factor))
        except (KeyError, TypeError, ValueError) as exc:
            raise self.error(f"rope type {kind!r} needs a numeric {exc}", key) from None

    @staticmethod
    def _yarn_spec(p: dict[str, Any], theta: float, original: int, partial: float) -> RopeSpec:
        """YaRN as transformers reads it: beta_fast/beta_slow 32/1 when absent or 0, truncate by default."""
        factor = float(p["factor"])
        attention = p.get("attention_factor")
        if attention is None:
            attention = yarn_attention_factor(factor, p.get("mscale"), p.get("mscale_all_dim"))
        return RopeSpec(theta, "yarn", factor, original_max_position_embeddings=original,
                        partial_rotary_factor=partial, beta_fast=float(p.get("beta_fast") or 32),
                        beta_slow=float(p.get("beta_slow") or 1), truncate=bool(p.get("truncate", True)),
                        attention_factor=float(attention))

    # -- the end ----------------------------------------------------------------

    def finish(self) -> None:
        """Every key must have been read or be inert."""
        unread = sorted(k for k in self.config if k not in self.read and k not in INERT_KEYS)
        if unread:
            raise self.unsupported(
                f"config key(s) {', '.join(unread)} are not understood by the exporter and may change the "
                "model's output; refusing to guess", unread[0])
