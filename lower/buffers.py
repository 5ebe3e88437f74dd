"""What a loop nest holds in local memory, described once.

Each nest kind has one function listing its buffers (`Buffer`: a name, a memory, bytes, how
many) as expressions of its tile sizes.  The mapper evaluates that list over arrays of candidate
tilings (numpy) and keeps the ones whose `local_bytes` fit; the cost model evaluates it over
jax.numpy as its capacity term; the emitter evaluates it for the chosen tiling and `allocate`s
exactly those buffers (lower.emitter.Emitter.allocate), in their order but for the buffers
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

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import REQUANT_RECORD_BYTES, Space

from . import tile_expr
from .graph_ir import Node, OpKind, record_inputs

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
    return nbytes if itemsize % WORD == 0 else -(-nbytes // WORD) * WORD


class Extras(NamedTuple):
    """An epilogue's buffers in aggregate (what the mapper and the cost model need): full output
    tiles per buffer set (tile inputs and temporaries), 4-byte words per output channel (a requant
    record is RECORD_WORDS), bytes held once whatever the tiling (scalars, per-tensor records), and
    whether requant records are among them (EPILOGUE_VECTORS is then 16-byte aligned)."""

    tiles: int = 0
    channel_words: int = 0
    fixed_bytes: int = 0
    records: bool = False


NO_EXTRAS = Extras()


@dataclass(frozen=True)
class EpilogueInput:
    """One extra input of an epilogue: 'tile', 'channel' or 'scalar' (module doc); whether it is
    requant records; and along which of the tile's (rows, cols, channels) it has the tile's extent
    (elsewhere it is broadcast, extent 1)."""

    kind: str
    record: bool
    spans: tuple[bool, bool, bool]

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
        return Extras(sum(i.kind == "tile" for i in self.inputs) + self.plan.temps,
                      sum(i.item_bytes for i in self.inputs if i.kind == "channel") // WORD,
                      sum(i.item_bytes for i in self.inputs if i.kind == "scalar"),
                      any(i.record for i in self.inputs))

    @property
    def tile_loads(self) -> int:
        """Inputs LOADed per output tile."""
        return sum(i.kind == "tile" for i in self.inputs)

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
        inputs.append(EpilogueInput(kind, record, tuple(a is None or padded[a] == out[a] for a in tile_axes)))
    writable = frozenset({0} | {k + 1 for k, i in enumerate(inputs) if i.kind == "tile" and all(i.spans)})
    return EpilogueLayout(expr, tuple(inputs), tile_expr.plan(expr, len(inputs) + 1, writable))


def epilogue_extras(node: Node) -> Extras:
    layout = epilogue_layout(node)
    return layout.extras if layout else NO_EXTRAS


# --- the nests ---------------------------------------------------------------------------------

def tile_line(p, th, tw):
    """(B's columns, row pitch) of a transposed tile of `p` (a ConvProblem or what has its stride,
    dilation and kw): the line from the tile's first pixel to its last, the columns between its rows
    (halo columns no output reads) computed and dropped.  Works on arrays of candidates."""
    pitch = p.stride[0] // p.stride[1] * ((tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1)
    return (th - 1) * pitch + tw, pitch


def one_spatial_tile(p, th, tw, stacked=0, xp=np):
    """Whether a matrix-unit nest has one spatial tile: it then loads its input halo once (one
    buffer, when the channels are not tiled either) and visits each output-channel tile once, so
    its per-channel epilogue vectors are loaded a tile at a time, double-buffered like the weights,
    instead of whole.  Works on arrays of candidates."""
    return (p.n == 1) & (th >= p.oh) & (tw >= p.ow) & (xp.asarray(stacked) == 0)


def halo_buffers(p, th, tw, tc, stacked, bufs, xp=np):
    """Input-halo buffers of a matrix-unit nest: one where the halo is loaded once (one spatial
    tile, the channels whole), else `bufs`.  Works on arrays of candidates."""
    return xp.where(one_spatial_tile(p, th, tw, stacked, xp) & (tc >= p.c), 1, bufs)


def _halo(p, th, tw):
    return ((th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1,
            (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1)


def _epilogue_vectors(extras: Extras, channels) -> Buffer:
    """EPILOGUE_VECTORS of an epilogue whose channel inputs span `channels` (all copies)."""
    return Buffer(EPILOGUE_VECTORS, Space.SPAD, extras.channel_words * WORD * channels + extras.fixed_bytes,
                  align=REQUANT_RECORD_BYTES if extras.records else WORD)


def conv_buffers(p, th, tw, to, tc, double_buffer, resident, extras: Extras, single_acc=0, transposed=0, stacked=0,
                 xp=np) -> list[Buffer]:
    """A matrix-unit nest (lower.matrix.emit_conv): input halos, weights (tiles, or all of them
    resident), the epilogue's vectors (whole, or a channel tile per buffer set in a nest of one
    spatial tile) and tiles, the result tile of `single_acc` or the turned tiles of `transposed`;
    accumulator tiles (one with `single_acc`), a transposed tile's as wide as its line."""
    bufs = 1 + double_buffer
    acc_bufs = bufs - double_buffer * single_acc
    ih, iw = _halo(p, th, tw)
    one = one_spatial_tile(p, th, tw, stacked, xp)
    out_tile = th * tw * to * FP32
    halo_rows = stacked * th * p.kh + (1 - stacked) * ih   # stacked: each output row's kernel rows
    return [
        Buffer("halo", Space.SPAD, words(halo_rows * iw * tc * p.itemsize, p.itemsize),
               halo_buffers(p, th, tw, tc, stacked, bufs, xp)),
        Buffer("weights", Space.SPAD, words(p.kh * p.kw * xp.where(resident, p.c * p.o, tc * to) * p.itemsize,
                                            p.itemsize), xp.where(resident, 1, bufs)),
        _epilogue_vectors(extras, xp.where(one, bufs * to, p.o)),
        Buffer(EPILOGUE_TILES, Space.SPAD, out_tile, bufs * extras.tiles),
        Buffer("result", Space.SPAD, out_tile, single_acc * (1 - transposed)),
        Buffer("turned", Space.SPAD, out_tile, transposed * acc_bufs),
        Buffer("accumulator", Space.ACC,
               (transposed * tile_line(p, th, tw)[0] + (1 - transposed) * th * tw) * to * FP32, acc_bufs),
    ]


