"""`export_model`: a HF folder or GGUF file -> an MNN-LLM model directory, streaming tensor by tensor."""
from __future__ import annotations

import dataclasses
import json
import logging
import resource
import time
from dataclasses import dataclass, field
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from mnnllm_core.errors import ConfigError, UnsupportedError
from mnnllm_core.progress import Progress

from . import bert, gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3, qwen3_moe, smollm3
from . import gemma4, gpt_oss, hunyuan_v1_dense, lfm2, lfm2_moe, llama4, phi, qwen3_5, qwen3_5_moe
from .decoder import LM_HEAD, DecoderGraph
from .encoder import EncoderGraph
from .folder import check_apart, check_destination, remove_orphaned_staging, replace_folder, staging_folder
from .lora import LoraAdapter, MergedSource
from .lora_split import LORA_GRAPH, split_lora_graph
from .quant_config import QUANT_BITS, QUANT_BLOCKS, QuantConfig
from .shapes import check_shapes, expect_shape
from .sources import Source, TokenizerSpec, open_source
from .tokenizer import write_mtok, write_txt
from .weights import EMBED_BITS, LinearInfo, WeightWriter, write_bf16_embedding, write_int_embedding

logger = logging.getLogger(__name__)

ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama, "qwen2": qwen2, "qwen3": qwen3, "qwen3_moe": qwen3_moe, "gemma2": gemma2,
    "gemma3_text": gemma3_text, "mistral": mistral, "phi3": phi3, "smollm3": smollm3,
    "qwen3_5": qwen3_5, "qwen3_5_text": qwen3_5,
    "gemma4": gemma4, "gemma4_text": gemma4,
    "llama4_text": llama4,
    "qwen3_5_moe": qwen3_5_moe, "qwen3_5_moe_text": qwen3_5_moe,
    "phi": phi,
    "lfm2": lfm2,
    "hunyuan_v1_dense": hunyuan_v1_dense,
    "lfm2_moe": lfm2_moe,
    "gpt_oss": gpt_oss,
}
ENCODERS: dict[str, ModuleType] = {"bert": bert}  # embedding models, for MNN's `Embedding`
TOKENIZER_FORMATS = ("mtok", "txt")

# config.json as MNN's exporter writes it (the runtime defaults a user edits).
_RUNTIME_CONFIG: dict[str, Any] = {
    "llm_model": "llm.mnn", "llm_weight": "llm.mnn.weight", "backend_type": "cpu", "thread_num": 4,
    "precision": "low", "memory": "low", "sampler_type": "mixed", "temperature": 0.8, "top_k": 40, "top_p": 0.9,
    "min_p": 0.05, "tfs_z": 1.0, "typical": 0.95, "repetition_penalty": 1.0, "presence_penalty": 0.0,
    "frequency_penalty": 0.0, "penalty_window": 0, "n_gram": 8, "ngram_factor": 1.0,
}


@dataclass
class ExportReport:
    """What an export wrote and what it cost."""

    dst: str
    model_type: str
    quant_bit: int
    quant_block: int
    parameters: int
    files: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    peak_rss_bytes: int = 0

    @property
    def config_path(self) -> str:
        return str(Path(self.dst) / "config.json")

    def summary(self) -> str:
        mb = 1 << 20
        return (f"{self.model_type} {self.parameters / 1e6:.1f}M params -> {self.dst}: "
                f"{sum(self.files.values()) / mb:.1f} MiB in {len(self.files)} files, {self.seconds:.1f} s, "
                f"peak RSS {self.peak_rss_bytes / mb:.0f} MiB (fp32 weights: {4 * self.parameters / mb:.0f} MiB)")


