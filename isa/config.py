"""The accelerator template: one frozen, validated, JAX-pytree hardware config.

Structural fields (array shape, memory sizes, dataflow) are static pytree
metadata: they decide shapes, so they cannot be traced.  Continuous fields
(bandwidth, clock, energy and area tables) are pytree leaves, so the cost model
can take gradients through them and `vmap` over a batch of configs.

Energy defaults are 45 nm figures from M. Horowitz, "Computing's energy
problem (and what we can do about it)", ISSCC 2014, Fig. 1.1.9: 8-bit multiply
0.2 pJ + add 0.03 pJ; 16-bit float multiply 1.1 pJ + add 0.4 pJ; 32-bit float
multiply 3.7 pJ + add 0.9 pJ; 32 KiB SRAM 64-bit read 20 pJ (2.5 pJ/byte);
DRAM 1.3-2.6 nJ per 64-bit access (the low end, 162.5 pJ/byte, is used).
The DRAM interface is priced per byte/cycle of bandwidth it provides: JEDEC's LPDDR4
(JESD209-4) runs a x16 channel at 3200-4266 MT/s, 6.4-8.5 GB/s, and LPDDR5 (JESD209-5) at
6400 MT/s, 12.8 GB/s, so at the 1 GHz default clock 1 B/cycle is 8 Gb/s, about one lane of a
fast LPDDR interface.  Area: G.-S. Byun et al., "An energy-efficient and high-speed mobile memory
I/O interface using simultaneous bi-directional dual (base+RF)-band signaling", IEEE JSSC 47(1),
2012, measure a 65 nm 8.4 Gb/s mobile-memory baseband transceiver at 0.06 mm^2 (and 11 mW); an
LPDDR4 channel adds to its 16 DQ lanes strobes, command/address, clock and the controller, about
half as many pins again, so 0.1 mm^2 per B/cycle.  Energy per bit moved: M. Kim et al., "A 4266
Mb/s/pin LPDDR4 interface with an asynchronous feedback CTLE ...", IEEE TCAS-II 65(12), 2018,
measure 5.68 pJ/bit for burst writes and 1.83 pJ/bit for reads (65 nm, controller side): inside
energy_pj_per_dram_byte's 162.5 pJ/byte (20 pJ/bit), which charges every byte moved.  The static
power of an idle but ready interface (DLL/PLL, clock tree, receiver bias), 2 mW per B/cycle and
added to the leakage, is the one figure here with no published source found: it is about a
sixth of the 11-15 mW a lane burns at full rate in the two papers above.  Set the two fields for
a real PHY.
Area defaults are in the style of Accelergy's 45 nm tables (a 6T bitcell of
0.35 um^2 plus periphery gives about 0.005 mm^2 per KiB; an fp32-capable MAC PE
about 0.006 mm^2).  A PE that packs four int8 or two bf16 multiplies (array_subword_packing) is
priced as the fp32 one: its 24-bit mantissa multiplier spans nine 8x8 partial-product blocks,
which a multi-precision PE reuses; the operand steering it adds is not priced.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from stagec.errors import ConfigError, shown
from stagec.lazy import after_import

DATAFLOWS = ("weight_stationary", "output_stationary")
DTYPE_MODES = ("int8", "bf16", "fp32")


def _spec(kind, lo=None, hi=None, *, static: bool, doc: str, **kw):
    return field(metadata={"kind": kind, "lo": lo, "hi": hi, "static": static, "doc": doc}, **kw)


@dataclass(frozen=True)
class HardwareConfig:
    """A parameterized edge accelerator: systolic array, scratchpads, vector unit, DMA.

    >>> hw = HardwareConfig(array_rows=32, scratchpad_bytes=384 * 1024)
    >>> hw.array_rows, hw.peak_macs_per_cycle
    (32, 512)
    """

    # --- structure (static) ---
    array_rows: int = _spec(int, 1, 1024, static=True, doc="systolic array rows (reduction dim in WS)", default=16)
    array_cols: int = _spec(int, 1, 1024, static=True, doc="systolic array columns (output channels in WS)", default=16)
    dataflow: str = _spec(DATAFLOWS, static=True, default="weight_stationary",
                          doc="weight_stationary or output_stationary")
    array_subword_packing: bool = _spec(
        bool, static=True, default=True,
        doc="each PE's 32-bit datapath multiplies 32/w operand pairs a cycle along the reduction, w a "
            "MATMUL's operand bits: 4 int8 (a dot-4 PE, as Intel VNNI's VPDPBUSD and Arm's SDOT), 2 bf16; "
            "off: one MAC per PE a cycle whatever its type")
    dtypes: tuple = _spec(DTYPE_MODES, static=True, doc="supported compute modes", default=DTYPE_MODES)
    scratchpad_bytes: int = _spec(int, 64, 2**28, static=True, default=256 * 1024,
                                  doc="input/weight scratchpad capacity")
    scratchpad_banks: int = _spec(int, 1, 64, static=True, doc="scratchpad banks", default=4)
    accumulator_bytes: int = _spec(int, 64, 2**28, static=True, doc="accumulator SRAM capacity", default=64 * 1024)
    accumulator_banks: int = _spec(int, 1, 64, static=True, doc="accumulator banks", default=2)
    vector_lanes: int = _spec(int, 1, 4096, static=True, doc="vector unit lanes, 32 bits each", default=16)
    vector_subword_packing: bool = _spec(
        bool, static=True, default=True,
        doc="each 32-bit vector lane processes 32/w elements per cycle, w the bits of an instruction's widest "
            "operand (sim.costs.lane_bits); off: one element per lane whatever its type")
    dram_bytes: int = _spec(int, 2**16, 2**32, static=True, doc="addressable DRAM", default=2**31)
    # --- continuous (pytree leaves) ---
    dma_bandwidth_bytes_per_cycle: float = _spec(float, 1e-3, 1e6, static=False, default=16.0,
                                                 doc="DRAM bandwidth shared by loads and stores")
    dma_latency_cycles: float = _spec(float, 0.0, 1e6, static=False, default=64.0,
                                      doc="DRAM access latency per DMA instruction")
    clock_hz: float = _spec(float, 1e6, 1e11, static=False, doc="clock frequency", default=1e9)
    vector_cycles_per_transcendental: float = _spec(
        float, 1.0, 1e3, static=False, default=4.0,
        doc="cycles per lane-group of exp, log, rsqrt, recip, tanh, erf, sigmoid")
    energy_pj_per_mac_int8: float = _spec(float, 0.0, 1e6, static=False, doc="int8 MAC energy", default=0.23)
    energy_pj_per_mac_bf16: float = _spec(float, 0.0, 1e6, static=False, doc="bf16 MAC energy", default=1.5)
    energy_pj_per_mac_fp32: float = _spec(float, 0.0, 1e6, static=False, doc="fp32 MAC energy", default=4.6)
    energy_pj_per_vector_op: float = _spec(float, 0.0, 1e6, static=False, default=0.9,
                                           doc="vector-unit op energy per element")
    energy_pj_per_spad_byte: float = _spec(float, 0.0, 1e6, static=False, doc="scratchpad access energy", default=2.5)
    energy_pj_per_acc_byte: float = _spec(float, 0.0, 1e6, static=False, doc="accumulator access energy", default=2.5)
    energy_pj_per_dram_byte: float = _spec(float, 0.0, 1e6, static=False, doc="DRAM access energy", default=162.5)
    leakage_mw: float = _spec(float, 0.0, 1e6, static=False, doc="static power of the whole accelerator", default=5.0)
    area_mm2_per_pe: float = _spec(float, 0.0, 1e3, static=False, doc="area of one processing element", default=0.006)
    area_mm2_per_sram_kib: float = _spec(float, 0.0, 1e3, static=False, default=0.005,
                                         doc="area per KiB of scratchpad or accumulator")
    area_mm2_per_vector_lane: float = _spec(float, 0.0, 1e3, static=False, doc="area of one vector lane", default=0.01)
    area_mm2_per_dram_byte_per_cycle: float = _spec(float, 0.0, 1e3, static=False, default=0.1,
                                                     doc="DRAM interface (PHY and controller) area per byte/cycle "
                                                         "of bandwidth (LPDDR4/5 PHY figures, module doc)")
    dram_phy_mw_per_byte_per_cycle: float = _spec(float, 0.0, 1e6, static=False, default=2.0,
                                                  doc="static power of the DRAM interface per byte/cycle of "
                                                      "bandwidth, on top of leakage_mw (module doc)")
    area_mm2_fixed: float = _spec(float, 0.0, 1e4, static=False, doc="DMA engine, controller and queues", default=0.2)

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, _validate(f, getattr(self, f.name)))
        for mem in ("scratchpad", "accumulator"):
            size, banks = getattr(self, f"{mem}_bytes"), getattr(self, f"{mem}_banks")
            if size % banks:
                raise ConfigError(f"HardwareConfig.{mem}_bytes = {size}: must be a multiple of {mem}_banks = {banks}")

    # --- derived quantities ---
    @property
    def peak_macs_per_cycle(self) -> int:
        """The array's MACs a cycle at 32-bit operands, one a PE (sim.costs.array_macs_per_cycle: a packed type's)."""
        return self.array_rows * self.array_cols

    @property
    def weight_stationary(self) -> bool:
        return self.dataflow == "weight_stationary"

    def replace(self, **changes) -> HardwareConfig:
        return dataclasses.replace(self, **changes)

    # --- serialization ---
    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"a hardware config must be a mapping of field names, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        for key in data:
            if key not in names:
                near = difflib.get_close_matches(str(key), names, n=1)
                hint = f"; did you mean '{near[0]}'?" if near else ""
                raise ConfigError(f"unknown hardware config field '{key}'{hint}")
        return cls(**data)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        if path.suffix in (".yaml", ".yml"):
            path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        else:
            path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> HardwareConfig:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the hardware config ({_reason(e)})") from None
        try:
            data = yaml.load(text, Loader=_StrictYamlLoader) if path.suffix in (".yaml", ".yml") else json.loads(
                text, object_pairs_hook=_no_duplicate_keys)
        except (yaml.YAMLError, json.JSONDecodeError, RecursionError, ConfigError) as e:
            raise ConfigError(f"{path}: {e}") from None
        try:
            return cls.from_dict(data)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None


def _reason(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _validate(f: dataclasses.Field, value):
    """A field's value, checked (a ConfigError names the field) and normalized: ints for integer
    fields, floats for continuous ones; numpy and JAX arrays (traced or batched configs of the
    cost model) pass through continuous fields, if they hold numbers, with concrete values checked."""
    kind, lo, hi = f.metadata["kind"], f.metadata["lo"], f.metadata["hi"]
    where = f"HardwareConfig.{f.name} = {shown(value)}"
    if kind is int:
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            value = int(value)
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
            raise ConfigError(f"{where}: expected an integer in [{lo}, {hi}]")
        return int(value)
    if kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or not lo <= value <= hi:
                raise ConfigError(f"{where}: expected a finite number in [{lo:g}, {hi:g}]")
            return float(value)
        if not _numeric_array(value):
            raise ConfigError(f"{where}: expected a finite number in [{lo:g}, {hi:g}] (or a numeric array)")
        concrete = isinstance(value, (np.ndarray, np.generic))
        if concrete and not (np.isfinite(value) & (lo <= value) & (value <= hi)).all():
            raise ConfigError(f"{where}: expected finite numbers in [{lo:g}, {hi:g}]")
        return value
    if kind is bool:
        if not isinstance(value, (bool, np.bool_)):
            raise ConfigError(f"{where}: expected true or false")
        return bool(value)
    if f.name == "dtypes":
        values = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else None
        if values is None or not values or any(v not in kind for v in values) or len(set(values)) != len(values):
            raise ConfigError(f"{where}: expected a non-empty set of distinct modes from {kind}")
        return tuple(v for v in kind if v in values)
    if not isinstance(value, str) or value not in kind:
        raise ConfigError(f"{where}: expected one of {kind}")
    return value


def _numeric_array(value) -> bool:
    """A numpy or JAX array (or tracer) of integers or floats (a JAX one exists only once JAX is imported)."""
    jax = sys.modules.get("jax")
    if not isinstance(value, (np.ndarray, np.generic, *((jax.Array,) if jax else ()))):
        return False
    # NOTE: jnp's issubdtype, as numpy's does not know bfloat16
    import jax.numpy as jnp
    return bool(jnp.issubdtype(value.dtype, jnp.floating) or jnp.issubdtype(value.dtype, jnp.integer))


_STATIC = tuple(f.name for f in fields(HardwareConfig) if f.metadata["static"])
_LEAVES = tuple(f.name for f in fields(HardwareConfig) if not f.metadata["static"])
FIELD_DOCS = {f.name: f.metadata["doc"] for f in fields(HardwareConfig)}


def _flatten(hw: HardwareConfig):
    return [getattr(hw, n) for n in _LEAVES], tuple(getattr(hw, n) for n in _STATIC)


def _unflatten(static, leaves) -> HardwareConfig:
    # NOTE: bypasses __init__: JAX unflattens with tracers and placeholder objects.
    hw = object.__new__(HardwareConfig)
    for name, value in zip(_STATIC, static, strict=True):
        object.__setattr__(hw, name, value)
    for name, value in zip(_LEAVES, leaves, strict=True):
        object.__setattr__(hw, name, value)
    return hw


# NOTE: registered when something imports JAX: `import stagec.isa` (the CLI, disasm) loads no JAX
after_import("jax", lambda jax: jax.tree_util.register_pytree_node(HardwareConfig, _flatten, _unflatten))


def _no_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ConfigError(f"duplicate hardware config key '{key}'")
        seen[key] = value
    return seen


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (plain YAML silently keeps the last)."""


def _construct_mapping(loader, node, deep=False):
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if dup is not None:
        raise ConfigError(f"duplicate hardware config key '{dup}' (line {node.start_mark.line + 1})")
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
