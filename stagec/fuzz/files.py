"""The damaged-files section of a fuzz campaign: a seed picks one of a few valid program files (BASES)
and one random mutation of it (`stagec.fuzz.mutate`); the mutant must be rejected with a StagecError
or run.

    >>> file_record(7)["outcome"]  # doctest: +SKIP
    'rejected:ProgramFormatError'
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

import stagec

from .campaign import describe_exception
from .mutate import mutate_program, run_mutant

# a small config on which the net's layers take many tiles, and no layer is refused
TINY = stagec.HardwareConfig(array_rows=2, array_cols=3, scratchpad_bytes=1024, scratchpad_banks=2,
                             accumulator_bytes=512, accumulator_banks=2, vector_lanes=4)


class Net(nn.Module):
    """A conv, a linear layer, a keyword input and two outputs: every part of a program file."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x, *, bias):
        h = torch.relu(self.conv(x))
        return self.fc(h.flatten(1)) + bias, h.amax(1)


def _net_inputs():
    return (torch.randn(1, 3, 4, 4),), {"bias": torch.randn(1, 5)}


def _encoder_inputs():
    return (torch.randn(1, 6, 16),), {}


# name: (model, example inputs (args, kwargs), compile options)
BASES = {
    "fp32": (Net, _net_inputs, {}),
    "int8": (Net, _net_inputs, {"quantize": "int8"}),
    "tiny": (Net, _net_inputs, {"hw": TINY}),
    # a transformer encoder layer: matmuls of two activations, softmax, layer norms, GELU
    "encoder": (functools.partial(nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, activation="gelu",
                                  batch_first=True), _encoder_inputs, {}),
}


@functools.cache
def base_program(name: str) -> tuple[bytes, list[np.ndarray]]:
    """The program file of base `name` and its inputs, flattened as the file's inputs are."""
    make_model, make_inputs, options = BASES[name]
    torch.manual_seed(0)
    model = make_model().eval()
    args, kwargs = make_inputs()   # int8: calibrated on these inputs alone
    program = stagec.compile(model, args, kwargs=kwargs, **options)
    return program.to_bytes(), [t.numpy() for t in (*args, *kwargs.values())]


def _mutant(seed: int) -> tuple[dict, bytes]:
    """The job's description (its base as "mode", its mutation) and the mutant."""
    base = list(BASES)[seed % len(BASES)]
    what, mutant = mutate_program(base_program(base)[0], np.random.default_rng(seed))
    return {"seed": seed, "mode": base, "mutation": what[:300]}, mutant


def file_description(seed: int) -> dict:
    return _mutant(seed)[0]


def file_record(seed: int) -> dict:
    record, mutant = _mutant(seed)
    try:
        return {**record, "outcome": run_mutant(mutant, base_program(record["mode"])[1])}
    except Exception as e:   # noqa: BLE001 -- anything but a StagecError escaping a damaged file is a bug
        return {**record, "outcome": "crash", "message": describe_exception("mutant", e)}
