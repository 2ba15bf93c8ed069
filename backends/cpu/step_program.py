"""Bound kernel calls of a replayed step turned into one program (`kernels/program.py`).

The cpu replay's steps are mostly `functools.partial`s of numba kernels with their arrays
(`replay.py`); a run of such calls that this module recognises becomes instructions of one
program, its arrays entered once into the program's typed lists (as flat views of the same
memory, so nothing is copied and every later run sees the buffers the calls saw). A call it
does not recognise (a BLAS product, a numpy op, an on_execute) ends the program; the replay
runs it as it is.
"""
from __future__ import annotations

import hashlib
from functools import cache, partial
from typing import Any, Callable

import numpy as np

from .kernels import program as kernels
from .kernels.activation import mul_silu
from .kernels.attention import (append_attend, append_decode, append_decode_deep, append_decode_deep_part,
                                append_decode_part)
from .kernels.decode_attention import append_attend_stored, append_attend_stored_part
from .kernels.int8_dot import linear as int8_linear, linear_parallel as int8_linear_parallel, linear_part as int8_part
from .kernels.linear import _few_gemv, _few_gemv_parallel, _few_gemv_part, _gemv, _gemv_parallel, _gemv_part
from .kernels.norm import add_normalize_rows, normalize_rows
from .kernels.rope import rope_qk
from .kernels.team import describe


class NotRecognised(Exception):
    """A call whose arrays a program cannot take as they are (not contiguous, another dtype)."""


