"""Calls from one compiled kernel to another through the callee's address.

numba links a copy of every kernel a kernel calls into the caller's code and optimizes it all
again; a `prange` kernel's body goes into three more modules (the gufunc and its two wrappers),
each optimized and compiled again. A caller that reaches its callee through the address of the
callee's compiled entry point (`address_of`) compiles only its own code: the program runners
(`program.py`) call every kernel so, and the parallel kernels call their serial spans so (the
GEMM's and the prompt attention's parallel kernels were a sixth of a first run's compile).
The callee is the same compiled code the serial path runs, so the bits are the same.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.dispatcher import Dispatcher
from numba.extending import intrinsic

_addresses: dict[tuple, int] = {}


def address_of(kernel: Dispatcher, signature: types.Signature) -> int:
    """The address of `kernel`'s compiled code for `signature` (loaded from the disk cache, or
    compiled, when this process has not called it with those types yet)."""
    # loaded (or compiled) as a call with these types would be: numba's disk cache keys the
    # entries of calls by their argument types, and a full signature (its return type too) is
    # another key, which missed the entry a compile process had written and compiled it again
    kernel.compile(tuple(signature.args))
    compiled = kernel.get_compile_result(signature)
    if compiled.signature != signature:  # a call through the address would read its arguments wrongly
        raise TypeError(f"{kernel.py_func.__name__} compiled as {compiled.signature}, not {signature}")
    return compiled.library.get_pointer_to_function(compiled.fndesc.llvm_func_name)


def address_for(kernel: Dispatcher, *args) -> int:
    """`address_of` the kernel compiled for these arguments' types (what a call with them runs).
    Looked up by what numba's types depend on (`_kind`): typing the arguments themselves took
    ~30 us a call, more than a short prompt's parallel GEMM gains."""
    key = (kernel, *map(_kind, args))
    address = _addresses.get(key)
    if address is None:
        address = _addresses[key] = address_of(kernel, types.none(*(numba.typeof(arg) for arg in args)))
    return address


def _kind(value) -> tuple | type:
    """What numba's type of `value` depends on: an array's dtype, dimensions, layout, writability
    and alignment; a tuple's members'; another value's Python type."""
    if isinstance(value, np.ndarray):
        flags = value.flags
        return value.dtype.str, value.ndim, flags.c_contiguous, flags.f_contiguous, flags.writeable, flags.aligned
    if isinstance(value, tuple):
        return tuple(map(_kind, value))
    return type(value)


def _function(function_type: types.FunctionType):
    def codegen(context, builder, sig, args):
        function = cgutils.create_struct_proxy(function_type)(context, builder)
        pointer = context.get_value_type(types.voidptr)
        function.jit_addr = builder.inttoptr(args[0], pointer)
        function.c_addr = function.py_addr = ir.Constant(pointer, None)
        return function._getvalue()
    return codegen


def function_at(signature: types.Signature):
    """An intrinsic turning an address from `address_of` into a callable of that signature
    (numba's first-class function type, called by its numba calling convention)."""
    function_type = types.FunctionType(signature)

    @intrinsic
    def function_at(typingctx, address):
        return function_type(types.int64), _function(function_type)

    return function_at


@intrinsic
def function_for(typingctx, address, args):
    """The callable at `address` (`address_for`) of a kernel returning nothing, typed by the tuple
    of the arguments it is to be called with: `function_for(address, args)(*args)`."""
    function_type = types.FunctionType(types.none(*args.types))
    return function_type(types.int64, args), _function(function_type)
