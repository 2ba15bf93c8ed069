"""Record and replay, the part every backend shares: a resized pipeline's commands turned into
one step a backend replays token after token (MNN records command buffers for the same
reason; so do CUDA graphs), so that per run only `Replay.run()` is called, never each
Execution's on_execute.

The walk is written here once, from the Execution's replay hooks (backend.py): the commands
in order, each as its `replay_steps`, or with the commands after it as one `fused_with` step;
before every run each `before_run` override (host bookkeeping); a new recording when one says
its buffers moved. A backend says only how a list of steps becomes its replay (`record`) and
how that runs (`play`): an enqueue list on opencl, a command buffer on vulkan, a CUDA graph in
the torch plugin. Values that change per token (the KV length, positions, the mask) live in
buffers that `before_run` or the pipeline's input uploads update, never in what is recorded.
A new shape means a new resize, and the pipeline asks for a new Replay.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

FUSION_SPAN = 4  # how many following commands `Execution.fused_with` is shown


class Replay:
    """The resized `commands` (each with `.execution`, `.inputs`, `.outputs`) of a pipeline
    wholly on one backend, recorded at their first run and replayed by every run.

    `records`: recordings so far; `fused`: at the last recording, how many fusions took in
    1, 2, ... following commands."""

    def __init__(self, commands: Sequence[Any]):
        self.commands = list(commands)
        self.stepped = [c.execution for c in self.commands if c.execution.runs_before]
        self.fused: Counter[int] = Counter()
        self.records = 0

    def run(self) -> None:
        """One run (between the backends' on_execute_begin and _end): the host's part of every
        Execution, a new recording when buffers moved (or none exists yet), then the replay."""
        moved = False
        for execution in self.stepped:
            moved = execution.before_run() or moved
        if moved or not self.records:
            self.record(self.walk())
            self.records += 1
        self.play()

    def walk(self) -> list[Any]:
        """Every command's steps in order, a fusion taken wherever an Execution offers one."""
        self.fused.clear()
        steps: list[Any] = []
        at = 0
        while at < len(self.commands):
            command = self.commands[at]
            fused = command.execution.fused_with(self.commands[at + 1:at + 1 + FUSION_SPAN])
            if fused is None:
                steps += command.execution.replay_steps(command.inputs, command.outputs)
                at += 1
            else:
                taken, joint = fused
                steps += joint
                self.fused[taken] += 1
                at += 1 + taken
        return steps

    @property
    def paired(self) -> int:
        """Commands recorded together with the ones after them at the last recording."""
        return sum(self.fused.values())

    def record(self, steps: list[Any]) -> None:
        """Make the backend's replay of `steps` (what `walk` gave): called at the first run and
        again whenever a `before_run` reported moved buffers."""
        raise NotImplementedError

    def play(self) -> None:
        """Run what `record` made, once."""
        raise NotImplementedError
