"""What a loop nest holds in local memory, described once.

Each nest kind has one function listing its buffers (`Buffer`: a name, a memory, bytes, how
many) as expressions of its tile sizes: the conv-shaped nests' in lower.schedule.nest_cost, the vector
unit's elementwise, reduce and gather nests' here.  The mapper evaluates that list over arrays of candidate
tilings (numpy) and keeps the ones whose `local_bytes` fit; the cost model evaluates it over
jax.numpy as its capacity term; the emitter evaluates it for the chosen tiling and `allocate`s
exactly those buffers (lower.codegen.emitter.Emitter.allocate), in their order but for the buffers
aligned to a requant record's 16 bytes, which go first (each a whole number of records but the
last), with no gap between them: every size is a whole number of 4-byte words.  So the footprint
the mapper checked is the allocator's high-water mark, byte for byte.

An epilogue's inputs are held three ways (`EpilogueLayout`, from the node's shapes): a tile
buffer per buffer set ('tile': the input varies over the nest's pixels), a vector over the
output channels ('channel': a bias, per-channel requant records), or one element ('scalar': a
constant of the expression, a per-tensor record).  The channel vectors and scalars share one
buffer, `EPILOGUE_VECTORS`, in which `EpilogueLayout.vector_offsets` places each input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from stagec.errors import LoweringError
from stagec.isa.instructions import REQUANT_RECORD_BYTES, Space
from stagec.isa.opcodes import TRANSCENDENTAL

from ..codegen import tile_expr
from ..graph.graph_ir import Node, OpKind, record_inputs
from .tensors import DTYPE_OF

FP32 = 4
WORD = 4   # every local buffer is a whole number of 4-byte words
EPILOGUE_VECTORS, EPILOGUE_TILES = "epilogue vectors", "epilogue tiles"


@dataclass(frozen=True)
class Buffer:
    """`count` buffers of `nbytes` each in `space` (numbers, or arrays over candidate tilings),
    aligned to `align` bytes."""

    name: str
    space: Space
    nbytes: object
    count: object = 1
    align: int = WORD


def local_bytes(buffers: list[Buffer]) -> tuple[object, object]:
    """(scratchpad, accumulator) bytes of a buffer list: what Emitter.allocate takes, exactly."""
    return tuple(sum((b.count * b.nbytes for b in buffers if b.space == space), 0) for space in (Space.SPAD, Space.ACC))


def words(nbytes, itemsize: int):
    """`nbytes` of elements of `itemsize` bytes, rounded up to whole words (int8 buffers)."""
    return nbytes + (itemsize % WORD != 0) * (-nbytes % WORD)


class Extras(NamedTuple):
    """An epilogue in aggregate, what the mapper and the cost model need of it.

    Its buffers: full output tiles per buffer set (tile inputs and temporaries), 4-byte words per
    output channel (a requant record is RECORD_WORDS), bytes held once whatever the tiling
    (scalars, per-tensor records), whether requant records are among them (EPILOGUE_VECTORS is
    then 16-byte aligned).  Its LOADs: tile inputs per output tile and their bytes per element by
    the tile axes they span (index rows * 4 + cols * 2 + channels: a tile input LOADs the tile's
    extent along those, one element along the rest), channel inputs and their bytes per channel
    (loaded once, or a channel tile per output tile), scalars and their bytes (loaded once).  Its
    VECTOR instructions per output tile, plain and transcendental."""

    tiles: int = 0
    channel_words: int = 0
    fixed_bytes: int = 0
    records: bool = False
    tile_loads: int = 0
    tile_load_bytes: tuple = (0,) * 8
    channel_loads: int = 0
    channel_load_bytes: int = 0
    scalar_loads: int = 0
    scalar_load_bytes: int = 0
    plain: int = 0
    hard: int = 0


NO_EXTRAS = Extras()


@dataclass(frozen=True)
class EpilogueInput:
    """One extra input of an epilogue: 'tile', 'channel' or 'scalar' (module doc); whether it is
    requant records; and along which of the tile's (rows, cols, channels) it has the tile's extent
    (elsewhere it is broadcast, extent 1)."""

    kind: str
    record: bool
    spans: tuple[bool, bool, bool]
    itemsize: int = FP32   # bytes of one element as LOADed (a record: REQUANT_RECORD_BYTES)

    @property
    def item_bytes(self) -> int:
        """Bytes of one element (a record, or any other element in a word of its own)."""
        return REQUANT_RECORD_BYTES if self.record else WORD

    def extent(self, counts) -> tuple[int, int, int]:
        return tuple(c if s else 1 for c, s in zip(counts, self.spans, strict=True))


@dataclass(frozen=True)
class EpilogueLayout:
    """A fused epilogue: its expr, how each extra input is held, and where each step writes
    (tile_expr.plan: over the accumulator tile or a tile input that covers the whole tile, when
    that value dies there)."""

    expr: tuple
    inputs: tuple[EpilogueInput, ...]
    plan: tile_expr.ExprPlan

    @property
    def extras(self) -> Extras:
        kinds = {kind: [i for i in self.inputs if i.kind == kind] for kind in ("tile", "channel", "scalar")}
        span_bytes = [0] * 8
        for i in kinds["tile"]:
            span_bytes[i.spans[0] * 4 + i.spans[1] * 2 + i.spans[2]] += i.itemsize
        return Extras(len(kinds["tile"]) + self.plan.temps, sum(i.item_bytes for i in kinds["channel"]) // WORD,
                      sum(i.item_bytes for i in kinds["scalar"]), any(i.record for i in self.inputs),
                      len(kinds["tile"]), tuple(span_bytes), len(kinds["channel"]),
                      sum(i.itemsize for i in kinds["channel"]), len(kinds["scalar"]),
                      sum(i.itemsize for i in kinds["scalar"]), *self.vector_ops)

    @property
    def vector_ops(self) -> tuple[int, int]:
        """(plain, transcendental) VECTOR instructions per output tile: what lower.codegen.tile_expr emits (a
        select is two, a copy onto itself none), counted by running it on a counting emitter."""
        n, counts = len(self.inputs) + 1, (2, 2, 2)
        tiles = [tile_expr.LocalTile(Space.ACC if k == 0 else Space.SPAD, 64 * k, counts) for k in range(n)]
        temps = [tile_expr.LocalTile(Space.SPAD, 64 * (n + k), counts) for k in range(self.plan.temps)]
        em = _CountingEmitter()
        tile_expr.emit(em, self.expr, self.plan, tiles, temps, counts)
        hard = sum(f in TRANSCENDENTAL for f in em.funcs)
        return len(em.funcs) - hard, hard

    def vector_offsets(self, channels: int, copies: int) -> dict[int, list[int]]:
        """{input: offset of each copy} in EPILOGUE_VECTORS, holding `copies` of each channel input
        over `channels` channels and one of each scalar: records first, so each is 16-byte
        aligned.  Its size is Extras' channel_words * WORD * channels * copies + fixed_bytes."""
        offsets, at = {}, 0
        for records in (True, False):
            for k, i in enumerate(self.inputs):
                if i.record == records and i.kind != "tile":
                    n, size = (copies, channels * i.item_bytes) if i.kind == "channel" else (1, i.item_bytes)
                    offsets[k] = [at + j * size for j in range(n)]
                    at += n * size
        return offsets