def export_model(src: str, dst: str, quant_bit: int = 4, quant_block: int = 64, separate_embed: bool = False,
                 tokenizer: str = "mtok", force: bool = False,
                 runtime_config: Mapping[str, Any] | None = None, lora: str | None = None,
                 lora_split: bool = False, *, sym: bool = False, lm_quant_bit: int | None = None,
                 embed_bit: int = 16, hqq: bool = False, quant_config: str | None = None) -> ExportReport:
    """Export `src` (HF folder or .gguf) into the folder `dst`; returns what was written.

    The model is written beside `dst` and renamed into place when complete (see folder.py):
    a `dst` that holds anything is refused unless `force`, and then replaced whole.
    `runtime_config` overrides keys of the config.json written (e.g. the sampler).
    `lora`: a PEFT adapter folder, merged into the weights (W + scale * B @ A); with `lora_split`
    the base is exported unchanged and the adapter goes into MNN's split `lora.mnn` beside it.
    `sym`: one scale per block, no zero (`--sym`); `lm_quant_bit`: the lm_head's bits; `embed_bit`
    8 or 4: an untied embedding goes to embeddings_int8/int4.bin instead of embeddings_bf16.bin;
    `hqq`: Half-Quadratic Quantization of every block instead of min/max (`--hqq`, see hqq.py);
    `quant_config`: a JSON file of per-linear bits / block / symmetry (`--quant-config`, see quant_config.py).
    """
    source = open_source(src)
    adapter = LoraAdapter(lora) if lora is not None else None
    if lora_split and adapter is None:
        raise ConfigError("lora_split needs a LoRA adapter folder (--lora)", field="lora_split")
    if adapter is not None:
        adapter.check_base(source)
    target = Path(dst)
    check_apart(target, {"source": src, **({"LoRA adapter": lora} if lora is not None else {})})
    check_destination(target, force)
    remove_orphaned_staging(target)
    with staging_folder(target) as out:
        merged = MergedSource(source, adapter) if adapter is not None and not lora_split else None
        report = write_model(merged or source, out, quant_bit, quant_block, separate_embed, tokenizer,
                             runtime_config, sym=sym, lm_quant_bit=lm_quant_bit, embed_bit=embed_bit, hqq=hqq,
                             quant_config=quant_config)
        if merged is not None:
            merged.check_all_merged()
        if lora_split:
            graph = split_lora_graph((out / "llm.mnn").read_bytes(), adapter,
                                     f"{source.path}|{quant_bit}|{quant_block}")
            (out / LORA_GRAPH).write_bytes(graph)
            report.files[LORA_GRAPH] = len(graph)
        replace_folder(out, target)
    report.dst = str(target)
    logger.info("%s", report.summary())
    return report


