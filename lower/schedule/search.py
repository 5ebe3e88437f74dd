"""What the mappers share (the layer mapper, lower.schedule.mapper; the cascade mapper,
lower.schedule.cascade_map): the objectives, the charge per instruction, candidate tile sizes."""

from __future__ import annotations

import numpy as np

from stagec.errors import InputError
from stagec.isa.instructions import MAX_COUNT

OBJECTIVES = ("latency", "energy", "edp", "size")   # what the default mapper may minimize
TUNABLE = OBJECTIVES[:3]   # scalars of cycles and energy (objective_of): what the tuner and co-design descend
INSTRUCTION_CHARGE = 32.0  # cycles the mappers charge an instruction: what the nest latency leaves out, and size
# ... an instruction of a cascade (lower.schedule.cascade_map): software-pipelined, its members' queues
# hide the waits the charge above stands for (calibrated on the zoo: 8 beat 0, 4, 16 and 32 in
# simulated EDP on MobileNetV2 and EfficientNet-B0, fp32 and int8)
CASCADE_INSTRUCTION_CHARGE = 8.0


def tile_sizes(dim: int, cap: int = MAX_COUNT) -> np.ndarray:
    """Candidate tile sizes along one dim: powers of two, the whole dim, and balanced splits, none
    above `cap` (an instruction's iteration counts are 16-bit)."""
    cands = {dim} | {1 << k for k in range(dim.bit_length()) if 1 << k <= dim}
    cands |= {-(-dim // k) for k in range(2, 9)}
    cands = {c for c in cands if c <= cap} or {cap}
    return np.array(sorted(cands), np.int64)


def objective_of(cycles, energy_pj, objective: str):
    """The scalar a mapper or tuner minimizes: cycles, energy (pJ) or their product (EDP).  ("size"
    is cycles x local footprint, lower.schedule.mapper's, not a scalar of cycles and energy.)"""
    if objective == "latency":
        return cycles
    if objective == "energy":
        return energy_pj
    if objective == "edp":
        return cycles * energy_pj
    raise InputError(f"unknown objective {objective!r}; expected one of {TUNABLE}")
