"""Everything a backend author uses, in one module: a backend or plugin imports this and
nothing else of mnnllm (a test checks that for `backends/` and `plugins/`).

The contract (names after MNN's Backend.hpp, snake_case):

  RuntimeCreator  entry point: `name`, `static_shapes`, `settings` (which of SETTINGS it
                  honours), `is_available()` (a probe running a tiny kernel), `create()`,
                  `devices()`
  Runtime         device state shared by every session: `op_creators`, `create_backend()`
  Backend         one session's memory and op creation: `alloc` (storage for a tensor),
                  `buffer_key` (which tensors may share storage; reuse is the core's
                  BufferPool), `on_plan_buffers` (a resize's BufferEvents before its first
                  acquire: a pool may place buffers by lifetime), `upload`, `download`; `kv_meta`, the KV cache state of this step;
                  `row_slab` (rows per slab of a long step's row-wise chains; 0: never)
  HostBackend     a Backend whose storage is numpy arrays
  Execution       one op: `on_resize`, `on_execute`, `on_clone` (share packed weights); the
                  replay hooks `replay_steps` (what a replay records), `fused_with` (several
                  ops as one step), `output_may_share` (an input whose storage an
                  elementwise op's output may take), `row_wise` (each output row from the
                  same input row alone: may run in slabs of rows), `before_run` (host work
                  of every replayed run; True when buffers moved), `capturable` (may be
                  captured into a device graph)
  Replay          what `Backend.on_record(commands)` may return: the resized commands of a
                  pipeline wholly on the backend as one step, `run()` each token instead of the
                  per-op loop (runtime hint "replay": false turns it off); the walk is the
                  core's, a backend writes `record(steps)` and `play()`
  Refused         what a creator returns for an op it does not run, with the reason
  RuntimeHints    the runtime hints as a frozen dataclass (read as attributes); a backend
                  with hints of its own subclasses it and names the subclass `hints_type` on
                  its RuntimeCreator and Runtime (the config's `backend_hints` is checked
                  against them: a wrong type or an unknown key is a ConfigError)

An op creator is `creator(backend, inputs, outputs, op) -> Execution | Refused | None`;
`op.type` is MNN's op type name and `op.param` its parameters, decoded once at schedule time
into the dataclasses below (ConvolutionParams for "Convolution", RasterParam for "Raster",
...); `op.weights` (ConvolutionWeights, norm gamma/beta) is there until the creator packs it.

Shared machinery: `KVCache` (one Attention layer's cache bookkeeping; `DeviceKVCache` for a
device cache of token-major rows), KV slots (`kv_meta.batch`, a `BatchMeta` of `SlotRows`: a step
carrying several sequences' rows; an Attention that honours it sets `slot_aware = True` and keeps
each slot's cache in `SlotCaches`, running a slot's rows under `slot_meta`; `group_rows`: a group's
rows as a tensor of their own, for a device kernel written for one sequence; `slot_aware_creator`:
a one-sequence Attention creator made slot-aware; `SlotTwins`: a device Attention's per-slot twins
of its one-sequence Execution over scratch buffers), `runtime.weight_cache` (a `WeightCache`, with `use_mmap`:
the weights a backend packs at load, written once and memory-mapped by later loads),
`file_backed_zeros` (arrays paged to a file, for `kvcache_mmap`), `TuningCache` (kernel variants
timed once per device on the real shapes and kept in a file, MNN's mnn_cachefile.bin; the
runtime hint "gpu_tuning" turns it on), `DeviceCache` (a device's compiled code kept on disk,
e.g. vulkan's pipeline cache), `announce` (a line before a long step, with its expected
duration), `broadcast_strides` and
`walks_contiguously` (views device kernels walk), `norm_tables` / `layernorm_launch` /
`head_norm_tables` (norm tables as device kernels take them), the weights' `scale_zero()`,
`offset_codes()` and `dequantize()` (packing), `MoEExpert.program` (an `ExpertProgram`: the
elementwise steps between an expert's two Linears, from EXPERT_UNARY / EXPERT_BINARY, which a
backend evaluates with its own elementwise kernels). An Attention with a fifth input (sinks) is
refused with SINKS_REFUSAL by a kernel that does not add them to its softmax
(`float_attention_creator(execution, sinks=True)` for one that does). Op-creator prologues:
`linear_creator` (a Convolution's linear weights, or the Refused), `float_attention_creator`,
`layernorm_weights`, `rope_norm_tables`.

Check a backend with `mnnllm test-backend NAME` (the conformance suite, mnnllm_core.testing).
"""
from __future__ import annotations

