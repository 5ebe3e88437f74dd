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

import math
from dataclasses import dataclass
from typing import NamedTuple

from stagec.errors import LoweringError
from stagec.isa.instructions import CLAMP_HEADER_WORDS, REQUANT_RECORD_BYTES, Space
from stagec.isa.opcodes import TRANSCENDENTAL
from stagec.sim.costs import lane_bits

from ..codegen import tile_expr
from ..graph.graph_ir import Node, OpKind, record_words
from .tensors import DTYPE_OF, local_type

FP32 = 4
WORD = 4   # every local buffer is a whole number of 4-byte words
# the element type a CONV/MATMUL sums in: int8 operands in int32, bf16 in float32 (others: their own)
ACCUMULATES = {"int8": "int32", "bfloat16": "float32"}
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


def held_itemsize(itemsize):
    """Bytes an element of `itemsize` takes where the vector unit holds it: bf16 (the only 2-byte
    type) as float32 (tensors.local_type), others as they are; numbers or arrays."""
    return itemsize + 2 * (itemsize == 2)


def words(nbytes, itemsize: int):
    """`nbytes` of elements of `itemsize` bytes, rounded up to whole words (int8 buffers)."""
    return nbytes + (itemsize % WORD != 0) * (-nbytes % WORD)


class Extras(NamedTuple):
    """An epilogue in aggregate, what the mapper and the cost model need of it.

    Its buffers: bytes per output element of its tile buffers per buffer set (tile inputs and
    temporaries, each as wide as the widest value it holds: tile_slot_widths), 4-byte words per
    output channel (a requant record is RECORD_WORDS), bytes held once whatever the tiling
    (scalars, per-tensor records), whether requant records are among them (EPILOGUE_VECTORS is
    then record-aligned).  Its LOADs: tile inputs per output tile and their bytes per element by
    the tile axes they span (index rows * 4 + cols * 2 + channels: a tile input LOADs the tile's
    extent along those, one element along the rest), channel inputs and their bytes per channel
    (loaded once, or a channel tile per output tile), scalars and their bytes (loaded once).  Its
    VECTOR instructions per output tile, plain and transcendental, and the bytes per output element
    they read (their first operands) and write, each at its own element type; `subword`: of those,
    the (plain, transcendental) whose widest operand is 16 bits and the same of 8 bits, whose elements
    a 32-bit lane packs 2 and 4 a cycle (sim.costs.lane_bits, sim.costs.lane_elements)."""

    tile_bytes: int = 0
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
    read_bytes: int = 0
    write_bytes: int = 0
    subword: tuple = (0,) * 4


NO_EXTRAS = Extras()


@dataclass(frozen=True)
class EpilogueInput:
    """One extra input of an epilogue: 'tile', 'channel' or 'scalar' (module doc); whether it is
    requant records; and along which of the tile's (rows, cols, channels) it has the tile's extent
    (elsewhere it is broadcast, extent 1)."""

    kind: str
    record: bool
    spans: tuple[bool, bool, bool]
    itemsize: int = FP32   # bytes of one element as LOADed (a record: all its words, 16 or a table's 256)
    loads: int = 1         # LOADs that bring it (a clamp table's for a group of a grouped conv: two)
    table: bool = False    # a clamp table (isa CLAMP): one record, its header then its biases

    @property
    def item_bytes(self) -> int:
        """Bytes of one element (a record, or any other element in a word of its own)."""
        return self.itemsize if self.record else WORD

    def extent(self, counts) -> tuple[int, int, int]:
        return tuple(c if s else 1 for c, s in zip(counts, self.spans, strict=True))


