"""A layer's loop nest, described once: its problem, its mapping, and what follows from them.

A conv-shaped layer (a convolution or matmul on the matrix unit, a depthwise conv or a pooling
on the vector unit) runs as one loop nest over output tiles (lower.codegen.matrix.emit_conv,
lower.codegen.window.emit_window).  This module holds what that nest is: the problem (`ConvProblem`, and
`LayerShape`, the same as flat numbers with its epilogue and repeat count), the mapping
(`TileMapping`: tile sizes and the switches in `SWITCHES`), the tiles the emitter walks
(`tiles`, `row_tiles`), and, in lower.schedule.nest_cost, everything derived from the two: tile counts,
halos, the buffers it holds (footprint), its DMA traffic, each unit's cycles and the latency
of the pipeline they form.

Those formulas are written once, over a namespace of array operations (`Exact` here: numpy,
the emitter's integer counts; costmodel.smooth.Relaxed: jax.numpy with a temperature).  The
mapper evaluates them exactly over grids of candidate mappings (numpy broadcasting along one
axis per tile size and switch), the emitter walks the same tiles, and the cost model is the
same function relaxed for gradients.  A new mapping switch is a field of TileMapping, an entry
of SWITCHES, its terms in lower.schedule.nest_cost and its emission; nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from .buffers import FP32, NO_EXTRAS, Extras

KINDS = ("matrix", "depthwise", "pool")
MATRIX, DEPTHWISE, POOL = range(3)


@dataclass(frozen=True)
class ConvProblem:
    """A 2-D convolution (NCHW x OIHW), the shape every matrix-unit op is lowered as.

    A matmul [M,K]x[K,N] is the 1x1 convolution of a 1xM image with K channels.
    """

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int = 1
    kw: int = 1
    stride: tuple[int, int] = (1, 1)
    padding: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (0, 0))
    dilation: tuple[int, int] = (1, 1)
    itemsize: int = FP32    # bytes of an input or weight element (1: int8)
    widened: bool = False   # sums held wider than the elements: int8's in int32, bf16's in float32
    out_itemsize: int = FP32   # bytes of an output element as stored (1: requantized to int8)

    @property
    def oh(self) -> int:
        return (self.h + sum(self.padding[0]) - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + sum(self.padding[1]) - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1

    @property
    def macs(self) -> int:
        return self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw

    def halo(self, th: int, tw: int) -> tuple[int, int]:
        """Input rows and columns an output tile of th x tw reads."""
        return ((th - 1) * self.stride[0] + (self.kh - 1) * self.dilation[0] + 1,
                (tw - 1) * self.stride[1] + (self.kw - 1) * self.dilation[1] + 1)

    @property
    def stacks(self) -> bool:
        """Whether a stacked mapping (TileMapping.stacked) applies: an undilated kernel of several rows."""
        return bool(stacks(LayerShape.of("matrix", self)))

    @property
    def turns(self) -> bool:
        return bool(turns(LayerShape.of("matrix", self)))


@dataclass(frozen=True)
class LayerShape:
    """A conv-shaped layer as flat numbers: what its loop nest depends on besides the mapping.

    Python numbers for the mapper and the emitter; arrays of one shape (a batch of layers) for the
    cost model, which `vmap`s over them.  kind: index into KINDS; epilogue: lower.schedule.buffers.Extras
    (buffers, loads and vector work of the fused epilogue); repeat: how many times the whole nest
    runs (a batched matmul's batch, a grouped conv's groups, a pooling's leading dims).
    """

    kind: object
    n: object
    c: object
    h: object
    w: object
    o: object
    kh: object
    kw: object
    stride_h: object
    stride_w: object
    pad_top: object
    pad_bottom: object
    pad_left: object
    pad_right: object
    dilation_h: object
    dilation_w: object
    itemsize: object
    out_itemsize: object
    widened: object
    epilogue: Extras
    repeat: object

    @classmethod
    def of(cls, kind: str, p: ConvProblem, extras=NO_EXTRAS, repeat: int = 1) -> LayerShape:
        (pt, pb), (pl, pr) = p.padding
        return cls(KINDS.index(kind), p.n, p.c, p.h, p.w, p.o, p.kh, p.kw, *p.stride, pt, pb, pl, pr, *p.dilation,
                   p.itemsize, p.out_itemsize, int(p.widened), Extras(*extras), repeat)

    @property
    def oh(self):
        return (self.h + self.pad_top + self.pad_bottom - self.dilation_h * (self.kh - 1) - 1) // self.stride_h + 1

    @property
    def ow(self):
        return (self.w + self.pad_left + self.pad_right - self.dilation_w * (self.kw - 1) - 1) // self.stride_w + 1

    @property
    def macs(self):
        return self.repeat * self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw


@dataclass(frozen=True)
class TileMapping:
    """Output tile (rows x cols x channels), reduction tile, buffering, weight residency.

    Fields are Python numbers for a chosen mapping; arrays for candidates (the mapper's grids,
    broadcast one axis per field) and for the cost model (probabilities for the switches).

    `single_acc` keeps one accumulator tile while the scratchpad tiles stay double-buffered: the
    next output tile waits for this one's epilogue and store, but may be twice as large (a bigger
    output-channel tile re-reads the input fewer times; a bigger spatial tile pays fewer folds).

    `transposed` swaps the array's operands (SCALE-Sim's input-stationary dataflow on a
    weight-stationary array): the input pixels sit in the array and the output channels stream
    through, so a fold streams `tile_o` rows instead of `tile_oh * tile_ow`.  Late CNN layers
    (7x7 pixels, 512+ channels) pay the per-fold fill and drain over 49 rows one way and over
    hundreds the other.  B's columns are the tile's pixels as one evenly spaced line through the
    halo (tile_line: a 7x7 tile of a 3x3 conv is 61 columns, the 2 per row between rows
    computed and dropped).  The products land channel-major; a COPY per tile turns them back to
    (rows, cols, channels) in the scratchpad, which frees the accumulator tile as `single_acc`'s
    result tile does.

    `stacked` lays each output row's kernel rows side by side in the halo (one LOAD per output row,
    [column][kernel row][channel]), so one MATMUL's k covers the whole kernel, kh * kw * tile_c,
    instead of one kernel row: a stem's 7x7 kernel over 3 channels is 10 row folds of the array
    rather than 7 x 2 (21 of every 32 rows used), for kh times the input traffic.  Undilated
    kernels of more than one row only.

    `dot` runs an int8 depthwise conv's taps as dot products (VectorFunc.RDOT, as Arm's SDOT): its halo
    held channel-major ([channel][row][column], so a kernel row's taps over one output are a run of kw
    int8 in it), per output row and kernel row one RDOT sums each output's kw products into its int32
    (in ceil(kw / 4) dot steps of a lane, sim.costs.lane_work: a 3-tap row one, a 5-tap row two), instead of a
    widening MUL per tap, one a lane.  In a cascade the window the member ahead wrote
    ([row][column][channel]) is turned channel-major by a COPY per tile first.  Undilated columns only."""

    tile_oh: int
    tile_ow: int
    tile_o: int
    tile_c: int = 1
    double_buffer: bool = True
    weights_resident: bool = False
    single_acc: bool = False
    transposed: bool = False
    stacked: bool = False
    dot: bool = False

    @property
    def acc_buffers(self) -> int:
        return 1 + (self.double_buffer and not self.single_acc)

    def __str__(self) -> str:
        flags = [s.label for s in SWITCHES if getattr(self, s.name)]
        return " ".join([f"tile(oh={self.tile_oh}, ow={self.tile_ow}, o={self.tile_o}, c={self.tile_c})", *flags])


for _cls in (LayerShape, TileMapping):
    jax.tree_util.register_dataclass(_cls, data_fields=[f.name for f in fields(_cls)], meta_fields=[])

TILE_FIELDS = ("tile_oh", "tile_ow", "tile_o", "tile_c")


# --- the switches -----------------------------------------------------------------------------

def matrix(L: LayerShape):
    return L.kind == MATRIX


def turns(L: LayerShape):
    """Whether a transposed mapping can hold a tile's pixels as one evenly spaced line through its
    halo: row r, column q at halo pixel r * sh * iw + q * sw, i.e. line position r * pitch + q, which
    needs sh a multiple of sw (on the matrix unit)."""
    return matrix(L) & (L.stride_h % L.stride_w == 0)


def stacks(L: LayerShape):
    """Whether a stacked mapping applies: an undilated matrix-unit kernel of several rows."""
    return matrix(L) & (L.kh > 1) & (L.dilation_h == 1) & (L.dilation_w == 1)


def dots(L: LayerShape):
    """Whether a dot mapping applies: a depthwise conv of int8 summed in int32, its columns undilated."""
    return (L.kind == DEPTHWISE) & (L.itemsize == 1) & (L.widened == 1) & (L.dilation_w == 1)


@dataclass(frozen=True)
class Switch:
    """A TileMapping switch: its field, how str(mapping) shows it, where it exists (a function of
    the LayerShape, on arrays too) and what that takes in words, the order the mapper's grid tries
    its values in (the first of equally cheap candidates wins), and whether the tuner relaxes it
    (costmodel.space)."""

    name: str
    label: str
    exists: Callable
    needs: str
    grid: tuple[int, int]
    tuned: bool = True


SWITCHES = (
    Switch("double_buffer", "db", lambda L: L.kind >= 0, "", (1, 0)),
    Switch("weights_resident", "w-resident", matrix, "a matrix-unit op", (1, 0)),
    Switch("single_acc", "1-acc", matrix, "a matrix-unit op", (0, 1)),
    Switch("transposed", "transposed", turns,
           "a matrix-unit op whose row stride is a multiple of its column stride", (0, 1)),
    Switch("stacked", "stacked", stacks, "an undilated matrix-unit kernel of several rows, not transposed", (0, 1),
           tuned=False),
    Switch("dot", "dot", dots, "an int8 depthwise conv of undilated columns", (0, 1), tuned=False),
)


def conflicts(m: TileMapping, L: LayerShape):
    """Switches that exclude each other: stacked kernel rows and transposed operands."""
    return (m.stacked == 1) & (m.transposed == 1)


# --- the tiles the emitter walks ----------------------------------------------------------------

def tiles(total: int, tile: int):
    """(start, size) of each tile along one dim, the last one possibly smaller."""
    return [(s, min(tile, total - s)) for s in range(0, total, tile)]


def stacked_edges(L: LayerShape, ops):
    """(first, last + 1) of a stacked mapping's rows whose kernel stays inside the input: rows above
    read the top padding, rows from `last + 1` the bottom one (each is a tile of its own)."""
    top = ops.min(ops.cdiv(L.pad_top, L.stride_h), L.oh)
    bottom = ops.min(ops.max(ops.fdiv(L.h + L.pad_top - L.kh, L.stride_h) + 1, top), L.oh)
    return top, bottom


def row_tiles(p: ConvProblem, m: TileMapping):
    """(start, size) of the output row tiles.  A stacked mapping's rows whose kernel reaches into the
    top or bottom padding are tiles of one row: their LOADs pad differently from the rest, and the
    batched simulator reads a tile's rows as one value only where one group of LOADs wrote them all."""
    if not m.stacked:
        return tiles(p.oh, m.tile_oh)
    top, bottom = (int(v) for v in stacked_edges(LayerShape.of("matrix", p), Exact))
    return ([(r, 1) for r in range(top)] + [(top + s, t) for s, t in tiles(bottom - top, m.tile_oh)]
            + [(r, 1) for r in range(bottom, p.oh)])