class _CountingEmitter:
    """Stands in for lower.codegen.emitter.Emitter: records the function of each VECTOR instruction."""

    def __init__(self):
        self.funcs = []

    def vector(self, func, *args, **kwargs):
        self.funcs.append(func)


# (the output axes a nest tiles as pixels, the output axes of the tile's (rows, cols, channels))
def _nest_axes(node: Node):
    rank = len(node.output.shape)
    if node.op == OpKind.CONV:
        return (0, 2, 3), (2, 3, 1)
    return (rank - 2,), (None, rank - 2, rank - 1)   # a matmul: its batch dims are separate nests


def epilogue_layout(node: Node) -> EpilogueLayout | None:
    """The epilogue of a CONV or MATMUL node (its inputs after x and w), from the graph's shapes;
    None without one."""
    expr = node.attr("epilogue")
    if not expr:
        return None
    out = node.output.shape
    pixel_axes, tile_axes = _nest_axes(node)
    records = record_inputs(expr)
    inputs = []
    for k, v in enumerate(node.inputs[2:]):
        record = k + 1 in records
        shape = v.shape[:-1] if record else v.shape
        padded = (1,) * (len(out) - len(shape)) + tuple(shape)
        kind = ("tile" if any(padded[a] > 1 for a in pixel_axes) else
                "channel" if padded[tile_axes[2]] > 1 else "scalar")
        if record and kind == "tile":
            raise LoweringError(f"{node.name}: requant records vary over rows or columns; they are per channel or "
                                f"per tensor")
        spans = tuple(a is None or padded[a] == out[a] for a in tile_axes)
        item = REQUANT_RECORD_BYTES if record else DTYPE_OF[v.dtype].itemsize
        inputs.append(EpilogueInput(kind, record, spans, item))
    writable = frozenset({0} | {k + 1 for k, i in enumerate(inputs) if i.kind == "tile" and all(i.spans)})
    sizes = [4] + [i.itemsize for i in inputs]   # the accumulator's elements are 4 bytes
    return EpilogueLayout(expr, tuple(inputs), tile_expr.plan(expr, len(inputs) + 1, writable, sizes))


