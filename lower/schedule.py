"""The schedule: a mapping (tile sizes, buffering, residency) for every op.

The default mapper is a fast heuristic: start from tiles that keep the array
busy, then halve the largest contributor until the tiles (double-buffered
where possible) fit the scratchpad and accumulator.  When nothing fits, the
error names the layer and the bytes a minimal tile needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stagec.isa.config import HardwareConfig

FP32 = 4
MAX_HALO = 65535


class TilingError(MemoryError):
    """No legal tiling: even the smallest tile does not fit the on-chip memories."""


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


@dataclass(frozen=True)
class TileMapping:
    """Output tile (rows x cols x channels), reduction tile, buffering, weight residency."""

    tile_oh: int
    tile_ow: int
    tile_o: int
    tile_c: int = 1
    double_buffer: bool = True
    weights_resident: bool = False

    def __str__(self) -> str:
        flags = [f for f, on in (("db", self.double_buffer), ("w-resident", self.weights_resident)) if on]
        return f"tile(oh={self.tile_oh}, ow={self.tile_ow}, o={self.tile_o}, c={self.tile_c}) {' '.join(flags)}"


def conv_footprint(p: ConvProblem, m: TileMapping, extras: int = 0) -> tuple[int, int]:
    """(scratchpad bytes, accumulator bytes) a mapping of `p` occupies."""
    bufs = 2 if m.double_buffer else 1
    ih, iw = p.halo(m.tile_oh, m.tile_ow)
    halo = ih * iw * m.tile_c * FP32
    weights = p.kh * p.kw * (p.c * p.o if m.weights_resident else m.tile_c * m.tile_o) * FP32
    out_tile = m.tile_oh * m.tile_ow * m.tile_o * FP32
    spad = bufs * halo + (1 if m.weights_resident else bufs) * weights + bufs * extras * out_tile
    return spad, bufs * out_tile


def window_footprint(p: ConvProblem, m: TileMapping, extras: int = 0, weighted: bool = True) -> tuple[int, int]:
    """Depthwise conv / pooling on the vector unit: channels stay separate (tile_o is the channel tile)."""
    bufs = 2 if m.double_buffer else 1
    ih, iw = p.halo(m.tile_oh, m.tile_ow)
    out_tile = m.tile_oh * m.tile_ow * m.tile_o * FP32
    weights = p.kh * p.kw * m.tile_o * FP32 if weighted else 0
    spad = bufs * (ih * iw * m.tile_o * FP32 + weights + extras * out_tile)
    return spad, bufs * out_tile


def _shrink(m: TileMapping, order) -> TileMapping | None:
    """Halve the first shrinkable field in `order` (fields above 1)."""
    for name in order:
        v = getattr(m, name)
        if v > 1:
            return replace(m, **{name: (v + 1) // 2})
    return None


def _fits(p, m, extras, hw, footprint) -> bool:
    spad, acc = footprint(p, m, extras)
    ih, iw = p.halo(m.tile_oh, m.tile_ow)
    return spad <= hw.scratchpad_bytes and acc <= hw.accumulator_bytes and max(ih, iw) <= MAX_HALO


def _search(p, start: TileMapping, extras, hw, footprint, layer: str) -> TileMapping:
    for db in (True, False):
        m = replace(start, double_buffer=db)
        while m is not None:
            if _fits(p, m, extras, hw, footprint):
                return m
            # Shrink the biggest of rows, then channels, then columns, keeping tiles array-shaped.
            order = sorted(("tile_oh", "tile_o", "tile_c", "tile_ow"), key=lambda f: -getattr(m, f))
            m = _shrink(m, order)
    smallest = replace(start, tile_oh=1, tile_ow=1, tile_o=1, tile_c=1, double_buffer=False, weights_resident=False)
    spad, acc = footprint(p, smallest, extras)
    raise TilingError(f"{layer}: no tiling fits: the smallest tile needs {spad} bytes of scratchpad "
                      f"(have {hw.scratchpad_bytes}) and {acc} bytes of accumulator (have {hw.accumulator_bytes})")


def map_conv(p: ConvProblem, hw: HardwareConfig, extras: int = 0, layer: str = "conv") -> TileMapping:
    """Default mapping on the matrix unit: wide output tiles, channel tiles a few array widths."""
    tile_ow = min(p.ow, 64)
    tile_oh = min(p.oh, max(1, 256 // tile_ow))
    tile_o = min(p.o, 4 * hw.array_cols)
    tile_c = min(p.c, 4 * hw.array_rows)
    resident = p.kh * p.kw * p.c * p.o * FP32 <= hw.scratchpad_bytes // 4
    start = TileMapping(tile_oh, tile_ow, tile_o, p.c if resident else tile_c, True, resident)
    try:
        return _search(p, start, extras, hw, lambda p_, m, e: conv_footprint(p_, m, e), layer)
    except TilingError:
        if not resident:
            raise
        return _search(p, replace(start, weights_resident=False, tile_c=tile_c), extras, hw,
                       lambda p_, m, e: conv_footprint(p_, m, e), layer)


def map_window(p: ConvProblem, hw: HardwareConfig, extras: int = 0, weighted: bool = True,
               layer: str = "window") -> TileMapping:
    """Default mapping of depthwise conv / pooling on the vector unit (channels as lanes)."""
    tile_ow = min(p.ow, 32)
    tile_oh = min(p.oh, max(1, 128 // tile_ow))
    start = TileMapping(tile_oh, tile_ow, min(p.o, 4 * hw.vector_lanes), 1)
    return _search(p, start, extras, hw, lambda p_, m, e: window_footprint(p_, m, e, weighted), layer)


def map_vector(shape: tuple[int, ...], operands: int, hw: HardwareConfig, layer: str = "vector") -> TileMapping:
    """Elementwise/reduce/copy tiles over a (<= 3-D) iteration space [d0, d1, d2]:
    `operands` dense tiles (inputs, temporaries, result) per buffer."""
    d0, d1, d2 = (1,) * (3 - len(shape)) + tuple(shape)[-3:]
    m = TileMapping(tile_oh=min(d0, 64), tile_ow=min(d1, 64), tile_o=min(d2, 1024))

    def footprint(_, t, __):
        tile = t.tile_oh * t.tile_ow * t.tile_o * FP32 * operands
        return (2 if t.double_buffer else 1) * tile, 0

    unit = ConvProblem(1, 1, 1, 1, 1)
    return _search(unit, m, 0, hw, footprint, layer)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def tiles(total: int, tile: int):
    """(start, size) of each tile along one dim, the last one possibly smaller."""
    return [(s, min(tile, total - s)) for s in range(0, total, tile)]




# --- the schedule stage -----------------------------------------------------------------------

def node_problem(node) -> tuple[str, ConvProblem, int] | None:
    """(kind, problem, epilogue tiles) of a node that runs as a convolution, else None.

    kind is 'matrix' (conv/matmul on the array), 'depthwise' or 'pool' (vector unit, per channel).
    """
    from .graph_ir import OpKind
    from .tile_expr import plan

    def epilogue_tiles(first_extra: int) -> int:
        expr = node.attr("epilogue")
        extras = len(node.inputs) - first_extra
        return extras + (plan(expr, extras + 1, frozenset(range(extras + 1))).temps if expr else 0)

    if node.op == OpKind.CONV:
        (n, c, h, w), (o, cg, kh, kw) = node.inputs[0].shape, node.inputs[1].shape
        g = node.attr("groups")
        kind = "depthwise" if cg == 1 and o == g else "matrix"
        return kind, ConvProblem(n, c if kind == "depthwise" else cg, h, w, o if kind == "depthwise" else o // g,
                                 kh, kw, node.attr("stride"), node.attr("padding"), node.attr("dilation")), \
            epilogue_tiles(2)
    if node.op == OpKind.MATMUL:
        (m, k), nn = node.inputs[0].shape[-2:], node.inputs[1].shape[-1]
        return "matrix", ConvProblem(1, k, 1, m, nn), epilogue_tiles(2)
    if node.op == OpKind.POOL:
        *_, c, h, w = node.inputs[0].shape
        (kh, kw), stride = node.attr("window"), node.attr("strides")
        return "pool", ConvProblem(1, c, h, w, c, kh, kw, stride, node.attr("padding"), node.attr("dilation")), 0
    return None


@dataclass(frozen=True)
class Schedule:
    """A mapping for every node that runs as a convolution; vector ops tile at emission."""

    mappings: tuple[tuple[str, TileMapping], ...]

    def __getitem__(self, name: str) -> TileMapping:
        return dict(self.mappings)[name]

    def __str__(self) -> str:
        return "schedule {\n" + "\n".join(f"  {name}: {m}" for name, m in self.mappings) + "\n}"


def make_schedule(graph, hw: HardwareConfig) -> Schedule:
    out = []
    for node in graph.nodes:
        found = node_problem(node)
        if found is None:
            continue
        kind, p, extra = found
        if kind == "matrix":
            out.append((node.name, map_conv(p, hw, extra, node.name)))
        else:
            out.append((node.name, map_window(p, hw, extra, kind == "depthwise", node.name)))
    return Schedule(tuple(out))
