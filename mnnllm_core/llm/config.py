"""MNN's `LlmConfig`: `config.json` merged with `llm_config.json` and `context.json`.

Mirrors `transformers/llm/engine/src/llmconfig.hpp` (and the keys `llm.cpp` reads
straight from the document) of MNN 3.6:

* `config.json` is read first; `base_dir` (its folder, or its own `base_dir` key)
  is fixed then and never changes.
* `llm_config.json` (key `llm_config`) is merged *over* it, recursively: for a key
  in both files the `llm_config.json` value wins, objects are merged key by key,
  and new keys are appended in file order (MNN's `dump_config` shows the same).
  A missing `llm_config.json` is allowed, as in MNN (a warning is logged).
* `context.json` (key `context_file`), when present, is merged into
  `jinja.context`. MNN does this at `Llm::load()`; here it happens on `from_file`.
* Every file path is `base_dir + value`: plain string concatenation, exactly as
  MNN does, so `base_dir` needs its trailing separator and values are relative.
  `tmp_path` and `prefix_cache_path` are used as given (relative to the process's
  working directory), as in MNN.

Where MNN silently falls back to a default (a value of the wrong JSON type, a
malformed file), mnnllm raises `ConfigError` naming the file and the field.
One leniency: MNN ignores an integer literal for a float key (`"temperature": 1`);
mnnllm accepts it as the float it obviously means.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Generic, Mapping, TypeVar, overload

from mnnllm_core.errors import ConfigError, Origin, shorten
from mnnllm_core.files import CONFIG_LIMIT, read_bounded
from mnnllm_core.json_depth import check_depth, loads_bounded

logger = logging.getLogger(__name__)

T = TypeVar("T")

INT, FLOAT, BOOL, STR, PATH, STR_LIST, INT_LIST, OBJECT, ANY = (
    "int", "float", "bool", "str", "path", "str_list", "int_list", "object", "any")
"""Value kinds of the known keys; a PATH is a string read as `base_dir + value`."""

OTHER_KEYS = ("base_dir", "async", "allow_fallback", "backend_hints", "seed")
"""Keys read without an accessor: by MNN (`base_dir`, `async`) or by mnnllm alone (the runtime's
`allow_fallback` and `backend_hints`, the sampler's `seed`)."""

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_RUNTIME_KEYS = ("backend_type", "thread_num", "precision", "power", "memory")


class _Key(Generic[T]):
    """One key MNN's LlmConfig reads: its kind and MNN's default.

    Declared in the class body under the key's own name, so `cfg.thread_num` reads
    key "thread_num". `alias` names a legacy key read when this one is absent or
    negative (MNN's "top_k > topK" rule); `default_key` names a key whose value is
    the default (MNN's attention_mode falls back to quant_qkv).
    """

    def __init__(self, kind: str, default: T, *, alias: str | None = None,
                 default_key: str | None = None, minimum: int | None = None,
                 choices: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.default = default
        self.alias = alias
        self.default_key = default_key
        self.minimum = minimum  # the least a number may be (a size or a count)
        self.choices = choices  # the strings it may be, when only some mean something
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _Key[T]: ...
    @overload
    def __get__(self, obj: LlmConfig, owner: type) -> T: ...

    def __get__(self, obj: LlmConfig | None, owner: type) -> T | _Key[T]:
        if obj is None:
            return self
        return obj._read(self)


@dataclass(frozen=True)
class RuntimeOptions:
    """The backend keys of MNN's `initRuntime`, for the LLM or (mllm=True) the vision/audio part."""

    backend_type: str
    thread_num: int
    precision: str
    power: str
    memory: str


class LlmConfig:
    """The merged MNN-LLM configuration with typed, defaulted accessors named after MNN's keys.

    Unknown keys are kept: `get`, `cfg[key]`, `key in cfg` and `to_dict` see them.
    `async` (MNN's default true), a Python keyword, is checked but read with `get`.
    """

    # < model files (base_dir + value)
    llm_config = _Key(PATH, "llm_config.json")
    llm_model = _Key(PATH, "llm.mnn")
    llm_weight = _Key(PATH, "llm.mnn.weight")
    block_model = _Key(STR, "block_")
    lm_model = _Key(PATH, "lm.mnn")
    embedding_model = _Key(PATH, "embedding.mnn")
    embedding_file = _Key(PATH, "embeddings_bf16.bin")
    tokenizer_file = _Key(PATH, "tokenizer.txt")
    visual_model = _Key(PATH, "visual.mnn")
    npu_model_dir = _Key(PATH, "")
    audio_model = _Key(PATH, "audio.mnn")
    context_file = _Key(PATH, "context.json")
    # < generation
    max_all_tokens = _Key(INT, 2048, minimum=1)
    max_new_tokens = _Key(INT, 512, minimum=1)
    reuse_kv = _Key(BOOL, False)
    prompt_cache = _Key(BOOL, False)
    all_logits = _Key(BOOL, False)
    timeout_ms = _Key(INT, -1)
    # < backend / runtime (llm.cpp initRuntime and setRuntimeHint)
    backend_type = _Key(STR, "cpu")
    thread_num = _Key(INT, 4)
    precision = _Key(STR, "low")
    power = _Key(STR, "normal")
    memory = _Key(STR, "low")
    mllm = _Key(OBJECT, {})
    quant_qkv = _Key(INT, 8)
    attention_mode = _Key(INT, 8, default_key="quant_qkv")
    use_mmap = _Key(BOOL, False)
    use_cached_mmap = _Key(BOOL, True)
    mmap_size = _Key(INT, 1024)
    dynamic_option = _Key(INT, 0)
    kvcache_mmap = _Key(BOOL, False)
    kvcache_limit = _Key(INT, -1)
    tmp_path = _Key(STR, "")
    prefix_cache_path = _Key(STR, "prefixcache")
    cpu_sme2_neon_division_ratio = _Key(INT, 41)
    cpu_sme_core_num = _Key(INT, 2)
    enable_debug = _Key(BOOL, False)
    chunk = _Key(INT, 0)
    chunk_limits = _Key(INT_LIST, [])
    hidden_states = _Key(BOOL, False)
    # < talker (Omni)
    talker_model = _Key(PATH, "talker.mnn")
    talker_weight = _Key(PATH, "talker.mnn.weight")
    talker_embedding_file = _Key(PATH, "talker_embeddings_bf16.bin")
    predit_model = _Key(PATH, "predit.mnn")
    dit_model = _Key(PATH, "dit.mnn")
    bigvgan_model = _Key(PATH, "bigvgan.mnn")
    spk_dict = _Key(PATH, "spk_dict.mnn")
    talker_max_new_tokens = _Key(INT, 2048)
    talker_speaker = _Key(STR, "Chelsie")
    dit_steps = _Key(INT, 5)
    dit_solver = _Key(INT, 1)
    # < model
    model_type = _Key(STR, "")  # exporter's key; MNN's LlmConfig has no accessor for it
    is_single = _Key(BOOL, True)
    is_visual = _Key(BOOL, False)
    is_audio = _Key(BOOL, False)
    audio_type = _Key(STR, "whisper")
    is_mrope = _Key(BOOL, False)
    has_talker = _Key(BOOL, False)
    has_deepstack = _Key(BOOL, False)
    ple_embed_file = _Key(PATH, "")
    ple_embed_scale = _Key(FLOAT, 1.0)
    ple_embed_dim = _Key(INT, 0)
    ple_quant = _Key(INT_LIST, [])
    attn_scale = _Key(FLOAT, 0.0)
    use_template = _Key(BOOL, True)
    system_prompt = _Key(STR, "")
    hidden_size = _Key(INT, 4096, minimum=1)
    layer_nums = _Key(INT, 32, minimum=1)
    key_value_shape = _Key(INT_LIST, [])
    attention_mask = _Key(STR, "int", choices=("int", "float"))
    attention_type = _Key(STR, "full")
    sliding_window = _Key(INT, 0)
    attention_fused = _Key(BOOL, True)
    tie_embeddings = _Key(ANY, None)  # exporter writes an object of offsets; old files a list
    jinja = _Key(OBJECT, {})
    bos = _Key(STR, "")
    system_prompt_template = _Key(STR, "<|im_start|>system\n%s<|im_end|>\n")
    user_prompt_template = _Key(STR, "<|im_start|>user\n%s<|im_end|>\n")
    assistant_prompt_template = _Key(STR, "<|im_start|>assistant\n%s<|im_end|>\n")
    chat_template = _Key(STR, "")
    prompt_template = _Key(STR, "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n")
    # < sampler (new snake_case keys win over the legacy ones when >= 0)
    sampler_type = _Key(STR, "mixed")
    mixed_samplers = _Key(STR_LIST, ["topK", "tfs", "typical", "topP", "min_p", "temperature"])
    temperature = _Key(FLOAT, 1.0)
    top_k = _Key(INT, 40, alias="topK")
    top_p = _Key(FLOAT, 0.9, alias="topP")
    min_p = _Key(FLOAT, 0.1, alias="minP")
    tfs_z = _Key(FLOAT, 1.0, alias="tfsZ")
    typical = _Key(FLOAT, 1.0)
    repetition_penalty = _Key(FLOAT, 1.0, alias="penalty")
    presence_penalty = _Key(FLOAT, 0.0)
    frequency_penalty = _Key(FLOAT, 0.0)
    penalty_window = _Key(INT, 0)
    n_gram = _Key(INT, 8)
    ngram_factor = _Key(FLOAT, 1.0)
    penalty_sampler = _Key(STR, "greedy")
    logit_bias = _Key(OBJECT, {})
    banned_tokens = _Key(INT_LIST, [])
    # < speculative decoding
    speculative_type = _Key(STR, "")
    draft_predict_length = _Key(INT, 3, minimum=1)
    draft_adaptive = _Key(BOOL, True)  # ours, not MNN's: plain steps while drafting does not pay (draft_budget.py)
    draft_match_strictness = _Key(STR, "low", choices=("low", "medium", "high"))
    draft_selection_rule = _Key(STR, "freqxlen", choices=("freqxlen", "fcfs"))
    ngram_match_maxlen = _Key(INT, 4, minimum=1)
    lookup_file = _Key(PATH, "lookup_file.txt")
    ngram_update = _Key(BOOL, False)
    draft_model = _Key(PATH, "")
    mtp_model = _Key(PATH, "mtp.mnn")
    eagle_model = _Key(PATH, "eagle.mnn")
    eagle_fc = _Key(PATH, "eagle_fc.mnn")
    eagle_d2t = _Key(PATH, "eagle_d2t.mnn")
    eagle_depth = _Key(INT, 3, minimum=1)
    eagle_topk = _Key(INT, 1, minimum=1)

    def __init__(self, data: Mapping[str, Any] | None = None, base_dir: str = "./",
                 *, source: str | None = None) -> None:
        """Wrap an already-read config.json dict; `base_dir` is its folder with trailing '/'.

        Like MNN, a string `base_dir` key in `data` replaces the given folder.
        """
        data = dict(data or {})
        _validate(data, source)
        self._data: dict[str, Any] = copy.deepcopy(data)
        self._origin: dict[str, str | None] = dict.fromkeys(self._data, source)
        self.source = source  # the file read first (config.json), for errors about a defaulted key
        own = self._data.get("base_dir")
        self._base_dir = own if isinstance(own, str) else base_dir
        if self._base_dir and not self._base_dir.endswith(("/", "\\")):
            logger.warning("base_dir %r has no trailing separator: MNN (and mnnllm) form paths "
                           "as base_dir + name, e.g. %r", self._base_dir,
                           self._base_dir + "llm.mnn")

    @classmethod
    def known_keys(cls) -> dict[str, _Key[Any]]:
        """Every key with an accessor, by name (kinds and MNN defaults)."""
        return {name: v for name, v in vars(cls).items() if isinstance(v, _Key)}

    @classmethod
    def key_names(cls) -> set[str]:
        """Every key mnnllm reads: the accessors, their legacy aliases and `OTHER_KEYS`."""
        keys = cls.known_keys()
        return set(keys) | {k.alias for k in keys.values() if k.alias} | set(OTHER_KEYS)

    @classmethod
    def from_file(cls, config_path: str | os.PathLike[str]) -> LlmConfig:
        """Load like MNN's `LlmConfig(path)`: a config.json, a bare `.mnn`, or a directory.

        A `.mnn` path stands for {"llm_model": name, "llm_weight": name + ".weight"};
        any other path is taken as base_dir itself (MNN appends names to it verbatim).
        """
        path = os.fspath(config_path)
        if path.endswith(".json"):
            data = _read_json(path)
            if not isinstance(data, dict):
                raise ConfigError("the config must be a JSON object", file=path)
            cfg = cls(data, _folder_of(path), source=path)
        elif path.endswith(".mnn"):
            name = path[max(path.rfind("/"), path.rfind("\\")) + 1:]
            cfg = cls({"llm_model": name, "llm_weight": name + ".weight"}, _folder_of(path),
                      source=path)
        else:
            cfg = cls({}, path, source=path)

        llm_config_path = cfg.llm_config
        if os.path.exists(llm_config_path):  # a FIFO or a device there is an error, not a missing file
            llm_data = _read_json(llm_config_path)
            if not isinstance(llm_data, dict):
                raise ConfigError("llm_config must be a JSON object", file=llm_config_path)
            cfg._merge(llm_data, llm_config_path)
        else:
            logger.warning("no llm_config file at %s: using %s alone", llm_config_path, path)

        context_path = cfg.context_file
        if os.path.exists(context_path):
            template_file = cfg.origin("jinja")
            cfg._merge({"jinja": {"context": _read_json(context_path)}}, context_path)
            if template_file is not None:  # errors in jinja.chat_template name its own file
                cfg._origin["jinja"] = template_file
        return cfg

    @property
    def base_dir(self) -> str:
        """The folder every file key is appended to (fixed at construction, as in MNN)."""
        return self._base_dir

    def block_model_path(self, index: int) -> str:
        """MNN's `block_model(index)`: base_dir + block_model + index + '.mnn'."""
        return f"{self._base_dir}{self.block_model}{index}.mnn"

    def runtime_options(self, mllm: bool = False) -> RuntimeOptions:
        """Backend keys of the top level, or (mllm=True) of the `mllm` object; MNN's defaults."""
        source = self._data.get("mllm") if mllm else self._data
        if not isinstance(source, dict):
            source = {}
        keys = self.known_keys()
        return RuntimeOptions(**{k: _typed(source, keys[k]) for k in _RUNTIME_KEYS})

    def get(self, key: str, default: Any = None) -> Any:
        """The raw merged value of any key (known or not), or `default`."""
        return copy.deepcopy(self._data.get(key, default))

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def origin(self, key: str) -> str | None:
        """The file (or `Origin`, e.g. "set_config") that last set this top-level key; for error messages."""
        return self._origin.get(key)

    def to_dict(self) -> dict[str, Any]:
        """The merged document, in MNN's key order (what its `dump_config` prints)."""
        return copy.deepcopy(self._data)

    def set_config(self, content: Mapping[str, Any] | str, source: str = "set_config") -> None:
        """Merge a dict or JSON object text over the config recursively, like MNN's set_config.

        `source` names where the values came from in errors and `origin` (e.g. "--set").
        """
        origin = Origin(source)
        if isinstance(content, str):
            content = _parse_json(content, origin)
        if not isinstance(content, Mapping):
            raise ConfigError("set_config needs a JSON object", file=origin)
        self._merge(dict(content), origin)

    def _merge(self, source: dict[str, Any], name: str) -> None:
        check_depth(source, name, ConfigError)
        _validate(source, name)
        _merge_json(self._data, source)
        self._origin.update(dict.fromkeys(source, name))

    def _read(self, key: _Key[T]) -> T:
        value = _typed(self._data, key)
        if key.kind == PATH:
            return self._base_dir + value  # type: ignore[return-value, operator]
        return value

    def __repr__(self) -> str:
        return f"LlmConfig(base_dir={self._base_dir!r}, keys={list(self._data)!r})"


CONFIG_NAMES = ("config.json", "llm_config.json")
"""What a model folder given as a config path stands for, in this order."""


def resolve_config_path(path: str | os.PathLike[str]) -> str:
    """The config file a user means: a model folder stands for its config.json (else its
    llm_config.json); the model's graph or weight file is refused, naming what to pass."""
    text = os.fspath(path)
    if os.path.isdir(text):
        for name in CONFIG_NAMES:
            candidate = os.path.join(text, name)
            if os.path.isfile(candidate):
                return candidate
        raise ConfigError(f"the folder holds no {' or '.join(CONFIG_NAMES)}", file=text)
    if text.endswith((".mnn", ".mnn.weight")):
        folder = os.path.dirname(text) or "."
        instead = next((os.path.join(folder, n) for n in CONFIG_NAMES if os.path.isfile(os.path.join(folder, n))),
                       None)
        hint = f"pass {instead} (or the folder {folder})" if instead else "pass the model's config.json or its folder"
        raise ConfigError(f"this is a model file, not its config: {hint}", file=text)
    if not os.path.exists(text):
        raise ConfigError("no such file or folder", file=text)
    return text


def _typed(data: Mapping[str, Any], key: _Key[T]) -> T:
    """The value of `key` in `data` (validated earlier), else its alias, else MNN's default."""
    value = data.get(key.name)
    if key.alias is not None and (value is None or value < 0):
        value = data.get(key.alias)
    if value is None:
        if key.default_key is not None:
            return _typed(data, LlmConfig.known_keys()[key.default_key])
        return copy.deepcopy(key.default)
    if key.kind == FLOAT:
        return float(value)  # type: ignore[return-value]
    return copy.deepcopy(value)


def _validate(data: Mapping[str, Any], file: str | None) -> None:
    """Raise ConfigError for a known key whose value has the wrong JSON type (null means unset)."""
    keys = LlmConfig.known_keys()
    kinds = {name: k.kind for name, k in keys.items()}
    kinds.update({k.alias: k.kind for k in keys.values() if k.alias})
    kinds.update({"base_dir": STR, "async": BOOL})
    checks = [(name, value, kinds.get(name)) for name, value in data.items()]
    if isinstance(data.get("mllm"), dict):
        checks += [(f"mllm.{k}", data["mllm"].get(k), kinds[k]) for k in _RUNTIME_KEYS]
    for name, value, kind in checks:
        if kind is None or value is None:
            continue
        problem = _type_problem(value, kind) or _range_problem(value, keys.get(name))
        if problem:
            raise ConfigError(f"{name} must be {problem}, got {shorten(repr(value), 60)}", file=file, field=name)


def _range_problem(value: Any, key: _Key[Any] | None) -> str | None:
    """What a well-typed value should have been when it is out of its key's range."""
    if key is None:
        return None
    if key.minimum is not None and value < key.minimum:
        return f"at least {key.minimum}"
    if key.choices and value not in key.choices:
        return "one of " + ", ".join(repr(c) for c in key.choices)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _type_problem(value: Any, kind: str) -> str | None:
    """What `value` should have been for `kind`, or None when it fits."""
    if kind == INT:
        ok = _is_int(value) and _INT32_MIN <= value <= _INT32_MAX
        return None if ok else "a 32-bit integer"
    if kind == FLOAT:
        try:
            ok = (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
        except OverflowError:  # an integer literal beyond the float range
            ok = False
        return None if ok else "a number"
    if kind == BOOL:
        return None if isinstance(value, bool) else "true or false"
    if kind in (STR, PATH):
        return None if isinstance(value, str) else "a string"
    if kind == STR_LIST:
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        return None if ok else "a list of strings"
    if kind == INT_LIST:
        ok = isinstance(value, list) and all(_is_int(v) for v in value)
        return None if ok else "a list of integers"
    if kind == OBJECT:
        return None if isinstance(value, dict) else "a JSON object"
    return None


def _merge_json(destination: dict[str, Any], source: Mapping[str, Any]) -> None:
    """MNN's merge: objects merge key by key, anything else is replaced; new keys go last."""
    for key, value in source.items():
        if isinstance(destination.get(key), dict) and isinstance(value, dict):
            _merge_json(destination[key], value)
        else:
            destination[key] = copy.deepcopy(value)


def _folder_of(path: str) -> str:
    """MNN's `base_dir(path)`: everything up to the last separator, or "./"."""
    pos = max(path.rfind("/"), path.rfind("\\"))
    return "./" if pos < 0 else path[:pos + 1]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(text: str, file: str) -> Any:
    """Parse strict JSON (no NaN/Infinity, as rapidjson/ujson), naming `file` on failure; nesting
    deeper than MAX_DEPTH is refused (it would overflow the stack of every later recursive step)."""
    try:
        return loads_bounded(text, file, ConfigError, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          file=file) from exc
    except ValueError as exc:
        raise ConfigError(f"malformed JSON: {exc}", file=file) from exc


def _read_json(path: str) -> Any:
    """Read and parse one JSON file; unreadable, non-UTF-8 or malformed -> ConfigError."""
    try:
        text = read_bounded(path, CONFIG_LIMIT, ConfigError, "config").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", file=path) from exc
    return _parse_json(text, path)
