"""LoRA adapters: `mnnllm export --lora` merges a PEFT adapter folder; MNN's split
`lora.mnn` runs over the base (Llm.create_lora); models over one base (create(config, base=))
share its packed weights op by op. A tiny random Llama is built with transformers and two
adapters are written here with numpy (no peft): transformers with the adapter merged is the
reference. A/B values sit on a 1/8 grid with scale 2 (or 1), so W + scale * B @ A stays on the
1/64 grid and the 16-bit export holds the merged weights exactly."""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hf_tiny import PROMPTS, Arch, build, greedy, until_stop
from test_export import MNN_SCRIPT

pytest.importorskip("transformers", reason="transformers builds the tiny reference model")
from safetensors.numpy import save_file  # noqa: E402  (a dependency of transformers)

from mnnllm_core.errors import ConfigError, FormatError, MnnllmError, UnsupportedError  # noqa: E402
from mnnllm_core.export import export_model  # noqa: E402
from mnnllm_core.llm.create import create  # noqa: E402

LLAMA = Arch("llama", "llama", {"tie_word_embeddings": False})
ADAPTERS = {  # name -> (r, lora_alpha, target_modules)
    "qv": (4, 8, ["q_proj", "v_proj"]),
    "mlp": (2, 2, r"model\.layers\.\d+\.(mlp\.(gate|down)_proj|self_attn\.o_proj)"),
}
LOGITS_ATOL = 2e-4  # fp32 logits of ours vs transformers on the same (exact) merged weights
REPO = Path(__file__).resolve().parents[1]


def adapter_modules(model, targets) -> list[str]:
    import re
    names = [n[:-len(".weight")] for n, p in model.named_parameters() if p.dim() == 2 and "layers." in n]
    if isinstance(targets, str):
        return [n for n in names if re.fullmatch(targets, n)]
    return [n for n in names if n.split(".")[-1] in targets]


def write_adapter(folder: Path, model, r: int, alpha: int, targets, seed: int, **config) -> dict[str, np.ndarray]:
    """A PEFT-layout adapter folder; returns its tensors."""
    rng = np.random.default_rng(seed)
    params = dict(model.named_parameters())
    tensors = {}
    for module in adapter_modules(model, targets):
        out_features, in_features = params[f"{module}.weight"].shape
        tensors[f"base_model.model.{module}.lora_A.weight"] = rng.integers(-2, 3, (r, in_features)).astype(
            np.float32) / 8
        tensors[f"base_model.model.{module}.lora_B.weight"] = rng.integers(-2, 3, (out_features, r)).astype(
            np.float32) / 8
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": targets, "bias": "none",
         "fan_in_fan_out": False, "use_rslora": False, "modules_to_save": None, **config}))
    return tensors


def merged_model(model, tensors: dict[str, np.ndarray], scale: float):
    """transformers' model with W += scale * B @ A (what PEFT's merge_and_unload computes)."""
    import torch
    merged = copy.deepcopy(model)
    params = dict(merged.named_parameters())
    with torch.no_grad():
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            module = key[len("base_model.model."):-len(".lora_A.weight")]
            b = tensors[key.replace("lora_A", "lora_B")]
            params[f"{module}.weight"] += torch.from_numpy(np.float32(scale) * (b @ a))
    return merged


