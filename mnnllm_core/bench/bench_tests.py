"""The benchmark tests, named as llama-bench names them: pp512, tg128, pp512+tg128."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BenchTest:
    prompt: int  # tokens prefilled (0 for a pure decode test)
    gen: int  # tokens decoded

    @property
    def name(self) -> str:
        if self.prompt and self.gen:
            return f"pp{self.prompt}+tg{self.gen}"
        return f"pp{self.prompt}" if self.prompt else f"tg{self.gen}"

    @property
    def tokens(self) -> int:
        return self.prompt + self.gen


def plan(prompt: list[int], gen: list[int], prompt_gen: list[tuple[int, int]]) -> list[BenchTest]:
    tests = [BenchTest(p, 0) for p in prompt if p > 0] + [BenchTest(0, n) for n in gen if n > 0]
    return tests + [BenchTest(p, n) for p, n in prompt_gen]


def prompt_tokens(count: int, vocab: int, seed: int = 0) -> list[int]:
    """Deterministic ordinary token ids (no special tokens at the ends of the vocabulary)."""
    rng = np.random.default_rng(seed)
    return rng.integers(100, max(101, vocab - 300), size=count).tolist()
