"""The schedule: a mapping (tile sizes, buffering, residency) for every op.

The default mapper is a fast heuristic: a small grid of candidate tile sizes
per dim (powers of two, the whole dim, balanced splits), filtered by what fits
the scratchpad and accumulator (double-buffered or not), ranked by an
analytic estimate of the busiest unit.  What fits is what lower.buffers lists for the
nest, the buffers the emitter then allocates.  When nothing fits, the TilingError names the
layer, the memory, the bytes the smallest tiling needs there and the memory's capacity.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from stagec.errors import InputError, TilingError
from stagec.isa.config import HardwareConfig

from .buffers import (
    FP32,
    NO_EXTRAS,
    Extras,
    conv_buffers,
    epilogue_extras,
    local_bytes,
    tile_line,
    window_buffers,
)

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
    itemsize: int = FP32    # bytes of an input or weight element (1: int8)
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
        return " ".join([f"tile(oh={self.tile_oh}, ow={self.tile_ow}, o={self.tile_o}, c={self.tile_c})", *flags])


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


def fits(p: ConvProblem, spad, acc, th, tw, hw: HardwareConfig):
    """Which candidates fit the memories (and the DMA's halo limit)."""
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    return (spad <= hw.scratchpad_bytes) & (acc <= hw.accumulator_bytes) & (np.maximum(ih, iw) <= MAX_HALO)


def footprint(kind: str, p: ConvProblem, m: TileMapping, extras=NO_EXTRAS) -> tuple[int, int]:
    """(scratchpad, accumulator) bytes of one mapping of a node of `kind` (see node_problem)."""
    if kind == "matrix":
        buffers = conv_buffers(p, m.tile_oh, m.tile_ow, m.tile_o, m.tile_c, int(m.double_buffer), m.weights_resident,
                               Extras(*extras), int(m.single_acc), int(m.transposed), int(m.stacked))
    else:
        buffers = window_buffers(p, m.tile_oh, m.tile_ow, m.tile_o, int(m.double_buffer), Extras(*extras),
                                 kind == "depthwise")
    spad, acc = local_bytes(buffers)
    return int(spad), int(acc)


def _candidate(g: dict, k: int) -> TileMapping:
    """Candidate k of a grid; its switches beyond double buffering (res, sa, tr, st) are off where
    the grid has none."""
    return TileMapping(*(int(g[d][k]) for d in ("th", "tw", "to", "tc")),
                       *(bool(g[f][k]) if f in g else False for f in ("db", "res", "sa", "tr", "st")))


def _pick(p: ConvProblem, g: dict, spad: np.ndarray, acc: np.ndarray, cost: np.ndarray, hw: HardwareConfig,
          layer: str | None, with_cost: bool = False):
    """The cheapest candidate that fits, as a TileMapping (and its estimated cost, `with_cost`)."""
    ok = fits(p, spad, acc, g["th"], g["tw"], hw)
    if not ok.any():
        raise _nothing_fits(p, g, spad, acc, hw, layer)
    k = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    return (_candidate(g, k), float(cost[k])) if with_cost else _candidate(g, k)


def _nothing_fits(p: ConvProblem, g: dict, spad: np.ndarray, acc: np.ndarray, hw: HardwareConfig,
                  layer: str | None) -> TilingError:
    """The error when no candidate fits: the memory no tiling fits, the bytes the smallest tiling
    needs there (of those that fit the other memory, when there are any) and its capacity."""
    where = f"{layer}: " if layer else ""
    halo_ok = fits(p, 0, 0, g["th"], g["tw"], hw)
    if not halo_ok.any():
        return TilingError(f"{where}no tiling fits the DMA: every tile's input halo spans over {MAX_HALO} rows or "
                           f"columns")
    memories = (("scratchpad", spad, hw.scratchpad_bytes), ("accumulator", acc, hw.accumulator_bytes))
    for (memory, need, capacity), (other, other_need, other_capacity) in (memories, memories[::-1]):
        other_ok = halo_ok & (other_need <= other_capacity)
        if other_ok.any():   # else the other memory is the one no tiling fits
            k = int(np.argmin(np.where(other_ok, need, np.iinfo(np.int64).max)))
            among = f" (of those that fit the {other}'s {other_capacity} bytes)" if need[k] > need[halo_ok].min() \
                else ""
            return TilingError(f"{where}no tiling fits the {memory}: the smallest tiling{among}, {_candidate(g, k)}, "
                               f"needs {int(need[k])} bytes of {memory}, which has {capacity}")
    raise AssertionError("unreachable: some candidate fits one memory or neither fits")


def _dma_cycles(hw: HardwareConfig, count, nbytes):
    return count * hw.dma_latency_cycles + nbytes / hw.dma_bandwidth_bytes_per_cycle


def map_conv(p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS, layer: str = "conv", with_cost: bool = False):
    """Default mapping on the matrix unit: the candidate tiling (sizes from a small grid per dim)
    that fits and minimizes an analytic estimate in cycles: the busiest of array, DMA and vector
    unit, plus a small charge per instruction (`with_cost`: (mapping, that estimate))."""
    found = _map_conv(p, hw, Extras(*extras))
    if isinstance(found, TilingError):
        raise TilingError(f"{layer}: {found}")
    return found if with_cost else found[0]


@functools.lru_cache(maxsize=4096)
def _map_conv(p: ConvProblem, hw: HardwareConfig, extras: Extras):
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
    spad, acc = local_bytes(conv_buffers(p, th, tw, to, tc, db, res == 1, extras, sa, tr, st))
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
    dma = _dma_cycles(hw, halo_loads * halo_dmas + w_loads + tiles_out * (1 + extras.tiles),
                      halo_loads * halo_rows * iw * tc * FP32 + np.where(res == 1, w_all, w_loads * w_tile)
                      + tiles_out * (1 + extras.tiles) * m * to * FP32)
    instructions = n_mm + halo_loads * halo_dmas + w_loads + tiles_out * (1 + 2 * extras.tiles + np.maximum(sa, tr))
    # one accumulator tile: the array waits for each tile's epilogue, about a pass over the tile per
    # operand (a bias, a residual...) and one to apply it or move the result out; a transposed
    # tile is free once its COPY has turned it
    passes = np.where(tr == 1, 1, 1 + extras.tiles + (extras.channel_words > 0))
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


def map_window(p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS, weighted: bool = True,
               layer: str = "window", with_cost: bool = False):
    """Default mapping of depthwise conv / pooling on the vector unit (channels as lanes), ranked
    as map_conv ranks its candidates."""
    extras = Extras(*extras)
    g = _grid(th=_sizes(p.oh), tw=_sizes(p.ow), to=_sizes(p.o), tc=np.array([1]), db=np.array([1, 0]))
    th, tw, to, db = g["th"], g["tw"], g["to"], g["db"]
    spad, acc = local_bytes(window_buffers(p, th, tw, to, db, extras, weighted))
    ih = (th - 1) * p.stride[0] + (p.kh - 1) * p.dilation[0] + 1
    iw = (tw - 1) * p.stride[1] + (p.kw - 1) * p.dilation[1] + 1
    out_tile = th * tw * to * FP32
    tiles_out = p.n * -(-p.oh // th) * -(-p.ow // tw) * -(-p.o // to)
    vec = tiles_out * p.kh * p.kw * -(-(th * tw * to) // hw.vector_lanes)
    dma = _dma_cycles(hw, tiles_out * (2 + extras.tiles),
                      tiles_out * (ih * iw * to * FP32 + (1 + extras.tiles) * out_tile))
    fill = _dma_cycles(hw, 1, ih * iw * to * FP32)   # the first tile's input, as map_conv's
    cost = np.where(db == 1, np.maximum(vec, dma), vec + dma) + fill + 8.0 * tiles_out * (2 + p.kh * p.kw)
    return _pick(p, g, spad, acc, cost, hw, layer, with_cost)


def map_vector(shape: tuple[int, ...], buffers, hw: HardwareConfig, layer: str = "vector", loads: int = 1,
               passes: float = 1.0) -> TileMapping:
    """Elementwise/reduce/copy tiles over a (<= 3-D) iteration space [d0, d1, d2], whose nest holds
    `buffers(t0, t1, t2, buffer sets)` (lower.buffers); per tile, `loads` LOADs of a whole tile,
    `passes` vector cycles per lane group and one STORE.  Ranked by a pipeline estimate: the busiest of load
    queue, store queue, DRAM channel and vector unit, plus one tile's load, passes and store (the
    pipeline's fill and drain), so a tensor is cut into enough tiles to overlap, plus a charge per
    instruction (compile time, and issue); long innermost runs break ties (DMA bursts)."""
    d0, d1, d2 = (1,) * (3 - len(shape)) + tuple(shape)[-3:]
    g = _grid(th=_sizes(d0), tw=_sizes(d1), to=_sizes(d2), tc=np.array([1]), db=np.array([1, 0]))
    tile = g["th"] * g["tw"] * g["to"]
    spad, acc = local_bytes(buffers(g["th"], g["tw"], g["to"], 1 + g["db"]))
    tiles = -(-d0 // g["th"]) * -(-d1 // g["tw"]) * -(-d2 // g["to"])
    load = loads * _dma_cycles(hw, 1, tile * FP32)
    store = _dma_cycles(hw, 1, tile * FP32)
    vec = passes * np.ceil(tile / hw.vector_lanes)
    channel = (loads + 1) * tile * FP32 / hw.dma_bandwidth_bytes_per_cycle
    busiest = np.maximum(np.maximum(load, store), np.maximum(vec, channel))
    cost = (np.where(g["db"] == 1, tiles * busiest + load + vec + store, tiles * (load + vec + store))
            + 8.0 * tiles * (loads + 1 + np.ceil(passes)) - 1e-6 * g["to"])
    return _pick(ConvProblem(1, 1, 1, 1, 1), g, spad + 0 * tile, acc + 0 * tile, cost, hw, layer)


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

def node_problem(node) -> tuple[str, ConvProblem, Extras] | None:
    """(kind, problem, epilogue buffers) of a node that runs as a convolution, else None.

    kind is 'matrix' (conv/matmul on the array), 'depthwise' or 'pool' (vector unit, per channel);
    the epilogue's buffers are lower.buffers.Extras.
    """
    from .graph_ir import OpKind

    x = node.inputs[0]
    itemsize = 1 if x.dtype == "int8" else FP32
    if node.op == OpKind.CONV:
        (n, c, h, w), (o, cg, kh, kw) = x.shape, node.inputs[1].shape
        g = node.attr("groups")
        kind = "depthwise" if cg == 1 and o == g else "matrix"
        return kind, ConvProblem(n, c if kind == "depthwise" else cg, h, w, o if kind == "depthwise" else o // g,
                                 kh, kw, node.attr("stride"), node.attr("padding"), node.attr("dilation"), itemsize,
                                 kind == "depthwise" and itemsize == 1), epilogue_extras(node)
    if node.op == OpKind.MATMUL:
        (m, k), nn = x.shape[-2:], node.inputs[1].shape[-1]
        return "matrix", ConvProblem(1, k, 1, m, nn, itemsize=itemsize), epilogue_extras(node)
    if node.op == OpKind.POOL:
        *_, c, h, w = x.shape
        (kh, kw), stride = node.attr("window"), node.attr("strides")
        return "pool", ConvProblem(1, c, h, w, c, kh, kw, stride, node.attr("padding"), node.attr("dilation"),
                                   itemsize, itemsize == 1 and node.attr("func") != "max"), NO_EXTRAS
    return None


def layer_label(node) -> str:
    """How errors name a layer: its name in the schedule dump and its op."""
    return f"{node.name} ({node.op.value})"


def default_mapping(kind: str, p: ConvProblem, hw: HardwareConfig, extras=NO_EXTRAS,
                    layer: str = "conv") -> TileMapping:
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
        label = layer_label(node)
        if node.name in mappings:
            m = mappings.pop(node.name)
            spad, acc = footprint(kind, p, m, extras)
            if m.stacked and not (kind == "matrix" and p.stacks and not m.transposed):
                raise TilingError(f"{label}: mapping {m} is stacked, which needs an undilated matrix-unit "
                                  f"kernel of several rows, not transposed (have {kind}, {p.kh}x{p.kw}, "
                                  f"dilation {p.dilation})")
            if m.transposed and not (kind == "matrix" and p.turns):
                raise TilingError(f"{label}: mapping {m} is transposed, which needs a matrix-unit op whose "
                                  f"row stride is a multiple of its column stride (have {kind}, {p.stride})")
            if not fits(p, spad, acc, m.tile_oh, m.tile_ow, hw):
                raise TilingError(f"{label}: mapping {m} needs {spad} bytes of scratchpad (has "
                                  f"{hw.scratchpad_bytes}) and {acc} bytes of accumulator (has {hw.accumulator_bytes})")
        else:
            m = default_mapping(kind, p, hw, extras, label)
        out.append((node.name, m))
    if mappings:
        raise InputError(f"mappings for layers the graph does not have: {sorted(mappings)}")
    return Schedule(tuple(out))
