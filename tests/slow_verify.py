"""A draft budget for tests where drafting never pays, whatever the host's timing."""
from mnnllm_core.llm.generation.draft_budget import DraftBudget


class SlowVerify(DraftBudget):
    """Every verify step 'costs' 5 plain ones: drafting never pays."""

    def record(self, seconds, tokens, width, guessed=False):
        super().record(5.0 if width > 1 else 1.0, tokens, width, guessed)
