"""The schedule: a mapping (tile sizes, buffering, residency) for every op.

The default mapper is a fast heuristic: a small grid of candidate tile sizes
per dim (powers of two, the whole dim, balanced splits), filtered by what fits
the scratchpad and accumulator (double-buffered or not), ranked by an
analytic estimate of the busiest unit.  When nothing fits, the error names the
layer and the bytes the smallest tile needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from stagec.errors import InputError, TilingError
from stagec.isa.config import HardwareConfig

FP32 = 4
MAX_HALO = 65535


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
    widened: bool = False   # int8 halos and weights also held as int32 (lower.window's int8 sums)

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
        return self.kh > 1 and self.dilation == (1, 1)

    @property
    def turns(self) -> bool:
        return strides_turn(self.stride)


def strides_turn(stride):
    """Whether a transposed mapping can hold a tile's pixels as one evenly spaced line through its
    halo: row r, column q at halo pixel r * sh * iw + q * sw, i.e. line position r * pitch + q, which
    needs sh a multiple of sw.  Works on arrays (the cost model's LayerShape fields)."""
    return stride[0] % stride[1] == 0


def tile_line(p, th, tw):
    """(B's columns, row pitch) of a transposed tile of `p` (a ConvProblem or what has its stride,
    dilation and kw): the line from the tile's first pixel to its last, the columns between its rows
    (halo columns no output reads) computed and dropped.  Works on arrays of candidates."""
    pitch = p.stride[0] // p.stride[1] * ((tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1)
    return (th - 1) * pitch + tw, pitch


@dataclass(frozen=True)
class TileMapping:
    """Output tile (rows x cols x channels), reduction tile, buffering, weight residency.

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
    kernels of more than one row only."""

    tile_oh: int
    tile_ow: int
    tile_o: int
    tile_c: int = 1
    double_buffer: bool = True
    weights_resident: bool = False
    single_acc: bool = False
    transposed: bool = False
    stacked: bool = False

    @property
    def acc_buffers(self) -> int:
        return 1 + (self.double_buffer and not self.single_acc)

    def __str__(self) -> str:
        flags = [f for f, on in (("db", self.double_buffer), ("w-resident", self.weights_resident),
                                 ("1-acc", self.single_acc), ("transposed", self.transposed),
                                 ("stacked", self.stacked)) if on]
        return f"tile(oh={self.tile_oh}, ow={self.tile_ow}, o={self.tile_o}, c={self.tile_c}) {' '.join(flags)}"


def _sizes(dim: int, cap: int = MAX_HALO) -> np.ndarray:
    """Candidate tile sizes along one dim: powers of two, the whole dim, and balanced splits, none
    above `cap` (an instruction's iteration counts are 16-bit)."""
    cands = {dim} | {1 << k for k in range(dim.bit_length()) if 1 << k <= dim}
    cands |= {-(-dim // k) for k in range(2, 9)}
    cands = {c for c in cands if c <= cap} or {cap}
    return np.array(sorted(cands), np.int64)


def _grid(**axes) -> dict[str, np.ndarray]:
    mesh = np.meshgrid(*axes.values(), indexing="ij")
    return {k: v.reshape(-1) for k, v in zip(axes, mesh, strict=True)}


def one_spatial_tile(p: ConvProblem, th, tw, stacked=0, xp=np):
    """Whether a matrix-unit nest has one spatial tile: it then loads its input halo once (one
    buffer, when the channels are not tiled either) and visits each output-channel tile once, so
    its per-channel epilogue vectors are loaded a tile at a time, double-buffered like the weights,
    instead of whole.  Works on arrays of candidates."""
    return (p.n == 1) & (th >= p.oh) & (tw >= p.ow) & (xp.asarray(stacked) == 0)


def halo_buffers(p: ConvProblem, th, tw, tc, stacked, bufs, xp=np):
    """Input-halo buffers of a matrix-unit nest: one where the halo is loaded once (one spatial
    tile, the channels whole), else `bufs`.  Works on arrays of candidates."""
    return xp.where(one_spatial_tile(p, th, tw, stacked, xp) & (tc >= p.c), 1, bufs)


def conv_footprint(p: ConvProblem, th, tw, to, tc, double_buffer, resident, extras=(0, 0), xp=np, single_acc=0,
                   transposed=0, stacked=0):
    """(scratchpad bytes, accumulator bytes) a matrix-unit mapping occupies, as lower.matrix
    allocates them: input halos, weights (tiles or all of them), epilogue operand tiles and
    per-channel epilogue vectors, the result tile of `single_acc` or the turned tiles of
    `transposed`; accumulator tiles (one with `single_acc`).  Works on arrays of candidates."""
    tile_extras, channel_extras = extras
    bufs = 1 + double_buffer
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    weights = xp.where(resident, p.kh * p.kw * p.c * p.o, bufs * p.kh * p.kw * tc * to) * FP32
    out_tile = th * tw * to * FP32
    halo = (stacked * th * p.kh + (1 - stacked) * ih) * iw * tc
    acc_bufs = bufs - double_buffer * single_acc
    one = one_spatial_tile(p, th, tw, stacked, xp)
    # a transposed nest turns each accumulator tile into one of as many scratchpad tiles
    spad = (halo_buffers(p, th, tw, tc, stacked, bufs, xp) * halo * FP32 + weights
            + (bufs * tile_extras + transposed * acc_bufs + single_acc * (1 - transposed)) * out_tile
            + channel_extras * xp.where(one, bufs * to, p.o) * FP32)
    acc_tile = (transposed * tile_line(p, th, tw)[0] + (1 - transposed) * th * tw) * to * FP32
    return spad, acc_bufs * acc_tile


def window_footprint(p: ConvProblem, th, tw, to, double_buffer, extras=(0, 0), weighted=True, xp=np):
    """(scratchpad, accumulator) bytes of a depthwise/pooling mapping (lower.window's buffers)."""
    tile_extras, channel_extras = extras
    bufs = 1 + double_buffer
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    out_tile = th * tw * to * FP32
    item = FP32 + 1 if p.widened else FP32   # an int8 element and its int32 copy, else one fp32 element
    spad = bufs * (ih * iw * to * item + (p.kh * p.kw * to * item if weighted else 0) + tile_extras * out_tile)
    return spad + channel_extras * p.o * FP32, bufs * out_tile


def fits(p: ConvProblem, spad, acc, th, tw, hw: HardwareConfig):
    """Which candidates fit the memories (and the DMA's halo limit)."""
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    return (spad <= hw.scratchpad_bytes) & (acc <= hw.accumulator_bytes) & (np.maximum(ih, iw) <= MAX_HALO)


def footprint(kind: str, p: ConvProblem, m: TileMapping, extras=(0, 0)) -> tuple[int, int]:
    """(scratchpad, accumulator) bytes of one mapping of a node of `kind` (see node_problem)."""
    if kind == "matrix":
        spad, acc = conv_footprint(p, m.tile_oh, m.tile_ow, m.tile_o, m.tile_c, int(m.double_buffer),
                                   m.weights_resident, extras, single_acc=int(m.single_acc),
                                   transposed=int(m.transposed), stacked=int(m.stacked))
    else:
        spad, acc = window_footprint(p, m.tile_oh, m.tile_ow, m.tile_o, int(m.double_buffer), extras,
                                     kind == "depthwise")
    return int(spad), int(acc)


def _pick(p: ConvProblem, g: dict, spad: np.ndarray, acc: np.ndarray, cost: np.ndarray, hw: HardwareConfig,
          layer: str | None, with_cost: bool = False):
    """The cheapest candidate that fits, as a TileMapping (and its estimated cost, `with_cost`); the
    grid's switches beyond double buffering (res, sa, tr, st) are off where it has none."""
    ok = fits(p, spad, acc, g["th"], g["tw"], hw)
    if not ok.any():
        k = int(np.argmin(spad + acc))
        where = f"{layer}: " if layer else ""
        raise TilingError(f"{where}no tiling fits: the smallest tile needs {int(spad[k])} bytes of scratchpad "
                          f"(have {hw.scratchpad_bytes}) and {int(acc[k])} bytes of accumulator "
                          f"(have {hw.accumulator_bytes})")
    k = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    m = TileMapping(*(int(g[d][k]) for d in ("th", "tw", "to", "tc")),
                    *(bool(g[f][k]) if f in g else False for f in ("db", "res", "sa", "tr", "st")))
    return (m, float(cost[k])) if with_cost else m


def _dma_cycles(hw: HardwareConfig, count, nbytes):
    return count * hw.dma_latency_cycles + nbytes / hw.dma_bandwidth_bytes_per_cycle


def map_conv(p: ConvProblem, hw: HardwareConfig, extras=(0, 0), layer: str = "conv", with_cost: bool = False):
    """Default mapping on the matrix unit: the candidate tiling (sizes from a small grid per dim)
    that fits and minimizes an analytic estimate in cycles: the busiest of array, DMA and vector
    unit, plus a small charge per instruction (`with_cost`: (mapping, that estimate))."""
    found = _map_conv(p, hw, tuple(extras))
    if isinstance(found, TilingError):
        raise TilingError(f"{layer}: {found}")
    return found if with_cost else found[0]


@functools.lru_cache(maxsize=4096)
def _map_conv(p: ConvProblem, hw: HardwareConfig, extras: tuple[int, int]):
    """map_conv's search, once per problem, config and epilogue (networks repeat their layer shapes):
    (mapping, estimate), or the TilingError, its message without the layer's name."""
    fold = p.kw if p.dilation[1] == 1 else 1   # MATMUL's k covers a kernel row: kw * tc <= the count limit
    g = _grid(th=_sizes(p.oh), tw=_sizes(p.ow), to=_sizes(p.o), tc=_sizes(p.c, MAX_HALO // fold),
              db=np.array([1, 0]), res=np.array([1, 0]), sa=np.array([0, 1]),
              tr=np.array([0, 1] if p.turns else [0]), st=np.array([0, 1] if p.stacks else [0]))
    g["res"] = np.where(p.c * fold > MAX_HALO, 0, g["res"])
    g["tc"] = np.where(g["res"] == 1, p.c, g["tc"])   # resident weights: one channel tile
    g["sa"] = g["sa"] * g["db"]                       # a single accumulator tile is a double-buffered nest's choice
    g["st"] = np.where((g["tr"] == 1) | (p.kh * p.kw * g["tc"] > MAX_HALO), 0, g["st"])   # k is 16-bit
    th, tw, to, tc, db, res, sa, tr, st = (g[k] for k in ("th", "tw", "to", "tc", "db", "res", "sa", "tr", "st"))
    spad, acc = conv_footprint(p, th, tw, to, tc, db, res == 1, extras, single_acc=sa, transposed=tr, stacked=st)
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    m = th * tw
    line = tile_line(p, th, tw)[0]
    w_all = p.kh * p.kw * p.c * p.o * FP32
    w_tile = p.kh * p.kw * tc * to * FP32
    n_sp = p.n * -(-p.oh // th) * -(-p.ow // tw)
    n_o, n_c = -(-p.o // to), -(-p.c // tc)
    n_mm = n_sp * n_o * n_c * np.where(st == 1, 1, p.kh * -(-p.kw // fold))
    k = np.where(st == 1, p.kh * p.kw, fold) * tc                  # one MATMUL's reduction
    r, c = hw.array_rows, hw.array_cols
    rows, cols = np.where(tr == 1, to, m), np.where(tr == 1, line, to)    # the operand streamed, the one held
    if hw.dataflow == "weight_stationary":
        mm = n_mm * -(-k // r) * -(-cols // c) * (2 * r + c + rows - 2)
    else:
        mm = n_mm * -(-rows // r) * -(-cols // c) * (2 * r + c + k - 2)
    halo_loads = n_sp * n_c * np.where(n_c > 1, n_o, 1)
    w_loads = np.where(res == 1, 1, n_sp * n_o * n_c)
    tiles_out = n_sp * n_o
    halo_dmas, halo_rows = np.where(st == 1, th, 1), np.where(st == 1, th * p.kh, ih)   # a stacked halo: a LOAD a row
    dma = _dma_cycles(hw, halo_loads * halo_dmas + w_loads + tiles_out * (1 + extras[0]),
                      halo_loads * halo_rows * iw * tc * FP32 + np.where(res == 1, w_all, w_loads * w_tile)
                      + tiles_out * (1 + extras[0]) * m * to * FP32)
    instructions = n_mm + halo_loads * halo_dmas + w_loads + tiles_out * (1 + 2 * extras[0] + np.maximum(sa, tr))
    # one accumulator tile: the array waits for each tile's epilogue, about a pass over the tile per
    # operand (a bias, a residual...) and one to apply it or move the result out; a transposed
    # tile is free once its COPY has turned it
    passes = np.where(tr == 1, 1, 1 + extras[0] + (extras[1] > 0))
    epilogue_wait = sa * tiles_out * passes * np.ceil(m * to / hw.vector_lanes)
    # double buffering overlaps the DMA with the array; single buffering serializes them.  The
    # first halo is loaded before any MATMUL (the pipeline's fill; all the load of a nest of one
    # spatial tile)
    fill = _dma_cycles(hw, 1, halo_rows * iw * tc * FP32)
    cost = np.where(db == 1, np.maximum(mm + epilogue_wait, dma), mm + dma) + fill + 8.0 * instructions
    try:
        return _pick(p, g, spad, acc, cost, hw, None, True)
    except TilingError as e:
        return e


def map_window(p: ConvProblem, hw: HardwareConfig, extras=(0, 0), weighted: bool = True,
               layer: str = "window", with_cost: bool = False):
    """Default mapping of depthwise conv / pooling on the vector unit (channels as lanes), ranked
    as map_conv ranks its candidates."""
    g = _grid(th=_sizes(p.oh), tw=_sizes(p.ow), to=_sizes(p.o), tc=np.array([1]), db=np.array([1, 0]))
    th, tw, to, db = g["th"], g["tw"], g["to"], g["db"]
    spad, acc = window_footprint(p, th, tw, to, db, extras, weighted)
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    out_tile = th * tw * to * FP32
    tiles_out = p.n * -(-p.oh // th) * -(-p.ow // tw) * -(-p.o // to)
    vec = tiles_out * p.kh * p.kw * -(-(th * tw * to) // hw.vector_lanes)
    dma = _dma_cycles(hw, tiles_out * (2 + extras[0]), tiles_out * (ih * iw * to * FP32 + (1 + extras[0]) * out_tile))
    fill = _dma_cycles(hw, 1, ih * iw * to * FP32)   # the first tile's input, as map_conv's
    cost = np.where(db == 1, np.maximum(vec, dma), vec + dma) + fill + 8.0 * tiles_out * (2 + p.kh * p.kw)
    return _pick(p, g, spad, acc, cost, hw, layer, with_cost)


def map_vector(shape: tuple[int, ...], operands: int, hw: HardwareConfig, layer: str = "vector",
               resident_bytes: int = 0, loads: int = 1, passes: float = 1.0) -> TileMapping:
    """Elementwise/reduce/copy tiles over a (<= 3-D) iteration space [d0, d1, d2]:
    `operands` dense tiles (inputs, temporaries, result) per buffer beside `resident_bytes` loaded
    once (requant records, broadcast scalars); per tile, `loads` LOADs of a whole tile, `passes`
    vector cycles per lane group and one STORE.  Ranked by a pipeline estimate: the busiest of load
    queue, store queue, DRAM channel and vector unit, plus one tile's load, passes and store (the
    pipeline's fill and drain), so a tensor is cut into enough tiles to overlap, plus a charge per
    instruction (compile time, and issue); long innermost runs break ties (DMA bursts)."""
    d0, d1, d2 = (1,) * (3 - len(shape)) + tuple(shape)[-3:]
    g = _grid(th=_sizes(d0), tw=_sizes(d1), to=_sizes(d2), tc=np.array([1]), db=np.array([1, 0]))
    tile = g["th"] * g["tw"] * g["to"]
    spad = (1 + g["db"]) * tile * FP32 * operands + resident_bytes
    tiles = -(-d0 // g["th"]) * -(-d1 // g["tw"]) * -(-d2 // g["to"])
    load = loads * _dma_cycles(hw, 1, tile * FP32)
    store = _dma_cycles(hw, 1, tile * FP32)
    vec = passes * np.ceil(tile / hw.vector_lanes)
    channel = (loads + 1) * tile * FP32 / hw.dma_bandwidth_bytes_per_cycle
    busiest = np.maximum(np.maximum(load, store), np.maximum(vec, channel))
    cost = (np.where(g["db"] == 1, tiles * busiest + load + vec + store, tiles * (load + vec + store))
            + 8.0 * tiles * (loads + 1 + np.ceil(passes)) - 1e-6 * g["to"])
    return _pick(ConvProblem(1, 1, 1, 1, 1), g, spad, np.zeros_like(spad), cost, hw, layer)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tiles(total: int, tile: int):
    """(start, size) of each tile along one dim, the last one possibly smaller."""
    return [(s, min(tile, total - s)) for s in range(0, total, tile)]


def row_tiles(p: ConvProblem, m: TileMapping):
    """(start, size) of the output row tiles.  A stacked mapping's rows whose kernel reaches into the
    top or bottom padding are tiles of one row: their LOADs pad differently from the rest, and the
    batched simulator reads a tile's rows as one value only where one group of LOADs wrote them all."""
    if not m.stacked:
        return tiles(p.oh, m.tile_oh)
    (pt, _), _ = p.padding
    sh = p.stride[0]
    top = min(-(-pt // sh), p.oh)                                    # rows r with r * sh < pt
    bottom = min(max((p.h + pt - p.kh) // sh + 1, top), p.oh)        # rows reaching past the input
    return ([(r, 1) for r in range(top)] + [(top + s, t) for s, t in tiles(bottom - top, m.tile_oh)]
            + [(r, 1) for r in range(bottom, p.oh)])


# --- the schedule stage -----------------------------------------------------------------------

def node_problem(node) -> tuple[str, ConvProblem, tuple[int, int]] | None:
    """(kind, problem, epilogue operands) of a node that runs as a convolution, else None.

    kind is 'matrix' (conv/matmul on the array), 'depthwise' or 'pool' (vector unit, per channel);
    the epilogue operands are (full tiles: operands and temporaries, per-channel 4-byte vectors; a
    requant record is 4 of them).
    """
    from .graph_ir import RECORD_WORDS, OpKind, record_inputs
    from .tile_expr import plan

    def epilogue(channel_axis: int) -> tuple[int, int]:
        expr = node.attr("epilogue")
        extras = node.inputs[2:]
        out = node.output.shape
        axis = channel_axis % len(out)
        records = record_inputs(expr)
        tile_extras = per_channel = 0
        for k, v in enumerate(extras):
            shape = v.shape[:-1] if k + 1 in records else v.shape
            if all(d == 1 for i, d in enumerate((1,) * (len(out) - len(shape)) + shape) if i != axis):
                per_channel += RECORD_WORDS if k + 1 in records else 1
            else:
                tile_extras += 1
        temps = plan(expr, len(extras) + 1, frozenset(range(len(extras) + 1))).temps if expr else 0
        return tile_extras + temps, per_channel

    if node.op == OpKind.CONV:
        (n, c, h, w), (o, cg, kh, kw) = node.inputs[0].shape, node.inputs[1].shape
        g = node.attr("groups")
        kind = "depthwise" if cg == 1 and o == g else "matrix"
        return kind, ConvProblem(n, c if kind == "depthwise" else cg, h, w, o if kind == "depthwise" else o // g,
                                 kh, kw, node.attr("stride"), node.attr("padding"), node.attr("dilation"),
                                 kind == "depthwise" and node.inputs[0].dtype == "int8"), epilogue(1)
    if node.op == OpKind.MATMUL:
        (m, k), nn = node.inputs[0].shape[-2:], node.inputs[1].shape[-1]
        return "matrix", ConvProblem(1, k, 1, m, nn), epilogue(-1)
    if node.op == OpKind.POOL:
        *_, c, h, w = node.inputs[0].shape
        (kh, kw), stride = node.attr("window"), node.attr("strides")
        widened = node.inputs[0].dtype == "int8" and node.attr("func") != "max"
        return "pool", ConvProblem(1, c, h, w, c, kh, kw, stride, node.attr("padding"), node.attr("dilation"),
                                   widened), (0, 0)
    return None


def default_mapping(kind: str, p: ConvProblem, hw: HardwareConfig, extras=(0, 0), layer: str = "conv") -> TileMapping:
    """The grid search's mapping of a node of `kind` (see node_problem)."""
    if kind == "matrix":
        return map_conv(p, hw, extras, layer)
    return map_window(p, hw, extras, kind == "depthwise", layer)


@dataclass(frozen=True)
class Schedule:
    """A mapping for every node that runs as a convolution; vector ops tile at emission."""

    mappings: tuple[tuple[str, TileMapping], ...]

    def __getitem__(self, name: str) -> TileMapping:
        return dict(self.mappings)[name]

    def __str__(self) -> str:
        return "schedule {\n" + "\n".join(f"  {name}: {m}" for name, m in self.mappings) + "\n}"


def make_schedule(graph, hw: HardwareConfig, mappings: dict | None = None) -> Schedule:
    """A mapping per conv-shaped node: `mappings[node name]` where given (checked to fit), else the
    default mapper's."""
    mappings = dict(mappings or {})
    out = []
    for node in graph.nodes:
        found = node_problem(node)
        if found is None:
            continue
        kind, p, extras = found
        if node.name in mappings:
            m = mappings.pop(node.name)
            spad, acc = footprint(kind, p, m, extras)
            if m.stacked and not (kind == "matrix" and p.stacks and not m.transposed):
                raise TilingError(f"{node.name}: mapping {m} is stacked, which needs an undilated matrix-unit "
                                  f"kernel of several rows, not transposed (have {kind}, {p.kh}x{p.kw}, "
                                  f"dilation {p.dilation})")
            if m.transposed and not (kind == "matrix" and p.turns):
                raise TilingError(f"{node.name}: mapping {m} is transposed, which needs a matrix-unit op whose "
                                  f"row stride is a multiple of its column stride (have {kind}, {p.stride})")
            if not fits(p, spad, acc, m.tile_oh, m.tile_ow, hw):
                raise TilingError(f"{node.name}: mapping {m} needs {spad} bytes of scratchpad (have "
                                  f"{hw.scratchpad_bytes}) and {acc} of accumulator (have {hw.accumulator_bytes})")
        else:
            m = default_mapping(kind, p, hw, extras, node.name)
        out.append((node.name, m))
    if mappings:
        raise InputError(f"mappings for layers the graph does not have: {sorted(mappings)}")
    return Schedule(tuple(out))