from .core.allocator import BufferEvent, BufferPool
from .core.backend import (SETTINGS, Backend, BackendConfig, Execution, HostBackend, OpCreator, Refused, Runtime,
                           RuntimeCreator, ScheduleConfig)
from .core.device_cache import DeviceCache
from .core.creators import float_attention_creator, layernorm_weights, linear_creator, rope_norm_tables
from .core.dtypes import FLOAT32, INT32
from .core.expert_program import EXPERT_BINARY, EXPERT_UNARY, ExpertProgram, ExpertStep, step_name
from .core.file_backed import file_backed_zeros
from .core.kv_cache import DeviceKVCache, KVCache
from .core.kv_format import (AttentionMode, KVFormat, dequantize_int8_rows, kv_format, quantize_int8_rows,
                             report_ignored)
from .core.kv_meta import KVMeta
from .core.kv_slots import BatchMeta, SlotCaches, SlotRows, SlotTwins, group_rows, slot_aware_creator, slot_meta
from .core.norm_tables import (HeadNormTables, NormLaunch, NormTables, check_norm_lengths, head_norm_tables,
                               layernorm_launch, norm_tables)
from .core.op import Op
from .core.op_params import (NO_ACTIVATION, RELU, RELU6, SINKS_REFUSAL, AttentionMask, AttentionParams, BinaryParams,
                             CastParams, ConvolutionParams, EltwiseParams, GatherParams, LayerNormParams,
                             LinearAttentionParams, MatMulParams, MoEParams, NormLayout, QKNorm, ReductionParams,
                             ReluParams, RoPEParams, SoftmaxParams, TopKParams, UnaryParams, attention_mask)
from .core.geometry.regions import RasterParam, Region, View
from .core.geometry.strides import broadcast_strides, walks_contiguously
from .core.replay import Replay
from .core.runtime_hints import RuntimeHints
from .core.tensor import Tensor
from .core.tuning_cache import TUNING_HINT, TuningCache
from .core.weights.cache import WeightCache
from .core.weights.formats import (ConvolutionWeight, ConvolutionWeights, FloatWeight, MoEExpert, QuantizedWeight,
                           WeightReader, linear_weights)
from .errors import BackendError, ConfigError, FormatError, KVStateError, MnnllmError, UnsupportedError
from .plugins.hookspecs import hookimpl
from .steps import announce

__all__ = [
    # the contract
    "RuntimeCreator", "Runtime", "Backend", "HostBackend", "Execution", "Refused", "Replay", "OpCreator",
    "RuntimeHints", "ScheduleConfig", "BackendConfig", "SETTINGS", "Tensor", "Op", "hookimpl",
    # op parameters, decoded once at schedule time
    "ConvolutionParams", "LayerNormParams", "NormLayout", "QKNorm", "RoPEParams", "AttentionParams",
    "AttentionMask", "attention_mask", "BinaryParams", "UnaryParams", "EltwiseParams", "ReductionParams",
    "CastParams", "GatherParams", "MatMulParams", "SoftmaxParams", "ReluParams", "TopKParams", "MoEParams", "LinearAttentionParams", "RasterParam", "Region", "View",
    "NO_ACTIVATION", "RELU", "RELU6", "SINKS_REFUSAL",
    # weights
    "ConvolutionWeights", "ConvolutionWeight", "QuantizedWeight", "FloatWeight", "WeightReader", "linear_weights",
    "MoEExpert", "ExpertProgram", "ExpertStep", "EXPERT_UNARY", "EXPERT_BINARY", "step_name",
    # the KV cache; packed weights kept on disk (use_mmap)
    "KVMeta", "KVCache", "DeviceKVCache", "AttentionMode", "KVFormat", "kv_format", "report_ignored",
    "quantize_int8_rows", "dequantize_int8_rows", "WeightCache", "file_backed_zeros",
    # KV slots: a step of several sequences' rows (continuous batching)
    "BatchMeta", "SlotRows", "SlotCaches", "slot_meta", "group_rows", "slot_aware_creator", "SlotTwins",
    # kernel variants tuned once per device (gpu_tuning); compiled code kept per device; long steps said
    "TuningCache", "TUNING_HINT", "DeviceCache", "announce",
    # shared machinery
    "BufferEvent", "BufferPool", "broadcast_strides", "walks_contiguously", "NormTables", "norm_tables", "NormLaunch",
    "layernorm_launch", "check_norm_lengths", "HeadNormTables", "head_norm_tables",
    # op-creator prologues
    "linear_creator", "float_attention_creator", "layernorm_weights", "rope_norm_tables",
    # dtypes and errors
    "FLOAT32", "INT32", "MnnllmError", "BackendError", "ConfigError", "FormatError", "KVStateError",
    "UnsupportedError",
]