class StepProgram:
    """Instructions and their arrays, added call by call (`add`), then one bound call (`bound`).
    With a `team` (`kernels/team.py`), a program with linears runs on its threads, each linear's
    rows and each one-token attention's query heads split over them (the instructions then carry
    their part kernels' addresses too). A one-token attention the replay marks `joins` (the next
    KV slot's group of a batched step) after another is marked so in its instruction (JOINS)."""

    def __init__(self, team=None) -> None:
        self.team = team
        self.rows: list[list[int]] = []
        self.scalars: list[float] = []
        # the program's arrays (flat views): float32 values, uint8 codes, float32 alphas, fp16-bit alphas, int64
        self.floats: list[np.ndarray] = []
        self.codes: list[np.ndarray] = []
        self.reals: list[np.ndarray] = []
        self.halves: list[np.ndarray] = []
        self.ints: list[np.ndarray] = []
        self._staged: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}  # the arrays of the call being added

    def __len__(self) -> int:
        return len(self.rows)

    # -- arrays into the typed lists ------------------------------------------------------
    @staticmethod
    def _flat(array: Any, dtype) -> np.ndarray:
        if not isinstance(array, np.ndarray) or array.dtype != dtype or not array.flags.c_contiguous:
            raise NotRecognised(f"{type(array).__name__} {getattr(array, 'dtype', '')}")
        return array.reshape(-1)  # a view: C-contiguous

    def _entry(self, target, array: Any, dtype) -> int:
        """The index `array` (flat) will have in `target` once its call is taken (`add`)."""
        staged = self._staged.setdefault(id(target), (target, []))[1]
        staged.append(self._flat(array, dtype))
        return len(target) + len(staged) - 1

    def f32(self, array: Any) -> int:
        return self._entry(self.floats, array, np.float32)

    def scalar(self, value: float) -> int:
        self.scalars.append(float(value))
        return len(self.scalars) - 1

    # -- calls into instructions ----------------------------------------------------------
    def add(self, call: Callable[[], Any]) -> bool:
        """Append `call` as an instruction; False (nothing added) when it is not one a program runs."""
        if not isinstance(call, partial):
            return False
        make = self._MAKERS.get(call.func)
        if make is None or (call.keywords and call.func is not np.copyto):
            return False
        scalars = len(self.scalars)
        self._staged.clear()
        try:
            row = make(self, *call.args, **call.keywords)
        except NotRecognised:
            del self.scalars[scalars:]
            return False
        for target, staged in self._staged.values():
            target.extend(staged)
        signature = kernels.kernel_signature(row)
        kernel = _kernel_address(call.func, signature) if signature else 0
        part_signature = kernels.part_signature(row) if self.team else None
        part = _kernel_address(_PART_KERNELS[call.func], part_signature) if part_signature else 0
        step, part_step = kernels.step_addresses(row[0], bool(self.team))
        row = row + [0] * (kernels.PART_STEP - len(row)) + [part_step, step, part, kernel]
        if row[0] in kernels.ATTENTIONS and self.rows and self.rows[-1][0] in kernels.ATTENTIONS:
            row[kernels.JOINS] = int(getattr(call, "joins", False))
        self.rows.append(row)
        return True

    def _alphas(self, alphas) -> tuple[list[int], int]:
        """The entries of a GEMV's alphas, and 1 for fp16 bits (in `halves`), 0 for float32 (`reals`)."""
        dtype = alphas[0].dtype
        if dtype == np.uint16:
            return [self._entry(self.halves, a, np.uint16) for a in alphas], 1
        if dtype == np.float32:
            return [self._entry(self.reals, a, np.float32) for a in alphas], 0
        raise NotRecognised(f"alphas of {dtype}")

    def _from_gemv(self, bits, codes, alphas, outs, starts, x, n_blocks, block, threads=0) -> list[int]:
        alpha_rows, halves = self._alphas(alphas)
        return [kernels.GEMV, bits, halves, *[self._entry(self.codes, c, np.uint8) for c in codes], *alpha_rows,
                *[self.f32(o) for o in outs], self._entry(self.ints, starts, np.int64), self.f32(x), n_blocks,
                block, threads]

    def _from_few_gemv(self, bits, codes, alphas, outs, starts, x, n_blocks, block, threads=0) -> list[int]:
        """`_from_gemv`'s fields, then the token rows of x (field 17)."""
        row = self._from_gemv(bits, codes, alphas, outs, starts, x, n_blocks, block, threads)
        return [kernels.FEW_GEMV, *row[1:], x.shape[0]]

    def _from_copy(self, dst, src, casting: str = "same_kind") -> list[int]:
        if dst.size != src.size:
            raise NotRecognised("copy between sizes")
        return [kernels.COPY, self.f32(dst), self.f32(src)]

    def _from_norm(self, x, n, gamma, beta, eps, rms, out) -> list[int]:
        return [kernels.NORM, self.f32(x), n, self.f32(gamma), self.f32(beta), self.scalar(eps), int(rms),
                self.f32(out)]

    def _from_add_norm(self, a, b, n, gamma, beta, eps, rms, total, out) -> list[int]:
        return [kernels.ADD_NORM, self.f32(a), self.f32(b), n, self.f32(gamma), self.f32(beta), self.scalar(eps),
                int(rms), self.f32(total), self.f32(out)]

    def _from_rope(self, q, k, heads, kv_heads, head_dim, rope_dim, cos, sin, q_norm, q_gamma, q_beta, q_eps, q_rms,
              k_norm, k_gamma, k_beta, k_eps, k_rms, q_out, k_out) -> list[int]:
        return [kernels.ROPE, self.f32(q), self.f32(k), heads, kv_heads, head_dim, rope_dim, self.f32(cos),
                self.f32(sin), cos.shape[0], int(q_norm), self.f32(q_gamma), self.f32(q_beta), int(q_rms),
                self.scalar(q_eps), int(k_norm), self.f32(k_gamma), self.f32(k_beta), int(k_rms), self.scalar(k_eps),
                self.f32(q_out), self.f32(k_out)]

    def _from_mul_silu(self, a, b, out) -> list[int]:
        return [kernels.MUL_SILU, self.f32(a), self.f32(b), self.f32(out)]

    def _from_attend(self, q, k, v, keys_t, values, past, scale, sinks, out) -> list[int]:
        tokens, heads, dim = q.shape
        kv_heads, _, capacity = keys_t.shape
        return [kernels.ATTEND, self.f32(q), self.f32(k), self.f32(v), self.f32(keys_t), self.f32(values),
                self._entry(self.ints, past, np.int64), self.scalar(scale), self.f32(sinks), self.f32(out), tokens,
                heads, kv_heads, dim, capacity]

    def _from_int8(self, x, symmetric, scratch, codes, code_sums, alphas, outs, starts, n_blocks, block,
                   threads=0) -> list[int]:
        """`int8_dot.linear`'s arrays: code sums (int16) as fp16-bit entries, see `_int8_step`."""
        alpha_rows, halves = self._alphas(alphas)
        sums = [self._entry(self.halves, s.view(np.uint16), np.uint16) for s in code_sums]
        return [kernels.INT8_LINEAR, halves, x.shape[0], self.f32(x), self._entry(self.codes, scratch, np.uint8),
                *[self._entry(self.codes, c, np.uint8) for c in codes], *sums, *alpha_rows,
                *[self.f32(o) for o in outs], self._entry(self.ints, starts, np.int64), n_blocks, block, threads,
                int(symmetric)]
    def _from_decode(self, q, k, v, keys_t, values, past, scale, sinks, out, threads) -> list[int]:
        """`_from_attend`'s fields (one token), then the threads (field 15)."""
        row = self._from_attend(q, k, v, keys_t, values, past, scale, sinks, out)
        return [kernels.DECODE_ATTEND, *row[1:], threads]

    def _from_stored(self, q, k, v, k_codes, k_scale, k_zero, v_codes, v_scale, v_zero, past, scale, sinks, out,
                     threads) -> list[int]:
        if k_codes.dtype != np.int8 or v_codes.dtype not in (np.int8, np.float32):
            raise NotRecognised(f"stored keys of {k_codes.dtype}, values of {v_codes.dtype}")
        _, heads, dim = q.shape
        kv_heads, capacity, _ = k_codes.shape
        int8_values = v_codes.dtype == np.int8
        codes = [self._entry(self.codes, c.view(np.uint8), np.uint8) for c in (k_codes, v_codes) if c.dtype == np.int8]
        return [kernels.STORED_ATTEND, self.f32(q), self.f32(k), self.f32(v), codes[0], self.f32(k_scale),
                self.f32(k_zero), codes[1] if int8_values else self.f32(v_codes), self.f32(v_scale), self.f32(v_zero),
                self._entry(self.ints, past, np.int64), self.scalar(scale), self.f32(sinks), self.f32(out), heads,
                kv_heads, dim, capacity, threads, int(int8_values)]

    _MAKERS = {_gemv: _from_gemv, _gemv_parallel: _from_gemv, _few_gemv: _from_few_gemv,
               _few_gemv_parallel: _from_few_gemv, np.copyto: _from_copy, normalize_rows: _from_norm,
               add_normalize_rows: _from_add_norm, rope_qk: _from_rope, mul_silu: _from_mul_silu,
               append_attend: _from_attend, append_decode: _from_decode, append_decode_deep: _from_decode,
               append_attend_stored: _from_stored,
               int8_linear: _from_int8, int8_linear_parallel: _from_int8}

    def bound(self) -> Callable[[], Any]:
        """The program as one call (holding the arrays its tables point into)."""
        code = np.asarray(self.rows, np.int64).reshape(-1, kernels.WIDTH)
        arrays = (self.floats, self.codes, self.reals, self.halves, self.ints)
        scalars, tables = np.asarray(self.scalars, np.float64), [kernels.array_table(entries) for entries in arrays]
        if self.team and any(row[0] in kernels.LINEARS for row in self.rows):  # else nothing to split: no wake-up
            descriptor = describe(code, scalars, tables)
            # the way's key: the code and scalars (array addresses live in the tables), so the same
            # step recorded again over other arrays keeps its way (`Team.run`)
            key = hashlib.blake2b(code.tobytes() + scalars.tobytes(), digest_size=16).digest()
            call = partial(self.team.run, descriptor.__array_interface__["data"][0], key)
            call.arrays = (arrays, code, scalars, tables, descriptor)  # type: ignore[attr-defined]
            return call
        call = partial(kernels.run_program, code, scalars, *tables, kernels.runner_address("instruction"))
        call.arrays = arrays  # type: ignore[attr-defined]
        return call


# each kernel's part kernel (a thread team's rank's share of its rows or query heads)
_PART_KERNELS = {_gemv: _gemv_part, _gemv_parallel: _gemv_part, _few_gemv: _few_gemv_part,
                 _few_gemv_parallel: _few_gemv_part, int8_linear: int8_part, int8_linear_parallel: int8_part,
                 append_decode: append_decode_part, append_decode_deep: append_decode_deep_part,
                 append_attend_stored: append_attend_stored_part}


@cache
def _kernel_address(kernel, signature: str) -> int:
    return kernels.kernel_address(kernel, signature)
