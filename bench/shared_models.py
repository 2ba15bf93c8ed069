"""Where the bench scripts find the shared models: $MNNLLM_SHARED, else `shared/` beside the
repository (a worktree elsewhere sets the variable, as the tests do)."""
import os
from pathlib import Path

SHARED = Path(os.environ.get("MNNLLM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
SHARED_MODEL = SHARED / "models" / "smollm2-135m-instruct-mnn-q4" / "config.json"
