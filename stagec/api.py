"""The public API: compile, simulate, load."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from stagec.errors import InputError
from stagec.frontend import flatten_inputs, unflatten_outputs
from stagec.frontend.trace import read_out_tree
from stagec.isa import DType, Program, verify
from stagec.sim.executor import execute

from .compiler import compile  # noqa: A004
from .pipeline import garbage_collection
from .program_file import check_metadata, load
from .report import Report, make_report

# The model-level element type of a program input whose program records none (metadata in_dtypes).
_MODEL_DTYPE = {DType.F32: "float32", DType.BF16: "bfloat16", DType.I8: "int8", DType.I32: "int32"}


def _to_program_dtype(array: np.ndarray, dtype: DType) -> np.ndarray:
    """A model input as the program holds it: booleans as 0/1 numbers, bfloat16 as its bit pattern."""
    if dtype == DType.BF16:
        return array.astype(jnp.bfloat16, copy=False).view(np.uint16)
    return array.astype(dtype.numpy, copy=False)


def program_inputs(program: Program, args, kwargs) -> list[np.ndarray]:
    """A model's inputs as the arrays `sim.executor.execute` takes: flattened in the traced order, each
    checked against the program's input and held in its element type (InputError naming one that is not)."""
    dtypes = program.metadata.get("in_dtypes") or [_MODEL_DTYPE[ref.dtype] for ref in program.inputs]
    inputs = flatten_inputs(program.metadata.get("in_tree"), args, kwargs,
                            [(dt, ref.shape) for dt, ref in zip(dtypes, program.inputs, strict=True)])
    return [_to_program_dtype(x, ref.dtype) for x, ref in zip(inputs, program.inputs, strict=True)]


def simulate(program: Program, *args, **kwargs) -> tuple[object, Report]:
    """Execute `program` on the simulated accelerator: (outputs, report).

    Inputs and outputs have the compiled model's own structure (positional and keyword
    inputs; a tensor, tuple, dict or ModelOutput back); a program with no recorded structure
    takes its input arrays in order and returns a list.  Each input must have the shape the model
    was traced with and the same kind of number (bool, integer or floating-point: nothing is
    converted silently across kinds; int64 values must fit the program's int32).  The program is
    verified first (a failing program raises, it never runs); outputs come out of simulated DRAM
    after the program's stores.

    >>> import torch, stagec
    >>> lin = torch.nn.Linear(8, 4)
    >>> x = torch.randn(2, 8)
    >>> y, report = stagec.simulate(stagec.compile(lin, (x,)), x)
    >>> bool(abs(y - lin(x).detach().numpy()).max() < 1e-5)
    True
    """
    if not isinstance(program, Program):
        raise InputError(f"simulate takes a Program (from stagec.compile or stagec.load), not {type(program).__name__}")
    check_metadata(program)
    meta = program.metadata
    host = program_inputs(program, args, kwargs)
    if "out_tree" in meta:
        read_out_tree(meta["out_tree"])   # a structure torch cannot rebuild fails before the run, not after
    with garbage_collection(False):   # a first run's verifier walk, plan and timing allocate as compiling does
        verify(program)
        outputs = execute(program, host)
        if "report" not in program.cache:
            program.cache["report"] = make_report(program)
    if "out_dtypes" in meta:   # booleans were held as 0/1 numbers
        outputs = [o.astype(dt) for o, dt in zip(outputs, meta["out_dtypes"], strict=True)]
    if "out_tree" in meta:
        outputs = unflatten_outputs(meta["out_tree"], outputs)
    return outputs, program.cache["report"]


__all__ = ["compile", "load", "simulate"]
