"""A long step's chains of row-wise ops run in slabs of rows, so their wide intermediates are
never whole (the MLP's gate, up and their product: three [rows, intermediate] tensors, 144 MiB
at 8,192 rows of the shared model, become three [slab, intermediate] scratch buffers).

A backend opts in with `Backend.row_slab` (rows per slab; 0: never) and an Execution with
`Execution.row_wise` (each output row comes from the same row of each input alone, computed
the same way for any slab of at least `row_slab` rows). Consecutive such commands whose
tensors all have the step's rows as their leading dimension, of a step of at least two slabs,
become one `RowSlabExecution` when some tensor lives only inside them: its inputs and outputs
are whole, the tensors made and read only inside are scratch of one slab's rows. Slabs start at
multiples of `row_slab` (the last one takes the remainder), so a kernel that blocks rows from
its first row sees the blocks of the whole step.
"""
from __future__ import annotations

from typing import Sequence

from .backend import Execution
from .op import Op
from .tensor import Tensor

SLAB_OP = "RowSlabs"


class RowSlabExecution(Execution):
    """The member commands (each with .execution, .inputs, .outputs) run slab by slab; each
    member is resized for a slab before it runs on it. Storages stay put until the next resize,
    so the slabs' tensors are made once, at on_resize: views of the whole inputs' and outputs'
    rows, and the first rows of the scratch buffer that stands for each tensor made inside."""

    def __init__(self, backend, members: list, scratch_of: dict[int, Tensor], rows: int, slab: int):
        super().__init__(backend)
        self.members, self.scratch_of = members, scratch_of  # id of a tensor made inside -> its scratch
        self.bounds = slab_bounds(rows, slab)
        self.slabs: list[list[tuple[Execution, list[Tensor], list[Tensor]]]] = []

    def on_resize(self, inputs, outputs) -> None:
        self.slabs = []
        for start, stop in self.bounds:
            views: dict[int, Tensor] = {}
            for member in self.members:
                for tensor in (*member.inputs, *member.outputs):
                    if id(tensor) not in views:
                        views[id(tensor)] = self._view(tensor, start, stop)
            self.slabs.append([(m.execution, [views[id(t)] for t in m.inputs], [views[id(t)] for t in m.outputs])
                               for m in self.members])

    def _view(self, tensor: Tensor, start: int, stop: int) -> Tensor:
        scratch = self.scratch_of.get(id(tensor))
        storage = tensor.storage[start:stop] if scratch is None else scratch.storage[:stop - start]
        return Tensor(tensor.index, tensor.name, (stop - start, *tensor.shape[1:]), tensor.dtype,
                      backend=tensor.backend, storage=storage)

    def on_execute(self, inputs, outputs) -> None:
        for members in self.slabs:
            for execution, member_inputs, member_outputs in members:
                execution.on_resize(member_inputs, member_outputs)
                execution.on_execute(member_inputs, member_outputs)


def slab_bounds(rows: int, slab: int) -> list[tuple[int, int]]:
    """(start, stop) of each slab: starts at multiples of `slab`, the last taking the remainder."""
    starts = list(range(0, rows - slab + 1, slab)) or [0]
    return [(start, starts[i + 1] if i + 1 < len(starts) else rows) for i, start in enumerate(starts)]


def in_row_slabs(commands: Sequence, keep: set[int], command_type) -> list:
    """`commands` (placed) with each run of row-wise commands that has tensors of its own
    replaced by one command running it in slabs; `keep`: ids of tensors that must stay whole
    (the graph's inputs and outputs); `command_type` makes a command (op, inputs, outputs)."""
    last_reader: dict[int, int] = {}
    for position, command in enumerate(commands):
        for tensor in command.inputs:
            last_reader[id(tensor)] = position
    result, start = [], 0
    while start < len(commands):
        stop = _run_end(commands, start)
        slabbed = _slabbed(commands, start, stop, last_reader, keep, command_type) if stop - start > 1 else None
        result += [slabbed] if slabbed is not None else commands[start:stop]
        start = stop
    return result


def _rows(command) -> int:
    return command.outputs[0].shape[0] if command.outputs and command.outputs[0].shape else 0


def _row_wise(command, rows: int) -> bool:
    backend = command.backend
    slab = backend.row_slab
    return (slab > 0 and rows >= 2 * slab and command.execution.row_wise
            and all(t.host is None and t.backend is backend and t.shape[:1] == (rows,)
                    for t in (*command.inputs, *command.outputs)))


def _run_end(commands: Sequence, start: int) -> int:
    """The end of the run of row-wise commands of one backend and one row count from `start`."""
    rows = _rows(commands[start])
    stop = start
    while (stop < len(commands) and _rows(commands[stop]) == rows and _row_wise(commands[stop], rows)
           and commands[stop].backend is commands[start].backend):
        stop += 1
    return max(stop, start + 1)


def _slabbed(commands: Sequence, start: int, stop: int, last_reader: dict[int, int], keep: set[int],
             command_type):
    """The command running commands[start:stop] in slabs, or None when no tensor lives only inside."""
    members = list(commands[start:stop])
    made = {id(t): t for m in members for t in m.outputs}
    inside = [t for key, t in made.items() if key not in keep and start <= last_reader.get(key, -1) < stop]
    if not inside:
        return None
    inside_ids = {id(t) for t in inside}
    inputs = list({id(t): t for m in members for t in m.inputs if id(t) not in made}.values())
    outputs = [t for key, t in made.items() if key not in inside_ids]
    backend, rows = members[0].backend, _rows(members[0])
    slab = backend.row_slab
    widest = max(end - begin for begin, end in slab_bounds(rows, slab))
    scratch = [Tensor(t.index, t.name, (widest, *t.shape[1:]), t.dtype, backend=backend) for t in inside]
    execution = RowSlabExecution(backend, members, {id(t): s for t, s in zip(inside, scratch)}, rows, slab)
    names = ", ".join(m.op.type for m in members)
    command = command_type(Op(SLAB_OP, f"{names} in slabs of {slab} rows"), inputs, outputs)
    command.backend, command.execution, command.scratch = backend, execution, scratch
    return command
