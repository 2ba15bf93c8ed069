"""The benchmark tests, named as llama-bench names them: pp512, tg128, pp512+tg128, and at a depth
(`-d`, llama-bench's n_depth: tokens already in the KV cache, prefilled untimed) tg128 @ d1024."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BenchTest:
    prompt: int  # tokens prefilled (0 for a pure decode test)
    gen: int  # tokens decoded
    depth: int = 0  # tokens in the KV cache before the timed part (prefilled untimed)

    @property
    def name(self) -> str:
        """llama-bench's test name without the depth: the `test` field of a row."""
        if self.prompt and self.gen:
            return f"pp{self.prompt}+tg{self.gen}"
        return f"pp{self.prompt}" if self.prompt else f"tg{self.gen}"

    @property
    def tokens(self) -> int:
        """The timed tokens: what tok/s divides by."""
        return self.prompt + self.gen

    @property
    def context(self) -> int:
        """The KV tokens a run needs: the depth, then the prompt (a decode test runs one untimed
        token first), then the decoded tokens."""
        return self.depth + max(self.prompt, 1) + self.gen


def label(name: str, depth: int) -> str:
    """The test column as llama-bench prints it: `tg128`, or `tg128 @ d1024` at a depth."""
    return f"{name} @ d{depth}" if depth else name


def plan(prompt: list[int], gen: list[int], prompt_gen: list[tuple[int, int]],
         depths: list[int] | None = None) -> list[BenchTest]:
    """Every test at every depth, depth outermost (llama-bench's order: all tests at d0, then at the next)."""
    tests = [(p, 0) for p in prompt if p > 0] + [(0, n) for n in gen if n > 0] + list(prompt_gen)
    return [BenchTest(p, n, d) for d in depths or [0] for p, n in tests]


def prompt_tokens(count: int, vocab: int, seed: int = 0) -> list[int]:
    """Deterministic ordinary token ids (no special tokens at the ends of the vocabulary)."""
    rng = np.random.default_rng(seed)
    return rng.integers(100, max(101, vocab - 300), size=count).tolist()


def depth_tokens(count: int, vocab: int) -> list[int]:
    """The ids prefilled as the depth: the same in every worker, apart from the tests' own ids."""
    return prompt_tokens(count, vocab, seed=1)


def job_tests(job: dict) -> list[BenchTest]:
    """A job's tests: [prompt, gen] or [prompt, gen, depth] each (worker_protocol)."""
    return [BenchTest(*map(int, t)) for t in job["tests"]]


def row(test: BenchTest, samples: list[float], **extra) -> dict:
    """One result row: the test, its depth, the samples (tok/s) and their mean and spread."""
    return {"test": test.name, "n_prompt": test.prompt, "n_gen": test.gen, "n_depth": test.depth,
            "samples_ts": samples, "avg_ts": statistics.fmean(samples),
            "stddev_ts": statistics.stdev(samples) if len(samples) > 1 else 0.0, **extra}
