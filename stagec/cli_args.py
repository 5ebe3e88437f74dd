"""What the model commands (`stagec compile`, `run`, `tune`, `codesign`) read from the shell: a
model spec, a hardware config, calibration batches, input arrays, quantities with units.
torch loads only when a model is built."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
from collections import defaultdict
from pathlib import Path

from stagec.errors import InputError

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_POWER_UNITS = {"w": 1.0, "mw": 1e-3, "uw": 1e-6}


def _quantity(units: dict, default: str, what: str):
    def parse(text: str) -> float:
        m = re.fullmatch(r"\s*([0-9.]+(?:e[-+]?\d+)?)\s*([a-zA-Z]*)\s*", text)
        unit = (m.group(2) or default).lower() if m else None
        if m is None or unit not in units:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected a number with a unit of "
                                             f"{', '.join(units)} (e.g. 5ms)")
        value = float(m.group(1)) * units[unit]
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: must be positive")
        return value
    return parse


seconds = _quantity(_TIME_UNITS, "s", "latency")       # "5ms" -> 0.005
watts = _quantity(_POWER_UNITS, "w", "power")          # "0.1" or "100mW" -> 0.1


def hardware(spec: str | None, what: str = "--hw"):
    """--hw: a preset name or a config file; None: the default config."""
    from stagec.isa import HardwareConfig

    from .presets import resolve
    return resolve(spec, what) if spec else HardwareConfig()


def model(spec: str, reduced: bool = False) -> tuple:
    """(model, args, kwargs) from a zoo name, path/to/file.py:factory, or a saved torch.export program (.pt2)."""
    if spec.endswith(".pt2"):
        return _exported(spec)
    from .zoo import load_example
    return load_example(spec, reduced)


def _exported(path: str) -> tuple:
    import torch
    if not Path(path).is_file():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    log = logging.getLogger("torch.export")   # it logs a damaged file's traceback before raising
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        exported = torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - whatever a damaged file makes torch raise is the file's fault
        raise InputError(f"{path}: not a torch.export program ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
                         ) from None
    finally:
        log.setLevel(level)
    args, kwargs = exported.example_inputs or ((), {})
    return exported, tuple(args), dict(kwargs or {})


def calibration(folder: str) -> list:
    """--calibration DIR: a list of batches from its .npy files, in name order.  `NAME.npy` is one
    batch of a single-input model; `NAME.K.npy` is positional input K of batch NAME (several
    inputs: each batch's files share NAME, K = 0, 1, ...)."""
    import numpy as np
    import torch
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"--calibration {folder}: not a folder")
    files = sorted(root.glob("*.npy"))
    if not files:
        raise InputError(f"--calibration {folder}: no .npy files")
    batches: dict[str, dict[int, Path]] = defaultdict(dict)
    for f in files:
        name, _, k = f.stem.rpartition(".")
        key, index = (name, int(k)) if name and k.isdigit() else (f.stem, 0)
        batches[key][index] = f
    out = []
    for name, parts in batches.items():
        if sorted(parts) != list(range(len(parts))):
            raise InputError(f"--calibration {folder}: batch {name!r} has inputs {sorted(parts)}; expected 0..n-1")
        out.append(tuple(torch.from_numpy(np.load(parts[k])) for k in range(len(parts))))
    return out


def arrays(paths: list[str]) -> list:
    """--input files as numpy arrays, each error naming its file."""
    import numpy as np
    out = []
    for p in paths:
        try:
            out.append(np.load(p, allow_pickle=False))
        except ValueError as e:
            raise InputError(f"--input {p}: not a .npy array ({e})") from None
    return out


def leaves(outputs) -> list:
    """A model's outputs (a tensor, tuple, list, dict or ModelOutput) as a flat list of arrays."""
    if isinstance(outputs, dict):
        return [a for v in outputs.values() for a in leaves(v)]
    if isinstance(outputs, (tuple, list)):
        return [a for v in outputs for a in leaves(v)]
    return [outputs]