def engine_config(folder: Path, **keys) -> Path:
    """The export's config.json with fp32 greedy settings, beside the export."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update({"base_dir": str(folder) + "/", "memory": "normal", "sampler_type": "greedy", "thread_num": 1, **keys})
    tag = "".join(f"-{k}-{v}" for k, v in sorted(keys.items()))
    path = folder.parent / f"{folder.name}-engine{tag}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    model = build(LLAMA, root / "hf")
    adapters = {}
    for seed, (name, (r, alpha, targets)) in enumerate(ADAPTERS.items()):
        tensors = write_adapter(root / f"adapter-{name}", model, r, alpha, targets, seed)
        adapters[name] = (root / f"adapter-{name}", tensors, alpha / r)
    export_model(str(root / "hf"), str(root / "base"), quant_bit=16, quant_block=0)
    for name, (folder, _, _) in adapters.items():
        export_model(str(root / "hf"), str(root / f"merged-{name}"), quant_bit=16, quant_block=0, lora=str(folder))
    export_model(str(root / "hf"), str(root / "split-qv"), quant_bit=16, quant_block=0,
                 lora=str(adapters["qv"][0]), lora_split=True)
    return root, model, adapters


def all_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    return llm.forward(ids, all_logits=True)


def transformers_logits(model, ids: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_merged_export_computes_what_transformers_does_with_the_adapter_merged(tiny, name):
    root, model, adapters = tiny
    _, tensors, scale = adapters[name]
    reference = merged_model(model, tensors, scale)
    llm = create(engine_config(root / f"merged-{name}")).load()
    for ids in PROMPTS:
        ours, theirs = all_logits(llm, ids), transformers_logits(reference, ids)
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=LOGITS_ATOL)
        assert np.abs(theirs - transformers_logits(model, ids)).max() > 100 * LOGITS_ATOL  # the adapter matters
    llm.reset()
    expected = greedy(reference, PROMPTS[:1], 8)[0]
    assert until_stop(llm.generate(PROMPTS[0], 8)) == expected


def test_an_adapter_of_fused_weights_merges_and_cannot_be_split(tmp_path):
    """Phi-3 keeps q/k/v and gate/up fused (qkv_proj, gate_up_proj): the merged rows are sliced like the
    base's; MNN's split layout has one op per projection, so a fused adapter is refused there by name."""
    from hf_tiny import ARCHS
    arch = next(a for a in ARCHS if a.name == "phi3")
    model = build(arch, tmp_path / "hf")
    tensors = write_adapter(tmp_path / "adapter", model, 2, 4, ["qkv_proj", "gate_up_proj"], 3)
    export_model(str(tmp_path / "hf"), str(tmp_path / "merged"), quant_bit=16, quant_block=0,
                 lora=str(tmp_path / "adapter"))
    llm = create(engine_config(tmp_path / "merged")).load()
    reference = merged_model(model, tensors, 2.0)
    np.testing.assert_allclose(all_logits(llm, PROMPTS[0]), transformers_logits(reference, PROMPTS[0]), rtol=0,
                               atol=LOGITS_ATOL)
    with pytest.raises(UnsupportedError, match="split layout cannot carry it") as err:
        export_model(str(tmp_path / "hf"), str(tmp_path / "split"), quant_bit=16, quant_block=0,
                     lora=str(tmp_path / "adapter"), lora_split=True)
    assert "qkv_proj" in err.value.field or "gate_up_proj" in err.value.field
    assert not (tmp_path / "split").exists()


def test_the_cli_merges_with_lora(tiny, tmp_path):
    root, _, adapters = tiny
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(root / "hf"), str(tmp_path / "m"),
                           "--quant-bit", "16", "--quant-block", "0", "--lora", str(adapters["qv"][0])],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "m" / "llm.mnn.weight").read_bytes() == (root / "merged-qv" / "llm.mnn.weight").read_bytes()


def op_name(key: str) -> str:
    """The graph's op for a PEFT key: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight ->
    /layers.0/self_attn/q_proj/Linear."""
    _, _, _, _, layer, group, proj = key.split(".")[:7]
    return f"/layers.{layer}/{group}/{proj}/Linear"


def _weights(llm) -> dict[str, object]:
    """op name -> the packed array of its Execution (fp32 weight, or a norm's gamma)."""
    session = llm.module.static_module.session
    out = {}
    for i, (_, execution) in session.pipeline.executions.items():
        array = getattr(execution, "weight", None)
        array = getattr(execution, "gamma", None) if array is None else array
        if array is not None:
            out[session.info.nodes[i].op.name] = array
    return out


def test_adapters_over_one_base_share_its_packed_weights_and_keep_their_own_conversations(tiny):
    root, model, adapters = tiny
    base = create(engine_config(root / "base")).load()
    over = {name: create(engine_config(root / f"merged-{name}"), base=base).load() for name in ADAPTERS}
    ours = _weights(base)
    for name, llm in over.items():
        theirs = _weights(llm)
        assert theirs.keys() == ours.keys()
        adapted = {op_name(key) for key in adapters[name][1]}
        assert adapted and len(adapted) == len(adapters[name][1]) // 2
        for op, array in theirs.items():
            assert (array is ours[op]) == (op not in adapted), op
    ids = PROMPTS[0]
    alone = all_logits(base, ids)
    for name, llm in over.items():  # interleaved steps: each Llm's KV cache is its own
        llm.reset()
        first = llm.forward(ids[:5], all_logits=True)
        base.reset()
        base.forward(ids[:3])
        rest = llm.forward(ids[5:], all_logits=True)
        reference = transformers_logits(merged_model(model, adapters[name][1], adapters[name][2]), ids)
        np.testing.assert_allclose(np.concatenate([first, rest]), reference, rtol=0, atol=LOGITS_ATOL)
    np.testing.assert_allclose(all_logits(base, ids), alone, rtol=0, atol=0)


def test_split_lora_over_the_base_equals_the_merged_export(tiny):
    root, _, adapters = tiny
    base = create(engine_config(root / "split-qv")).load()
    lora = base.create_lora("lora.mnn")
    session = lora.module.static_module.session
    own = {session.info.nodes[i].op.name for i in set(session.readers) - session.from_base}
    pairs = len(adapters["qv"][1]) // 2
    assert len(own) == 2 * pairs and all(name.endswith(("_A", "_B")) for name in own)
    merged = create(engine_config(root / "merged-qv")).load()
    for ids in PROMPTS:
        np.testing.assert_allclose(all_logits(lora, ids), all_logits(merged, ids), rtol=0, atol=LOGITS_ATOL)
    assert np.abs(all_logits(base, PROMPTS[0]) - all_logits(lora, PROMPTS[0])).max() > 100 * LOGITS_ATOL


@pytest.mark.parametrize("backend", ["opencl", "vulkan"])
def test_split_lora_over_the_base_on_a_gpu_backend_equals_the_merged_export(tiny, backend):
    """The shared executions are the GPU backend's own (buffers of the base's runtime, which the LoRA runs on)."""
    from mnnllm_core.plugins.manager import registry
    available, reason = registry().get(backend).is_available()
    if not available:
        pytest.skip(f"{backend}: {reason}")
    root = tiny[0]
    base = create(engine_config(root / "split-qv", backend_type=backend)).load()
    lora = base.create_lora("lora.mnn")
    assert lora.module.static_module.session.from_base
    merged = create(engine_config(root / "merged-qv", backend_type=backend)).load()
    for ids in PROMPTS:
        np.testing.assert_allclose(all_logits(lora, ids), all_logits(merged, ids), rtol=0, atol=1e-3)


# test_export's MNN script, its model swapped for MNN's Llm::create_lora of our lora.mnn over it (the base
# kept alive: the LoRA's module runs on the base module's executions)
MNN_LORA_SCRIPT = MNN_SCRIPT.replace("m.load()\n", 'm.load()\nbase, m = m, m._c_obj.create_lora("lora.mnn")\n').replace(
    "m._c_obj.generate", "m.generate")
assert MNN_LORA_SCRIPT.count("create_lora") == 1 and "_c_obj.generate" not in MNN_LORA_SCRIPT


@pytest.mark.oracle
def test_mnn_runs_our_split_lora_over_our_base_as_transformers_with_the_adapter_merged(tiny):
    """MNN's own Llm::create_lora on our export's lora.mnn: its greedy tokens are transformers' on the
    merged weights."""
    pytest.importorskip("MNN")
    root, model, adapters = tiny
    _, tensors, scale = adapters["qv"]
    expected = greedy(merged_model(model, tensors, scale), PROMPTS, 8)
    done = subprocess.run([sys.executable, "-c", MNN_LORA_SCRIPT, str(root / "split-qv" / "config.json"),
                           json.dumps(PROMPTS), "8"], capture_output=True, text=True, timeout=600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, f"MNN failed (rc {done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}"
    assert [until_stop(t) for t in json.loads(line[7:])] == expected
    assert expected != greedy(model, PROMPTS, 8)


MEMORY_SCRIPT = r"""
import json, sys
from mnnllm_core.llm.create import create

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) * 1024

mode, configs = sys.argv[1], json.loads(sys.argv[2])
before = rss()
base = create(configs[0]).load()
llms = [base]
for config in configs[1:]:
    if mode == "split":
        llms.append(base.create_lora(config))
    else:
        llms.append(create(config, base=base if mode == "shared" else None).load())
for llm in llms:
    llm.forward([1, 40, 80])
print("RSS", json.dumps({"before": before, "after": rss()}))
"""


def _load_rss(mode: str, configs: list) -> int:
    """Bytes of resident memory that loading `configs` (and one forward each) adds, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, mode, json.dumps([str(c) for c in configs])],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RSS ")), None)
    assert line, done.stderr[-2000:]
    figures = json.loads(line[4:])
    return figures["after"] - figures["before"]


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A wider model (hidden 512, 4 layers: ~50 MiB of fp32 weights, 8-bit on disk) so that memory shows
    over Python's own: the base (with the qv adapter's lora.mnn beside it, and the mlp adapter's as
    lora-mlp.mnn), and both adapters merged. Returns the engine configs: base, merged qv, merged mlp."""
    root = tmp_path_factory.mktemp("lora-wide")
    arch = Arch("wide", "llama", {"tie_word_embeddings": False, "hidden_size": 512, "intermediate_size": 1536,
                                  "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                                  "head_dim": 64})
    model = build(arch, root / "hf")
    configs = []
    for seed, (name, (r, alpha, targets)) in enumerate(ADAPTERS.items()):
        adapter = root / f"adapter-{name}"
        write_adapter(adapter, model, r, alpha, targets, seed)
        export_model(str(root / "hf"), str(root / name), quant_bit=8, quant_block=0, lora=str(adapter))
        export_model(str(root / "hf"), str(root / f"split-{name}"), quant_bit=8, quant_block=0, lora=str(adapter),
                     lora_split=True)
        configs.append(engine_config(root / name))
    base = root / "split-qv"
    assert (base / "llm.mnn.weight").read_bytes() == (root / "split-mlp" / "llm.mnn.weight").read_bytes()
    shutil.copy(root / "split-mlp" / "lora.mnn", base / "lora-mlp.mnn")
    return [engine_config(base)] + configs


def test_base_and_two_adapters_take_less_memory_than_three_loads(wide):
    mib = 1 << 20
    separate, shared = _load_rss("separate", wide), _load_rss("shared", wide)
    split = _load_rss("split", [wide[0], "lora.mnn", "lora-mlp.mnn"])
    alone = _load_rss("separate", wide[:1])
    print(f"RSS added by base + 2 adapters (memory normal, fp32 weights): three loads {separate / mib:.1f} MiB, "
          f"merged exports over one base {shared / mib:.1f} MiB, split lora.mnn over the base {split / mib:.1f} MiB; "
          f"the base alone {alone / mib:.1f} MiB")
    assert shared < 0.7 * separate and split < 0.45 * separate and split < 1.2 * alone


# -- bad adapter folders: typed errors naming the file and the field --------------------------------

@pytest.fixture
def adapter(tiny, tmp_path):
    _, model, _ = tiny
    folder = tmp_path / "adapter"
    write_adapter(folder, model, 4, 8, ["q_proj", "v_proj"], 7)
    return folder


def _export_with(tiny, tmp_path, folder, **kw):
    root = tiny[0]
    return export_model(str(root / "hf"), str(tmp_path / "out"), quant_bit=16, quant_block=0, lora=str(folder), **kw)


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    return load_file(str(folder / "adapter_model.safetensors"))


def _config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_missing_lora_b_is_an_error_naming_the_key(tiny, tmp_path, adapter):
    tensors = _tensors(adapter)
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    del tensors[key]
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(FormatError) as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.field == key and err.value.file.endswith("adapter_model.safetensors")


def test_a_rank_other_than_r_is_an_error_naming_the_tensor(tiny, tmp_path, adapter):
    _config(adapter, r=8)
    with pytest.raises(FormatError, match="rank 4.*r 8") as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.field.endswith("lora_A.weight") and err.value.file.endswith("adapter_model.safetensors")


def test_a_shape_the_base_does_not_have_is_an_error_naming_the_module(tiny, tmp_path, adapter):
    tensors = _tensors(adapter)
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    tensors[key] = np.zeros((tensors[key].shape[0] + 1, 4), np.float32)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    with pytest.raises(FormatError, match="of the base is") as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.field == key.replace("lora_B", "lora_A")


def test_a_target_module_without_weights_is_an_error(tiny, tmp_path, adapter):
    _config(adapter, target_modules=["q_proj", "v_proj", "k_proj"])
    with pytest.raises(FormatError, match="'k_proj'.*no lora_A/lora_B") as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.file.endswith("adapter_model.safetensors")


def test_a_key_outside_target_modules_is_an_error(tiny, tmp_path, adapter):
    _config(adapter, target_modules=["q_proj"])
    with pytest.raises(FormatError, match="not among target_modules") as err:
        _export_with(tiny, tmp_path, adapter)
    assert "v_proj" in err.value.field


@pytest.mark.parametrize("changes,error,field", [
    ({"r": 0}, ConfigError, "r"), ({"r": "4"}, ConfigError, "r"), ({"lora_alpha": None}, ConfigError, "lora_alpha"),
    ({"target_modules": []}, ConfigError, "target_modules"), ({"use_dora": True}, UnsupportedError, "use_dora"),
    ({"bias": "lora_only"}, UnsupportedError, "bias"), ({"peft_type": "IA3"}, UnsupportedError, "peft_type")])
def test_a_bad_adapter_config_is_an_error_naming_the_field(tiny, tmp_path, adapter, changes, error, field):
    _config(adapter, **changes)
    with pytest.raises(error) as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.field == field and err.value.file.endswith("adapter_config.json")


def test_missing_adapter_files_are_errors_naming_them(tiny, tmp_path, adapter):
    (adapter / "adapter_model.safetensors").unlink()
    with pytest.raises(FormatError, match="adapter_model.safetensors"):
        _export_with(tiny, tmp_path, adapter)
    (adapter / "adapter_config.json").unlink()
    with pytest.raises(ConfigError) as err:
        _export_with(tiny, tmp_path, adapter)
    assert err.value.file.endswith("adapter_config.json")
    assert not (tmp_path / "out").exists()


def test_the_cli_reports_a_bad_adapter_in_one_line(tiny, tmp_path, adapter):
    _config(adapter, r=8)
    done = subprocess.run([sys.executable, "-m", "mnnllm_core.cli", "export", str(tiny[0] / "hf"), str(tmp_path / "o"),
                           "--lora", str(adapter)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "lora_A.weight" in done.stderr and "adapter_model.safetensors" in done.stderr


def test_a_model_over_a_base_must_share_its_runtime_keys(tiny):
    root = tiny[0]
    base = create(engine_config(root / "base")).load()
    with pytest.raises(ConfigError) as err:
        create(engine_config(root / "merged-qv", memory="low"), base=base).load()
    assert err.value.field == "memory"
    with pytest.raises(MnnllmError, match="not loaded"):
        create(engine_config(root / "merged-qv"), base=create(engine_config(root / "base"))).load()


def test_config_base_on_other_runtimes_is_refused(tiny):
    """Module::Config.base shares executions only on the base's runtimes (their buffers are that device's)."""
    from mnnllm_core.core.backend import ScheduleConfig
    from mnnllm_core.express.module import Module
    from mnnllm_core.express.runtime_manager import RuntimeManager
    from mnnllm_core.express.static_module import Config
    root = tiny[0]
    base = create(engine_config(root / "base")).load()
    other = RuntimeManager.create(ScheduleConfig(backend_type="cpu", thread_num=1))
    with pytest.raises(UnsupportedError, match="base's runtimes") as err:
        Module.load([], [], root / "merged-qv" / "llm.mnn", other, Config(rearrange=True, base=base.module))
    assert err.value.field == "base"
    derived = base.runtime_manager.derive()
    twin = Module.load([], [], root / "merged-qv" / "llm.mnn", derived, Config(rearrange=True, base=base.module))
    assert twin.static_module.session.from_base
    assert derived.kv_meta is not base.runtime_manager.kv_meta