def epilogue_extras(node: Node) -> Extras:
    layout = epilogue_layout(node)
    return layout.extras if layout else NO_EXTRAS


def epilogue_vectors(extras: Extras, channels) -> Buffer:
    """EPILOGUE_VECTORS of an epilogue whose channel inputs span `channels` (all copies)."""
    return Buffer(EPILOGUE_VECTORS, Space.SPAD, extras.channel_words * WORD * channels + extras.fixed_bytes,
                  align=extras.records * REQUANT_RECORD_BYTES + (1 - extras.records) * WORD)


# --- the vector unit's nests (the conv-shaped ones: lower.schedule.nest_cost) ---------------------------
# Each is a frozen record of what its buffers depend on besides the tiling, called with the tiling
# (t0, t1, t2, buffer sets): a lower.codegen.vector.VectorNest holds one, and compares and prints by value.

@dataclass(frozen=True)
class ElementwiseBuffers:
    """An elementwise nest (lower.codegen.vector.Elementwise) over tiles (t0, t1, t2): per buffer set, a
    tile per loaded input and per temporary; once, each requant record and broadcast scalar."""

    loaded: int
    temps: int
    records: int
    scalars: int

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("records", Space.SPAD, REQUANT_RECORD_BYTES, self.records, align=REQUANT_RECORD_BYTES),
                Buffer("scalars", Space.SPAD, WORD, self.scalars),
                Buffer("tiles", Space.SPAD, t0 * t1 * t2 * FP32, bufs * (self.loaded + self.temps))]


@dataclass(frozen=True)
class ReduceBuffers:
    """A reduction (lower.codegen.vector.Reduce) over tiles (t0, t1, t2), t2 reduced: per buffer set, the
    input tile, its int32 copy (int8 sums), and the t0 x t1 sums."""

    widen: bool

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("input", Space.SPAD, t0 * t1 * t2 * FP32, bufs),
                Buffer("widened", Space.SPAD, t0 * t1 * t2 * FP32, bufs * self.widen),
                Buffer("sums", Space.SPAD, t0 * t1 * FP32, bufs)]


@dataclass(frozen=True)
class GatherBuffers:
    """A gather (lower.codegen.vector.Gather) of t0 rows of t2 elements: per buffer set, the indices and
    the rows."""

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("indices", Space.SPAD, t0 * FP32, bufs), Buffer("rows", Space.SPAD, t0 * t2 * FP32, bufs)]
