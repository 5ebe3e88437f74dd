"""The hardware as the cost model sees it: a HardwareConfig whose structural fields are numbers.

HardwareConfig keeps the array shape, memory sizes and dataflow static (they decide the
compiled program's shapes); co-design needs them continuous.  `HardwarePoint` holds those as
arrays (the dataflow as the probability of weight-stationary; sub-word packing as 1 or 0) next to the config, whose own
leaves (bandwidth, energy and area tables) stay differentiable; every other field reads
through to the config, so `sim.energy`'s formulas take a HardwarePoint as they take a config.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from stagec.isa.config import HardwareConfig
from stagec.sim.energy import area_mm2


@dataclass(frozen=True)
class HardwarePoint:
    array_rows: object
    array_cols: object
    scratchpad_bytes: object
    accumulator_bytes: object
    vector_lanes: object
    weight_stationary: object
    vector_subword_packing: object   # 1 or 0 (HardwareConfig's, a structural field held fixed)
    array_subword_packing: object    # likewise
    config: HardwareConfig

    def __getattr__(self, name):
        # NOTE: only reached for names not defined above; `config` holds default structure (so one
        # compiled function serves every point), hence only its continuous fields are read through.
        if name not in CONTINUOUS:
            raise AttributeError(f"HardwarePoint has no field {name!r}")
        return getattr(self.config, name)


CONTINUOUS = frozenset(f.name for f in fields(HardwareConfig) if not f.metadata["static"])
jax.tree_util.register_dataclass(HardwarePoint, data_fields=[f.name for f in fields(HardwarePoint)], meta_fields=[])


def hardware_point(hw: HardwareConfig) -> HardwarePoint:
    """`hw` with its structural fields as float32 numbers."""
    return HardwarePoint(*(np.float32(v) for v in (hw.array_rows, hw.array_cols, hw.scratchpad_bytes,
                                                    hw.accumulator_bytes, hw.vector_lanes,
                                                    hw.dataflow == "weight_stationary", hw.vector_subword_packing,
                                                    hw.array_subword_packing)),
                         HardwareConfig(**{n: np.float32(getattr(hw, n)) for n in CONTINUOUS}))


def area(hw: HardwarePoint):
    """Total area (mm^2): sim.energy's area table applied to the (possibly fractional) fields."""
    return sum(area_mm2(hw).values())


def as_jnp(point: HardwarePoint) -> HardwarePoint:
    return jax.tree.map(lambda v: jnp.asarray(v, jnp.float32), point)