def window_buffers(p, th, tw, to, double_buffer, extras: Extras, weighted: bool, xp=np) -> list[Buffer]:
    """A depthwise or pooling nest on the vector unit (lower.window.emit_window): input halos and
    (depthwise) weights, each with an int32 copy where int8 sums widen them, the epilogue's vectors
    and tiles; accumulator tiles (int32 or float32, or int8 for an int8 max pool)."""
    bufs = 1 + double_buffer
    ih, iw = _halo(p, th, tw)
    taps = p.kh * p.kw
    acc_item = FP32 if p.widened else p.itemsize
    return [
        Buffer("halo", Space.SPAD, words(ih * iw * to * p.itemsize, p.itemsize), bufs),
        Buffer("widened halo", Space.SPAD, ih * iw * to * FP32, bufs * p.widened),
        Buffer("weights", Space.SPAD, words(taps * to * p.itemsize, p.itemsize), bufs * weighted),
        Buffer("widened weights", Space.SPAD, taps * to * FP32, bufs * weighted * p.widened),
        _epilogue_vectors(extras, p.o),
        Buffer(EPILOGUE_TILES, Space.SPAD, th * tw * to * FP32, bufs * extras.tiles),
        Buffer("accumulator", Space.ACC, words(th * tw * to * acc_item, acc_item), bufs),
    ]


def elementwise_buffers(loaded: int, temps: int, records: int, scalars: int):
    """An elementwise nest (lower.vector.emit_elementwise) over tiles (t0, t1, t2): per buffer set,
    a tile per loaded input and per temporary; once, each requant record and broadcast scalar."""
    def buffers(t0, t1, t2, bufs):
        return [Buffer("records", Space.SPAD, REQUANT_RECORD_BYTES, records, align=REQUANT_RECORD_BYTES),
                Buffer("scalars", Space.SPAD, WORD, scalars),
                Buffer("tiles", Space.SPAD, t0 * t1 * t2 * FP32, bufs * (loaded + temps))]
    return buffers


def reduce_buffers(widen: bool):
    """A reduction (lower.vector.emit_reduce) over tiles (t0, t1, t2), t2 reduced: per buffer set,
    the input tile, its int32 copy (int8 sums), and the t0 x t1 sums."""
    def buffers(t0, t1, t2, bufs):
        return [Buffer("input", Space.SPAD, t0 * t1 * t2 * FP32, bufs),
                Buffer("widened", Space.SPAD, t0 * t1 * t2 * FP32, bufs * widen),
                Buffer("sums", Space.SPAD, t0 * t1 * FP32, bufs)]
    return buffers


def gather_buffers(t0, t1, t2, bufs) -> list[Buffer]:
    """A gather (lower.vector.emit_gather) of t0 rows of t2 elements: per buffer set, the indices
    and the rows."""
    return [Buffer("indices", Space.SPAD, t0 * FP32, bufs), Buffer("rows", Space.SPAD, t0 * t2 * FP32, bufs)]
