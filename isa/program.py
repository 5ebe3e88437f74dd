"""`Program`: an instruction stream, its DRAM layout and metadata; one versioned binary file.

DRAM layout: the constant blob (weights) sits at address 0; inputs, outputs and
intermediates follow.  Inputs and outputs are dense row-major tensors in their
logical (model) layout: the program's own DMA patterns do any layout change.

File format (little-endian), version 4 (FORMAT_VERSION):

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
import math
import struct
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from stagec.errors import ProgramFormatError

from .config import HardwareConfig
from .instructions import ENCODING, INSTRUCTION_BYTES, DType, Instruction
from .opcodes import decode
from .schema import Checked, Int, ListOf, Maybe, OneOf, Record, Str, check

MAGIC = b"STAGEC\x00\x01"
# 2: REQUANT and RESCALE records of 32 bytes (a bias word), not 16; 3: 16 again, packed; 4: the hw's
# array_subword_packing (a version-3 file's array took one MAC a PE whatever the type)
FORMAT_VERSION = 4


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
        return math.prod(self.shape) * self.dtype.itemsize


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


# Element types of a model's own inputs and outputs (metadata in_dtypes/out_dtypes): the program's
# element types, and bool (held in the program as 0/1 numbers).
MODEL_DTYPES = ("float32", "int32", "int8", "bool")


def _complete_hw(data) -> None:
    HardwareConfig.from_dict(data)
    missing = [f.name for f in fields(HardwareConfig) if f.name not in data]
    if missing:
        raise ProgramFormatError(f"missing key {missing[0]!r}")


# The header of a program file: every key, its type and range.  `Program.from_header` checks a
# header against it before it builds anything; the verifier then checks what the values mean
# together (regions and tensors inside DRAM, the instruction stream).
_ADDRESS = Int(0, 2**32)   # DRAM offsets and sizes (HardwareConfig.dram_bytes is at most 2**32)
_COUNT = Int(0, 2**62)
_SHAPE = ListOf(Int(0, 2**32))
_TENSOR = Record({"name": Str(), "offset": _ADDRESS, "dtype": OneOf(tuple(int(d) for d in DType)), "shape": _SHAPE})
HEADER = Record({
    "hw": Checked(_complete_hw),
    "dram_bytes": _ADDRESS,
    "regions": ListOf(Record({"name": Str(), "kind": OneOf(tuple(k.value for k in RegionKind)),
                              "offset": _ADDRESS, "nbytes": _ADDRESS})),
    "inputs": ListOf(_TENSOR),
    "outputs": ListOf(_TENSOR),
    "layers": ListOf(Record({"name": Str(), "op": Str(), "in_shapes": ListOf(_SHAPE), "out_shape": _SHAPE,
                             "macs": _COUNT, "detail": Str()})),
    # stagec.compile's notes; other keys may hold any JSON value
    "metadata": Record({}, {
        "model": Str(), "note": Str(), "quantize": Maybe(Str()),
        "in_tree": Str(), "out_tree": Str(),   # the model's input and output structure (stagec.frontend.trace)
        "in_dtypes": ListOf(OneOf(MODEL_DTYPES), length_of="inputs"),
        "out_dtypes": ListOf(OneOf(MODEL_DTYPES), length_of="outputs"),
        "activation_bytes": _COUNT, "peak_activation_bytes": _COUNT,
    }, open=True),
    "instructions": Int(0, 2**32),
    "constant_bytes": _ADDRESS,
})


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
        if (problem := layer_id_problem(ids, len(self.layers))) is not None:
            raise ProgramFormatError(problem)
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
        """The Program a file holds, its header checked against HEADER; the instruction stream is
        the verifier's to check (`stagec.load` runs both)."""
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
            h = json.loads(data[16:end], object_pairs_hook=_no_duplicate_keys)
        except ProgramFormatError:
            raise
        except (ValueError, RecursionError) as e:
            raise ProgramFormatError(f"byte offset 16: header is not valid JSON ({e})") from None
        check(HEADER, h, "header")
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
        if (problem := layer_id_problem(ids, len(h["layers"]))) is not None:
            raise ProgramFormatError(f"layer index table at byte offset {pos}: {problem}")
        pos += 4 * n
        return cls._from_checked_header(h, code, ids, data[pos:pos + nconst])

    @classmethod
    def from_header(cls, h: dict, code: np.ndarray, layer_ids: np.ndarray, constants: bytes) -> Program:
        """A Program from a header (as `to_bytes` writes it, checked against HEADER) and its data."""
        check(HEADER, h, "header")
        for key, count in (("instructions", len(code)), ("constant_bytes", len(constants))):
            if h[key] != count:
                raise ProgramFormatError(f"header.{key} = {h[key]}, but there are {count}")
        return cls._from_checked_header(h, code, layer_ids, constants)

    @classmethod
    def _from_checked_header(cls, h: dict, code: np.ndarray, layer_ids: np.ndarray, constants: bytes) -> Program:
        return cls(code=code, layer_ids=layer_ids,
                   layers=tuple(Layer(**d) for d in h["layers"]),
                   inputs=tuple(TensorRef(**d) for d in h["inputs"]),
                   outputs=tuple(TensorRef(**d) for d in h["outputs"]),
                   regions=tuple(Region(**d) for d in h["regions"]),
                   constants=constants, dram_bytes=h["dram_bytes"],
                   hw=HardwareConfig.from_dict(h["hw"]), metadata=h["metadata"])


def layer_id_problem(ids: np.ndarray, n_layers: int) -> str | None:
    """What is wrong with a layer index table (each instruction's layer, -1 for none), if anything."""
    bad = np.flatnonzero((ids < -1) | (ids >= n_layers))
    if not len(bad):
        return None
    i = int(bad[0])
    return f"instruction {i} names layer {ids[i]}; the program has {n_layers} layers (-1: none)"


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for i, k in enumerate(keys) if k in keys[:i])
        raise ProgramFormatError(f"byte offset 16: the header has key {dup!r} twice")
    return dict(pairs)


def _plain(value):
    """Dataclass dict -> JSON-ready (enums to values, tuples to lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value
