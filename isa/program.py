"""`Program`: an instruction stream, its DRAM layout and metadata; one versioned binary file.

DRAM layout: the constant blob (weights) sits at address 0; inputs, outputs and
intermediates follow.  Inputs and outputs are dense row-major tensors in their
logical (model) layout: the program's own DMA patterns do any layout change.

File format (little-endian), version 1:

    offset  size  content
    0       8     magic b"STAGEC\\x00\\x01"
    8       4     format version (u32)
    12      4     header length H (u32)
    16      H     header: UTF-8 JSON (hw, dram_bytes, regions, inputs, outputs, layers, metadata,
                  instruction and constant counts)
    ...           zero padding to a multiple of 64
    ...     64*N  instructions (isa.instructions.ENCODING)
    ...     4*N   layer index of each instruction (i32, -1 = none)
    ...     C     constant blob
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from stagec.errors import ProgramFormatError

from .config import HardwareConfig
from .instructions import ENCODING, INSTRUCTION_BYTES, DType, Instruction, decode

MAGIC = b"STAGEC\x00\x01"
FORMAT_VERSION = 1


class RegionKind(enum.StrEnum):
    CONST = "const"
    INPUT = "input"
    OUTPUT = "output"
    INTERMEDIATE = "intermediate"


@dataclass(frozen=True)
class Region:
    """A named byte range of DRAM."""

    name: str
    kind: RegionKind
    offset: int
    nbytes: int

    def __post_init__(self):
        object.__setattr__(self, "kind", RegionKind(self.kind))


@dataclass(frozen=True)
class TensorRef:
    """A dense row-major tensor in DRAM: a program input or output."""

    name: str
    offset: int
    dtype: DType
    shape: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(frozen=True)
class Layer:
    """One graph-IR op of the compiled model, for reports; instructions point at it by index."""

    name: str
    op: str
    in_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    macs: int = 0
    detail: str = ""

    def __post_init__(self):
        object.__setattr__(self, "in_shapes", tuple(tuple(int(d) for d in s) for s in self.in_shapes))
        object.__setattr__(self, "out_shape", tuple(int(d) for d in self.out_shape))


@dataclass(frozen=True, eq=False)
class Program:
    """A compiled program: run it with `stagec.simulate`, save it with `save`."""

    code: np.ndarray
    layer_ids: np.ndarray
    layers: tuple[Layer, ...]
    inputs: tuple[TensorRef, ...]
    outputs: tuple[TensorRef, ...]
    regions: tuple[Region, ...]
    constants: bytes
    dram_bytes: int
    hw: HardwareConfig
    metadata: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    # Derived analyses (verification, simulator plans) keyed by name; not part of the value.
    cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        code = np.ascontiguousarray(self.code, dtype=ENCODING)
        code.flags.writeable = False
        ids = np.ascontiguousarray(self.layer_ids, dtype=np.int32)
        ids.flags.writeable = False
        if ids.shape != code.shape:
            raise ProgramFormatError(f"layer_ids has {ids.shape[0]} entries for {code.shape[0]} instructions")
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "layer_ids", ids)
        object.__setattr__(self, "constants", bytes(self.constants))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def __len__(self) -> int:
        return len(self.code)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Program):
            return NotImplemented
        return (self.code.tobytes() == other.code.tobytes() and np.array_equal(self.layer_ids, other.layer_ids)
                and self._header() == other._header() and self.constants == other.constants)

    __hash__ = None

    def instruction(self, i: int) -> Instruction:
        return decode(self.code[i])

    def __repr__(self) -> str:
        return (f"Program({len(self)} instructions, {len(self.layers)} layers, "
                f"inputs={[(t.name, t.shape) for t in self.inputs]}, "
                f"outputs={[(t.name, t.shape) for t in self.outputs]}, dram_bytes={self.dram_bytes}, "
                f"constants={len(self.constants)} bytes)")

    # --- binary file ---
    def _header(self) -> dict[str, Any]:
        return {
            "hw": self.hw.to_dict(),
            "dram_bytes": self.dram_bytes,
            "regions": [_plain(asdict(r)) for r in self.regions],
            "inputs": [_plain(asdict(t)) for t in self.inputs],
            "outputs": [_plain(asdict(t)) for t in self.outputs],
            "layers": [_plain(asdict(layer)) for layer in self.layers],
            "metadata": dict(self.metadata),
            "instructions": len(self.code),
            "constant_bytes": len(self.constants),
        }

    def to_bytes(self) -> bytes:
        header = json.dumps(self._header(), sort_keys=True).encode()
        head = MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header
        head += b"\0" * (-len(head) % INSTRUCTION_BYTES)
        return head + self.code.tobytes() + self.layer_ids.astype("<i4").tobytes() + self.constants

    def save(self, path: str | Path) -> None:
        """Write one versioned binary file; `stagec.load(path)` reads back an equal Program."""
        Path(path).write_bytes(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> Program:
        if data[:8] != MAGIC:
            raise ProgramFormatError(f"not a stagec program: bytes 0-7 are {data[:8]!r}, expected {MAGIC!r}")
        if len(data) < 16:
            raise ProgramFormatError(f"truncated file: {len(data)} bytes, the fixed header needs 16")
        version, hlen = struct.unpack_from("<II", data, 8)
        if version != FORMAT_VERSION:
            raise ProgramFormatError(f"byte offset 8: format version {version}, this stagec reads {FORMAT_VERSION}")
        end = 16 + hlen
        if len(data) < end:
            raise ProgramFormatError(f"truncated file: header of {hlen} bytes at byte offset 16 ends past {len(data)}")
        try:
            h = json.loads(data[16:end])
        except ValueError as e:
            raise ProgramFormatError(f"byte offset 16: header is not valid JSON ({e})") from None
        pos = end + (-end % INSTRUCTION_BYTES)
        n, nconst = h["instructions"], h["constant_bytes"]
        expect = pos + n * INSTRUCTION_BYTES + 4 * n + nconst
        if len(data) != expect:
            raise ProgramFormatError(
                f"file is {len(data)} bytes; its header promises {n} instructions at byte offset {pos} "
                f"and {nconst} constant bytes, {expect} bytes in all")
        code = np.frombuffer(data, ENCODING, n, pos).copy()
        pos += n * INSTRUCTION_BYTES
        ids = np.frombuffer(data, "<i4", n, pos).astype(np.int32)
        pos += 4 * n
        return cls.from_header(h, code, ids, data[pos:pos + nconst])

    @classmethod
    def from_header(cls, h: dict, code: np.ndarray, layer_ids: np.ndarray, constants: bytes) -> Program:
        return cls(code=code, layer_ids=layer_ids,
                   layers=tuple(Layer(**d) for d in h["layers"]),
                   inputs=tuple(TensorRef(**d) for d in h["inputs"]),
                   outputs=tuple(TensorRef(**d) for d in h["outputs"]),
                   regions=tuple(Region(**d) for d in h["regions"]),
                   constants=constants, dram_bytes=h["dram_bytes"],
                   hw=HardwareConfig.from_dict(h["hw"]), metadata=h.get("metadata", {}))


def _plain(value):
    """Dataclass dict -> JSON-ready (enums to values, tuples to lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value
