"""Where the tests find the shared, read-only model: ../shared next to the repository
(override with MNNLLM_SHARED)."""
import os
from pathlib import Path

SHARED = Path(os.environ.get("MNNLLM_SHARED", Path(__file__).resolve().parents[2] / "shared"))
MODEL_DIR = SHARED / "models" / "smollm2-135m-instruct-mnn-q4"
CONFIG = MODEL_DIR / "config.json"
LLM_MNN = MODEL_DIR / "llm.mnn"
REFERENCE = MODEL_DIR / "reference.json"
