"""The public API: compile, simulate, load."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stagec.errors import InputError
from stagec.frontend import flatten_inputs, unflatten_outputs
from stagec.isa import Program, verify
from stagec.sim.executor import execute

from .compiler import compile, paused_gc  # noqa: A004
from .report import Report, make_report


def _host(x, ref, i: int) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if tuple(x.shape) != ref.shape:
        raise InputError(f"input {i} ('{ref.name}') has shape {tuple(x.shape)}; the program was compiled for "
                         f"{ref.shape}")
    if not np.can_cast(x.dtype, ref.dtype.numpy, casting="same_kind"):
        raise InputError(f"input {i} ('{ref.name}') has dtype {x.dtype}; the program takes {ref.dtype.numpy}")
    return x.astype(ref.dtype.numpy, copy=False)


def simulate(program: Program, *args, **kwargs) -> tuple[object, Report]:
    """Execute `program` on the simulated accelerator: (outputs, report).

    Inputs and outputs have the compiled model's own structure (positional and keyword
    inputs; a tensor, tuple, dict or ModelOutput back); a program with no recorded structure
    takes its input arrays in order and returns a list.  The program is verified first (a
    failing program raises, it never runs); outputs come out of simulated DRAM after the
    program's stores.

    >>> import torch, stagec
    >>> lin = torch.nn.Linear(8, 4)
    >>> x = torch.randn(2, 8)
    >>> y, report = stagec.simulate(stagec.compile(lin, (x,)), x)
    >>> bool(abs(y - lin(x).detach().numpy()).max() < 1e-5)
    True
    """
    if not isinstance(program, Program):
        raise InputError(f"simulate takes a Program (from stagec.compile or stagec.load), not {type(program).__name__}")
    meta = program.metadata
    inputs = flatten_inputs(meta["in_tree"], args, kwargs) if "in_tree" in meta else list(args)
    if kwargs and "in_tree" not in meta:
        raise InputError("this program records no input structure: pass its inputs positionally")
    if len(inputs) != len(program.inputs):
        raise InputError(f"the program takes {len(program.inputs)} input(s), got {len(inputs)}")
    host = [_host(x, ref, i) for i, (x, ref) in enumerate(zip(inputs, program.inputs, strict=True))]
    with paused_gc():   # a first run's verifier walk, plan and timing allocate as compiling does
        verify(program)
        outputs = execute(program, host)
        if "report" not in program.cache:
            program.cache["report"] = make_report(program)
    if "out_tree" in meta:   # booleans were held as 0/1 numbers
        outputs = unflatten_outputs(meta["out_tree"], [o.astype(dt) for o, dt in zip(outputs, meta["out_dtypes"],
                                                                                      strict=True)])
    return outputs, program.cache["report"]


def load(path: str | Path) -> Program:
    """Read a program file written by `Program.save`; it is verified before it is returned."""
    program = Program.from_bytes(Path(path).read_bytes())
    verify(program)
    return program


__all__ = ["compile", "load", "simulate"]