def tile_line(L, th, tw):
    """(B's columns, row pitch) of a transposed tile: the line from the tile's first pixel to its last,
    the columns between its rows (halo columns no output reads) computed and dropped."""
    pitch = L.stride_h // L.stride_w * ((tw - 1) * L.stride_w + (L.kw - 1) * L.dilation_w + 1)
    return (th - 1) * pitch + tw, pitch


def halo(L, th, tw):
    """Input rows and columns an output tile of th x tw reads."""
    return ((th - 1) * L.stride_h + (L.kh - 1) * L.dilation_h + 1,
            (tw - 1) * L.stride_w + (L.kw - 1) * L.dilation_w + 1)


# --- the exact namespace ----------------------------------------------------------------------

class Exact:
    """numpy, exact: integer tile arithmetic, hard maxima.  Every function also takes Python numbers."""

    xp = np
    smooth = 0.0

    @staticmethod
    def cdiv(a, b):
        return -(-a // b)

    @staticmethod
    def fdiv(a, b):
        return a // b

    @staticmethod
    def tiles(dim, tile):
        """The tiles of `dim` by `tile` as (size, count) pairs: the full ones, the remainder."""
        full = dim // tile
        rem = dim - full * tile
        return [(tile, full), (rem, (rem > 0) * 1)]

    @classmethod
    def max(cls, *xs):
        return functools.reduce(cls.xp.maximum, xs)

    @classmethod
    def min(cls, *xs):
        return functools.reduce(cls.xp.minimum, xs)

    @classmethod
    def smax(cls, *xs):
        """The maximum over units (relaxed in costmodel.smooth.Relaxed)."""
        return cls.max(*xs)


def tile_grid(*dims):
    """(sizes, weight) of every tile: each dim's sizes along a leading axis of its own (then the
    candidates' shape, so that what a function of them closes over broadcasts with them), and how
    many tiles have each combination of sizes."""
    leaves = [v for pairs in dims for pair in pairs for v in pair]
    xp = jnp if any(isinstance(v, jax.Array) for v in leaves) else np
    lead = np.broadcast_shapes(*(np.shape(v) for v in leaves))
    sizes, counts = [], []
    for i, pairs in enumerate(dims):
        at = (1,) * i + (len(pairs),) + (1,) * (len(dims) - 1 - i) + lead
        for out, part in ((sizes, 0), (counts, 1)):
            out.append(xp.stack([xp.broadcast_to(pair[part], lead) for pair in pairs]).reshape(at))
    return sizes, functools.reduce(lambda a, b: a * b, counts)


def tile_sum(f, *dims):
    """Sum over every tile of f(its sizes), dims given as lists of (size, count) pairs.  f is evaluated
    once (traced once by the cost model), on each dim's sizes along an axis of its own; it may
    return several values stacked along leading axes of its own."""
    sizes, weight = tile_grid(*dims)
    values = f(*sizes)
    xp = jnp if isinstance(values, jax.Array) or isinstance(weight, jax.Array) else np
    n = np.ndim(weight)
    return xp.sum(weight * values, axis=tuple(range(-n, -n + len(dims))))


def count(pairs):
    return sum(c for _, c in pairs)