def write_model(src: str | Source, out: Path, quant_bit: int = 4, quant_block: int = 64, separate_embed: bool = False,
                tokenizer: str = "mtok", runtime_config: Mapping[str, Any] | None = None, *, sym: bool = False,
                lm_quant_bit: int | None = None, embed_bit: int = 16, hqq: bool = False,
                quant_config: str | None = None) -> ExportReport:
    """Write the export of `src` (a path or an opened source) into the existing folder `out`."""
    start = time.perf_counter()
    out = Path(out)
    for name, bits in (("quant_bit", quant_bit), ("lm_quant_bit", quant_bit if lm_quant_bit is None else lm_quant_bit)):
        if bits not in QUANT_BITS:
            raise ConfigError(f"{name.replace('_', ' ')} {bits} is not one of {QUANT_BITS}", field=name)
    if embed_bit not in EMBED_BITS:
        raise ConfigError(f"embed bit {embed_bit} is not one of {EMBED_BITS}", field="embed_bit")
    if quant_block not in QUANT_BLOCKS:
        raise ConfigError(f"quant block {quant_block} is not one of {QUANT_BLOCKS}", field="quant_block")
    if tokenizer not in TOKENIZER_FORMATS:
        raise ConfigError(f"tokenizer format {tokenizer!r} is not one of {TOKENIZER_FORMATS}", field="tokenizer")
    overrides = QuantConfig.load(quant_config) if quant_config is not None else None
    source = src if isinstance(src, Source) else open_source(src)
    model_type = source.config.get("model_type")
    if model_type in ENCODERS:
        if hqq or overrides is not None:
            raise UnsupportedError(f"--hqq and --quant-config are for decoder models, not the embedding model "
                                   f"{model_type!r}", file=source.path, field="hqq" if hqq else "quant_config")
        return _write_encoder(source, out, quant_bit, quant_block, tokenizer, runtime_config, start)
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise UnsupportedError(f"architecture {model_type!r} is not supported (supported: "
                               f"{', '.join(sorted({**ARCHITECTURES, **ENCODERS}))})", file=source.path,
                               field="model_type")
    args = arch.ModelArgs.from_dict(source.config, file=source.path)
    model = arch.Model(args)
    check_shapes(model, source)
    spec = source.tokenizer()
    tied = args.tie_word_embeddings and not separate_embed
    embedding_file = "embeddings_bf16.bin" if embed_bit == 16 else f"embeddings_int{embed_bit}.bin"
    report = ExportReport(str(out), model_type, quant_bit, quant_block, model.parameter_count(source))
    logger.info("exporting %s (%d layers) from %s: %d-bit%s%s, block %d%s, embedding %s", model_type,
                args.num_hidden_layers, source.path, quant_bit, " symmetric" if sym else "", " HQQ" if hqq else "",
                quant_block, f", per-linear settings from {quant_config}" if overrides else "",
                "tied to the lm_head" if tied else f"in {embedding_file}")

    embed_total = 0 if tied else source.tensor(model.embedding()).shape[0] * args.hidden_size
    tables = {name: source.tensor(tensor) for name, tensor in model.extra_tables().items()}
    embed_total += sum(t.shape[0] * t.shape[1] for t in tables.values())
    progress = Progress(report.parameters + embed_total, "export", unit="M params", scale=1e6)
    with open(out / "llm.mnn.weight", "wb") as f:
        writer = WeightWriter(f, quant_bit, quant_block, progress.update, sym, lm_quant_bit, hqq=hqq,
                              quant_config=overrides)
        graph_bytes, lm_head = DecoderGraph(model, source, writer).build(
            f"{source.path}|{quant_bit}|{quant_block}{'|sym' if sym else ''}{'|hqq' if hqq else ''}"
            f"{'|' + quant_config if quant_config else ''}")
    if overrides is not None:
        overrides.check_all_used()
    (out / "llm.mnn").write_bytes(graph_bytes)
    tie = _tied_rows(lm_head, writer.choice(LM_HEAD, lm_head=True).block) if tied else None
    files: dict[str, str] = {}
    if not tied:
        with open(out / embedding_file, "wb") as f:
            if embed_bit == 16:
                write_bf16_embedding(f, source.tensor(model.embedding()), progress.update)
            else:
                tie = write_int_embedding(f, source.tensor(model.embedding()), embed_bit, quant_block, sym,
                                          progress.update, hqq)
        if embed_bit != 16:
            files["embedding_file"] = embedding_file
    for name, table in tables.items():
        with open(out / name, "wb") as f:
            write_bf16_embedding(f, table, progress.update)
    progress.close()

    tokenizer_file = _write_tokenizer(out, tokenizer, spec)
    _write_json(out / "llm_config.json", _llm_config(model, spec, tie))
    _write_json(out / "config.json", {**_RUNTIME_CONFIG, **model.runtime_config(), **(runtime_config or {}),
                                      "tokenizer_file": tokenizer_file, **files})
    return _finish(report, out, start)