@dataclass(frozen=True)
class EpilogueLayout:
    """A fused epilogue: its expr, how each extra input is held, where each step writes
    (tile_expr.plan: over the accumulator tile or a tile input that covers the whole tile, when
    that value dies there), and the element type of each of the expr's inputs (the accumulator
    tile's first)."""

    expr: tuple
    inputs: tuple[EpilogueInput, ...]
    plan: tile_expr.ExprPlan
    dtypes: tuple

    @property
    def tile_widths(self) -> list[int]:
        """Bytes per element of each tile buffer: the tile inputs', in order, then the temporaries'."""
        owned = [k + 1 for k, i in enumerate(self.inputs) if i.kind == "tile"]
        return tile_expr.slot_itemsizes(self.expr, self.plan, self.dtypes, owned)

    @property
    def extras(self) -> Extras:
        kinds = {kind: [i for i in self.inputs if i.kind == kind] for kind in ("tile", "channel", "scalar")}
        span_bytes = [0] * 8
        for i in kinds["tile"]:
            span_bytes[i.spans[0] * 4 + i.spans[1] * 2 + i.spans[2]] += i.itemsize
        return Extras(sum(self.tile_widths), sum(i.item_bytes for i in kinds["channel"]) // WORD,
                      sum(i.item_bytes for i in kinds["scalar"]), any(i.record for i in self.inputs),
                      len(kinds["tile"]), tuple(span_bytes), len(kinds["channel"]),
                      sum(i.itemsize for i in kinds["channel"]), sum(i.loads for i in kinds["scalar"]),
                      sum(i.itemsize for i in kinds["scalar"]), *self.vector_work)

    @property
    def vector_work(self) -> tuple:
        """(plain, transcendental) VECTOR instructions per output tile: what lower.codegen.tile_expr emits (a
        select is two, a copy onto itself none), counted by running it on a counting emitter, the
        bytes per element they read (first operands) and write, and Extras.subword."""
        n, counts = len(self.inputs) + 1, (2, 2, 2)
        tiles = [tile_expr.LocalTile(Space.ACC if k == 0 else Space.SPAD, 64 * k, counts, self.dtypes[k])
                 for k in range(n)]
        temps = [tile_expr.LocalTile(Space.SPAD, 64 * (n + k), counts) for k in range(self.plan.temps)]
        em = _CountingEmitter()
        tile_expr.emit(em, self.expr, self.plan, tiles, temps, counts)
        hard = [f in TRANSCENDENTAL for f, _, _, _ in em.ops]
        subword = tuple(sum(h == want for (_, _, _, b), h in zip(em.ops, hard, strict=True) if b == bits)
                        for bits in (16, 8) for want in (False, True))
        return (len(em.ops) - sum(hard), sum(hard), sum(r for _, r, _, _ in em.ops), sum(w for _, _, w, _ in em.ops),
                subword)

    def vector_offsets(self, channels: int, copies: int) -> dict[int, list[int]]:
        """{input: offset of each copy} in EPILOGUE_VECTORS, holding `copies` of each channel input
        over `channels` channels and one of each scalar: records first, so each is record-
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
    """Stands in for lower.codegen.emitter.Emitter: records the function of each VECTOR instruction, the
    bytes of an element it reads (first operand) and writes, and its lane bits (sim.costs.lane_bits)."""

    def __init__(self):
        self.ops = []

    def vector(self, func, *args, dtype, out_dtype=None, **kwargs):
        out = dtype if out_dtype is None else out_dtype
        self.ops.append((func, dtype.itemsize, out.itemsize, int(lane_bits(int(func), int(dtype), int(out)))))


# (the output axes a nest tiles as pixels, the output axes of the tile's (rows, cols, channels))
def _nest_axes(node: Node):
    rank = len(node.output.shape)
    if node.op == OpKind.CONV:
        return (0, 2, 3), (2, 3, 1)
    return (rank - 2,), (None, rank - 2, rank - 1)   # a matmul: its batch dims are separate nests


def clamp_table_part(node: Node, words: int) -> tuple[int, bool]:
    """(biases, split) of a clamp table of `words` words as a nest holds it: all of them, or, where a
    grouped conv (not a depthwise one: a packed one, lower.schedule.pack) runs a nest per group, the
    group's biases, split: LOADed apart from the header (lower.codegen.matrix.Epilogue)."""
    biases, g = words - CLAMP_HEADER_WORDS, node.attr("groups") or 1
    split = (node.op == OpKind.CONV and g > 1 and biases == node.output.shape[1] > 1
             and not (node.inputs[1].shape[1] == 1 and biases == g))
    return (biases // g if split else biases), split


def epilogue_layout(node: Node) -> EpilogueLayout | None:
    """The epilogue of a CONV or MATMUL node (its inputs after x and w), from the graph's shapes;
    None without one.  A clamp table is one record held once (one LOAD; two for a group's)."""
    expr = node.attr("epilogue")
    if not expr:
        return None
    out = node.output.shape
    pixel_axes, tile_axes = _nest_axes(node)
    records = record_words(expr)
    inputs = []
    for k, v in enumerate(node.inputs[2:]):
        record = k + 1 in records
        table = records.get(k + 1) == 0
        shape = () if table else v.shape[:-1] if record else v.shape
        padded = (1,) * (len(out) - len(shape)) + tuple(shape)
        kind = ("tile" if any(padded[a] > 1 for a in pixel_axes) else
                "channel" if padded[tile_axes[2]] > 1 else "scalar")
        if record and kind == "tile":
            raise LoweringError(f"{node.name}: requant records vary over rows or columns; they are per channel or "
                                f"per tensor")
        spans = tuple(a is None or padded[a] == out[a] for a in tile_axes)
        item = DTYPE_OF[v.dtype].itemsize * records.get(k + 1, 1)
        if table:
            biases, split = clamp_table_part(node, math.prod(v.shape))
            item = DTYPE_OF[v.dtype].itemsize * (CLAMP_HEADER_WORDS + biases)
        inputs.append(EpilogueInput(kind, record, spans, item, 2 if table and split else 1, table))
    writable = frozenset({0} | {k + 1 for k, i in enumerate(inputs) if i.kind == "tile" and all(i.spans)})
    x = node.inputs[0].dtype
    dtypes = (DTYPE_OF[ACCUMULATES.get(x, x)], *(local_type(DTYPE_OF[v.dtype]) for v in node.inputs[2:]))
    return EpilogueLayout(expr, tuple(inputs), tile_expr.plan(expr, len(inputs) + 1, writable), dtypes)


def epilogue_extras(node: Node) -> Extras:
    layout = epilogue_layout(node)
    return layout.extras if layout else NO_EXTRAS


def tile_buffers(name: str, tile_bytes, elements, count) -> Buffer:
    """`count` buffers of `elements` tile elements of `tile_bytes` bytes each (several slots: see
    slot_offsets), in whole words (empty where there are no slots)."""
    return Buffer(name, Space.SPAD, words(elements * tile_bytes, tile_bytes), count)


def slot_offsets(widths, elements: int) -> list[int]:
    """Where each slot of `elements` elements of `widths[k]` bytes lies in a buffer of tile_buffers: the
    widest first, so that each is aligned to its elements."""
    offsets, at = [0] * len(widths), 0
    for k in sorted(range(len(widths)), key=lambda k: -widths[k]):
        offsets[k] = at
        at += widths[k] * elements
    return offsets


def epilogue_vectors(extras: Extras, channels) -> Buffer:
    """EPILOGUE_VECTORS of an epilogue whose channel inputs span `channels` (all copies).  With records it
    is a whole number of records long: a cascade holds several, and one that ended between records would
    leave a gap before the next (Emitter.allocate places buffers back to back, largest alignment first)."""
    nbytes = extras.channel_words * WORD * channels + extras.fixed_bytes
    return Buffer(EPILOGUE_VECTORS, Space.SPAD, nbytes + extras.records * (-nbytes % REQUANT_RECORD_BYTES),
                  align=extras.records * REQUANT_RECORD_BYTES + (1 - extras.records) * WORD)


# --- the vector unit's nests (the conv-shaped ones: lower.schedule.nest_cost) ---------------------------
# Each is a frozen record of what its buffers depend on besides the tiling, called with the tiling
# (t0, t1, t2, buffer sets): a lower.codegen.vector.VectorNest holds one, and compares and prints by value.

@dataclass(frozen=True)
class ElementwiseBuffers:
    """An elementwise nest (lower.codegen.vector.Elementwise) over tiles (t0, t1, t2): per buffer set,
    its tile slots (a loaded input's, a temporary's: `tile_bytes` bytes per element over them all);
    once, the records (requant records, lut tables: `records` holds the bytes of each, all multiples
    of 16) and each broadcast scalar."""

    tile_bytes: int
    records: tuple[int, ...]
    scalars: int

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("records", Space.SPAD, sum(self.records), int(bool(self.records)), align=REQUANT_RECORD_BYTES),
                Buffer("scalars", Space.SPAD, WORD, self.scalars),
                tile_buffers("tiles", self.tile_bytes, t0 * t1 * t2, bufs)]


@dataclass(frozen=True)
class ReduceBuffers:
    """A reduction (lower.codegen.vector.Reduce) over tiles (t0, t1, t2), t2 reduced: per buffer set, the
    input tile and the t0 x t1 sums (an int8 sum's RSUM reads int8 and writes int32)."""

    itemsize: int
    out_itemsize: int

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("input", Space.SPAD, words(t0 * t1 * t2 * self.itemsize, self.itemsize), bufs),
                Buffer("sums", Space.SPAD, words(t0 * t1 * self.out_itemsize, self.out_itemsize), bufs)]


@dataclass(frozen=True)
class GatherBuffers:
    """A gather (lower.codegen.vector.Gather) of t0 rows of t2 elements of `itemsize` bytes: per buffer
    set, the int32 indices and the rows."""

    itemsize: int

    def __call__(self, t0, t1, t2, bufs) -> list[Buffer]:
        return [Buffer("indices", Space.SPAD, t0 * WORD, bufs),
                Buffer("rows", Space.SPAD, words(t0 * t2 * self.itemsize, self.itemsize), bufs)]
