"""When cuda_graph.CudaGraphStep captures and replays, checked without CUDA: torch.cuda is
replaced by a stand-in that logs the calls (streams, the capture, replays) and the recorded
step logs whether it ran for real or was captured. What this cannot show (that CUDA captures
these kernels) is for a machine with a GPU: tests/test_torch_replay.py's CUDA test."""
from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("torch", reason="torch is not importable")

from mnnllm_torch import cuda_graph  # noqa: E402


class StandInCuda:
    def __init__(self, fail_capture: bool = False):
        self.log: list[str] = []
        self.capturing = False
        self.fail_capture = fail_capture

    def current_stream(self, device):
        return SimpleNamespace(wait_stream=lambda other: self.log.append("current waits for side"))

    def Stream(self, device):  # noqa: N802 (torch's name)
        return SimpleNamespace(wait_stream=lambda other: self.log.append("side waits for current"))

    @contextlib.contextmanager
    def stream(self, stream):
        self.log.append("on side")
        yield

    def CUDAGraph(self):  # noqa: N802 (torch's name)
        return SimpleNamespace(replay=lambda: self.log.append("replay"))

    @contextlib.contextmanager
    def graph(self, graph):
        self.capturing = True
        try:
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield
        finally:
            self.capturing = False


@pytest.fixture
def cuda(monkeypatch):
    def make(**kw):
        stand_in = StandInCuda(**kw)
        monkeypatch.setattr(cuda_graph, "torch", SimpleNamespace(cuda=stand_in))
        step = cuda_graph.CudaGraphStep(lambda: stand_in.log.append("captured" if stand_in.capturing else "step"),
                                        "cuda:0")
        return stand_in, step
    return make


def _run(stand_in, step, moved: bool) -> list[str]:
    stand_in.log.clear()
    step.run(moved)
    return list(stand_in.log)


def test_the_first_run_is_eager_the_second_captures_then_replays_and_a_move_starts_over(cuda) -> None:
    stand_in, step = cuda()
    assert _run(stand_in, step, moved=True) == ["step"], "a step that runs once (a prefill) is never captured"
    assert _run(stand_in, step, moved=False) == ["side waits for current", "on side", "step",
                                                 "current waits for side", "captured", "replay"]
    assert [_run(stand_in, step, moved=False) for _ in range(3)] == [["replay"]] * 3
    assert _run(stand_in, step, moved=True) == ["step"], "moved tensors: the old graph is dropped"
    assert _run(stand_in, step, moved=False)[-2:] == ["captured", "replay"] and step.captures == 2


def test_a_step_that_cannot_be_captured_runs_eagerly_with_a_warning(cuda, caplog) -> None:
    stand_in, step = cuda(fail_capture=True)
    step.run(moved=True)
    with caplog.at_level(logging.WARNING, logger="mnnllm_torch.cuda_graph"):
        assert _run(stand_in, step, moved=False)[-1] == "step"
    assert "cannot be captured" in caplog.text and step.failed and step.captures == 0
    assert [_run(stand_in, step, moved=False) for _ in range(2)] == [["step"]] * 2