def _write_encoder(source: Source, out: Path, quant_bit: int, quant_block: int, tokenizer: str,
                   runtime_config: Mapping[str, Any] | None, start: float) -> ExportReport:
    """An embedding model: llm.mnn ending in `sentence_embeddings`, its word embeddings in
    embeddings_bf16.bin, and llm_config.json as MNN's llmexport writes it for `Embedding`
    (`attention_mask` "int", a template wrapping the text in the tokenizer's special tokens)."""
    arch = ENCODERS[source.config["model_type"]]
    args = arch.ModelArgs.from_dict(source.config, file=source.path, pooling=arch.pooling_of(source.path))
    model = arch.Model(args, source)
    spec = dataclasses.replace(source.tokenizer(), prefix_ids=[])  # the template places [CLS] itself
    report = ExportReport(str(out), args.model_type, quant_bit, quant_block, model.parameter_count(source))
    logger.info("exporting the %s encoder (%d layers, %s pooling) from %s: %d-bit, block %d", args.model_type,
                args.num_hidden_layers, args.pooling, source.path, quant_bit, quant_block)
    table = source.tensor(model.embedding())
    expect_shape(source, table, (args.vocab_size, args.hidden_size))
    progress = Progress(report.parameters + table.shape[0] * args.hidden_size, "export", unit="M params", scale=1e6)
    with open(out / "llm.mnn.weight", "wb") as f:
        writer = WeightWriter(f, quant_bit, quant_block, progress.update)
        graph_bytes = EncoderGraph(model, source, writer).build(f"{source.path}|{quant_bit}|{quant_block}")
    (out / "llm.mnn").write_bytes(graph_bytes)
    with open(out / "embeddings_bf16.bin", "wb") as f:
        write_bf16_embedding(f, table, progress.update)
    progress.close()
    tokenizer_file = _write_tokenizer(out, tokenizer, spec)
    _write_json(out / "llm_config.json", {
        "model_type": args.model_type, "hidden_size": args.hidden_size, "attention_mask": "int",
        "jinja": {"chat_template": arch.chat_template(spec.tokenizer_json)}, "is_visual": False,
        "max_all_tokens": args.max_position_embeddings})
    _write_json(out / "config.json", {**_RUNTIME_CONFIG, **(runtime_config or {}), "tokenizer_file": tokenizer_file})
    return _finish(report, out, start)


def _write_tokenizer(out: Path, kind: str, spec: TokenizerSpec) -> str:
    name = f"tokenizer.{kind}"
    with open(out / name, "wb") as f:
        (write_mtok if kind == "mtok" else write_txt)(f, spec)
    return name


def _finish(report: ExportReport, out: Path, start: float) -> ExportReport:
    report.files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    report.seconds = time.perf_counter() - start
    report.peak_rss_bytes = peak_rss_bytes()
    return report


def peak_rss_bytes() -> int:
    """This process's peak resident size: VmHWM (ru_maxrss on Linux keeps the peak from before an exec)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _tied_rows(lm_head: LinearInfo, quant_block: int) -> dict[str, Any]:
    """`tie_embeddings` for the lm_head's rows; its block is the one the scales hold (MNN's exporter
    records the requested one, which MNN's runtime misreads when it does not divide the width)."""
    start, w_len, a_len = lm_head.external[:3]
    return {"weight_offset": start + lm_head.header_len, "alpha_offset": start + w_len, "alpha_size": a_len,
            "quant_bit": lm_head.bits, "quant_block": 0 if quant_block == 0 else lm_head.block_size,
            "alpha_dtype": "fp16"}


def _llm_config(model: llama.Model, spec: TokenizerSpec, tie: dict[str, Any] | None) -> dict[str, Any]:
    args = model.args
    config: dict[str, Any] = {
        "model_type": args.model_type,
        "hidden_size": int(args.hidden_size),
        "layer_nums": int(args.num_hidden_layers),
        "attention_mask": "float",
        **model.llm_config(),
        "is_mrope": False,
    }
    jinja = {k: v for k, v in (("chat_template", spec.chat_template), ("bos", spec.bos_token),
                               ("eos", spec.eos_token)) if v}
    if jinja:
        config["jinja"] = jinja
    if tie is not None:
        config["tie_embeddings"] = tie
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=4)
