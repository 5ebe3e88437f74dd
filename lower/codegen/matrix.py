"""Convolution and matmul on the matrix unit.

Every matrix-unit op is emitted as a 2-D convolution over NCHW views (a matmul
is the 1x1 convolution of a 1xM image).  Per output tile (rows x cols x out
channels) and input-channel tile:

    LOAD  input halo [ih, iw, c] (padding filled by the DMA, VTA-style)
    LOAD  weights [kh*kw, c, o]          (once, when they fit resident)
    MATMUL per tap: A = the halo window for that tap (im2col as an address
          pattern), B = the tap's weights, C += into the accumulator tile
then the fused epilogue on the accumulator tile, and one STORE.  A transposed mapping
(schedule.TileMapping) swaps A and B, so the output channels stream through the array, and
COPYs each accumulator tile back to (rows, cols, channels) before the epilogue; a stacked
one LOADs each output row's kernel rows side by side and runs one MATMUL over the whole kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from stagec.errors import LoweringError
from stagec.isa.instructions import CLAMP_HEADER_WORDS, DType, Operand, Space, VectorFunc

from ..schedule.buffers import EPILOGUE_TILES, EPILOGUE_VECTORS, NO_EXTRAS, WORD, EpilogueLayout, slot_offsets
from ..schedule.nest import ConvProblem, LayerShape, TileMapping, row_tiles, tile_line, tiles
from ..schedule.nest_work import matrix_buffers, one_spatial_tile
from ..schedule.tensors import DramTensor
from . import tile_expr
from .emitter import ACC_DTYPE, local_type

# Tile axes of an NCHW output: rows (H), cols (W), channels (O).
OUT_AXES = (2, 3, 1)


class Epilogue:
    """A fused epilogue (lower.schedule.buffers.EpilogueLayout) over its extra inputs (views broadcast to the
    output's NCHW shape; records [N, C, H, W, words]: requant records, lut tables), in the nest's buffers (`bases`, from
    Emitter.allocate).

    Channel vectors and scalars are loaded once for the whole nest, or, `channels_per_tile` (a
    nest of one spatial tile, lower.schedule.nest_work.one_spatial_tile), a channel tile (`tile_o` channels)
    per output tile into one of `bufs` copies; tile inputs are loaded per output tile, each into a
    slot of one of `bufs` EPILOGUE_TILES buffers (with the temporaries; slots of `tile_elements`
    elements, each as wide as its widest value).
    """

    def __init__(self, em, layout: EpilogueLayout | None, extras: list[DramTensor], bases: dict[str, list[int]],
                 tile_o: int, channels: int, bufs: int, tile_elements: int, channels_per_tile: bool = False,
                 channel0: int = 0, origin: tuple[int, int] = (0, 0), fill: Callable | None = None):
        """`channel0`: the layer's channel the nest's first output channel is (a group's of a grouped conv);
        `origin`: the (row, col) the output's first lies at in the nest's (a cascade's member ahead of a
        depthwise one computes the depthwise's padded input: lower.codegen.halo.padded), `fill` its nest's
        (a tile input's tile all outside the output is zeros)."""
        self.layout, self.extras, self.origin, self.fill = layout, extras, origin, fill
        channels, copies = (tile_o, bufs) if channels_per_tile else (channels, 1)
        vectors = bases[EPILOGUE_VECTORS][0]
        self.vectors = {k: [vectors + at for at in offsets]   # input -> base of each copy
                        for k, offsets in (layout.vector_offsets(channels, copies) if layout else {}).items()}
        self.per_tile = channels_per_tile
        inputs = layout.inputs if layout else ()
        for k, i in enumerate(inputs):
            if i.table:
                _load_table(em, extras[k], i, channel0, self.vectors[k][0])
            elif i.kind == "scalar" or not channels_per_tile and i.kind == "channel":
                _load_channels(em, extras[k], i.record, 0, channels if i.kind == "channel" else 1, self.vectors[k][0])
        owned = [k for k, i in enumerate(inputs) if i.kind == "tile"]
        offsets = slot_offsets(layout.tile_widths, tile_elements) if layout else []
        slots = [[base + at for at in offsets] for base in bases[EPILOGUE_TILES]]
        self.tile_buf = [dict(zip(owned, at, strict=False)) for at in slots]
        self.temp_buf = [at[len(owned):] for at in slots]

    def emit(self, em, acc_tile: tile_expr.LocalTile, n: int, o0: int, h0: int, w0: int, counts, buf: int,
             final: tile_expr.LocalTile | None = None, typed: bool = False):
        """Run the epilogue on `acc_tile` (holding output box counts at (n, o0, h0, w0)); return the result
        tile: `final` (a scratchpad tile) when given, which frees the accumulator tile before the store.
        `typed`: the result in `final` as final's type (a cascade's intermediate, lower.codegen.cascade):
        a bf16 intermediate's float32, which a STORE would round, rounded by the epilogue's last step
        (lower.schedule.cascade.copies); without an epilogue, by a converting COPY."""
        if not self.layout:
            return acc_tile if final is None else _copy(em, acc_tile, final, counts, typed)
        args = [acc_tile]
        for k, (e, i) in enumerate(zip(self.extras, self.layout.inputs, strict=True)):
            if i.table:   # its header, then the biases of the nest's channels (one for all without a bias)
                each = i.itemsize // WORD > CLAMP_HEADER_WORDS + 1
                tile = tile_expr.LocalTile(Space.SPAD, self.vectors[k][0], (1, 1, counts[2] if each else 1),
                                           local_type(e.dtype), CLAMP_HEADER_WORDS + each * o0)
            elif i.kind == "tile":
                extent = i.extent(counts)
                tile = tile_expr.LocalTile(Space.SPAD, self.tile_buf[buf][k], extent, local_type(e.dtype))
                _load_tile(em, self.fill, e, i.spans, (n, o0, h0 - self.origin[0], w0 - self.origin[1]), extent,
                           tile.operand(extent))
            elif i.kind == "scalar":
                tile = tile_expr.LocalTile(Space.SPAD, self.vectors[k][0], (1, 1, 1), local_type(e.dtype))
            elif self.per_tile:
                base = self.vectors[k][buf]
                _load_channels(em, e, i.record, o0, counts[2], base)
                tile = tile_expr.LocalTile(Space.SPAD, base, (1, 1, counts[2]), local_type(e.dtype))
            else:
                held = local_type(e.dtype)
                per = i.itemsize if i.record else held.itemsize
                tile = tile_expr.LocalTile(Space.SPAD, self.vectors[k][0] + o0 * per, (1, 1, counts[2]), held)
            args.append(tile)
        temps = [tile_expr.LocalTile(Space.SPAD, b, tuple(counts)) for b in self.temp_buf[buf]]
        expr, plan = self.layout.expr, self.layout.plan
        last = tile_expr.value_dtypes(expr, [a.dtype for a in args])[-1]
        rounded = typed and final.dtype == DType.BF16 and last == DType.F32
        if typed and last != final.dtype and not rounded:
            return _copy(em, tile_expr.emit(em, expr, plan, args, temps, counts), final, counts, typed)
        return tile_expr.emit(em, expr, plan, args, temps, counts, final, rounded)


def _copy(em, tile: tile_expr.LocalTile, final: tile_expr.LocalTile, counts, typed: bool) -> tile_expr.LocalTile:
    """COPY `tile` to `final`'s place, converted to final's type where `typed`."""
    out = tile_expr.LocalTile(final.space, final.base, tuple(counts), final.dtype if typed else tile.dtype)
    em.vector(VectorFunc.COPY, out.operand(counts), tile.operand(counts), None, counts, dtype=tile.dtype,
              out_dtype=out.dtype)
    return out


def _load_tile(em, fill: Callable, e: DramTensor, spans, start, extent, dst: Operand) -> None:
    """LOAD a tile input's `extent` (rows, cols, channels; one along the axes it does not span) at `start`
    into `dst`.  Rows and columns outside the output (a cascade's padded member's: Epilogue's origin) are
    zeros, not read: the mask of the member just ahead of the depthwise zeroes what they give
    (lower.codegen.halo); a tile all outside it is `fill`ed with zeros."""
    n, o0, h0, w0 = start
    cuts = [(0, 0) if not s else (max(-x0, 0), max(x0 + c - size, 0))
            for x0, c, size, s in zip((h0, w0), extent, e.shape[2:], spans, strict=False)]
    inner = [c - a - b for c, (a, b) in zip(extent, cuts, strict=False)] + [extent[2]]
    if min(inner) <= 0:
        fill(dst, extent, 0.0, local_type(e.dtype))
        return
    (top, bottom), (left, right) = cuts
    em.load(e, (n, o0, h0 + top if spans[0] else 0, w0 + left if spans[1] else 0), OUT_AXES, tuple(inner), dst,
            pad=(top, bottom, left, right, 0, 0))


def _load_channels(em, e: DramTensor, record: bool, o0: int, count: int, base: int) -> None:
    """LOAD channels o0 .. o0 + count of a per-channel epilogue input (a vector, or records of
    e.shape[-1] words; one of them for a scalar)."""
    if not record:
        em.load(e, (0, o0, 0, 0), OUT_AXES, (1, 1, count), Operand(Space.SPAD, base, (0, 0, 1)))
        return
    per = e.shape[-1]
    if count > 1 and (e.strides[1], e.strides[-1]) != (per, 1):   # rows and columns: see Epilogue
        raise ValueError(f"{em.layer_name}: records must be dense along the channels")
    _load_words(em, e, e.address((0, o0, 0, 0, 0)), count * per, base)


def _load_words(em, e: DramTensor, address: int, words: int, base: int) -> None:
    """LOAD `words` consecutive elements of `e`'s region from `address` to the scratchpad at `base`."""
    em.load(DramTensor(e.region, address, (words,), (1,), e.dtype), (0,), (None, None, 0), (1, 1, words),
            Operand(Space.SPAD, base, (0, 0, 1)))


def _load_table(em, e: DramTensor, i, channel0: int, base: int) -> None:
    """LOAD a clamp table (`e`: its words last, i: its EpilogueInput) as the nest holds it: whole, or
    (i.loads == 2, a group of a grouped conv) its header, then the group's biases from `channel0`."""
    start, words = e.address((0,) * e.rank), i.itemsize // WORD
    if i.loads == 1:
        _load_words(em, e, start, words, base)
        return
    _load_words(em, e, start, CLAMP_HEADER_WORDS, base)
    _load_words(em, e, start + (CLAMP_HEADER_WORDS + channel0) * WORD, words - CLAMP_HEADER_WORDS,
                base + CLAMP_HEADER_WORDS * WORD)


def emit_conv(em, p: ConvProblem, m: TileMapping, x: DramTensor, w: DramTensor, out: DramTensor,
              epilogue: EpilogueLayout | None = None, extras: list[DramTensor] = (),
              fill: Callable | None = None, channel0: int = 0) -> None:
    """Emit a whole convolution; x [N,C,H,W], w [O,C,KH,KW], out [N,O,OH,OW] are DRAM views.  Float32
    operands accumulate in float32, int8 ones in int32 (the epilogue then sees an int32 tile).
    `channel0`: the layer's channel out's first is (a group's of a grouped conv)."""
    nest = _ConvNest(em, p, m, x, w, epilogue, fill)
    epi = nest.start(extras, channel0)

    def store(n, o0, oh0, ow0, counts, result):
        em.store(out, (n, o0, oh0, ow0), OUT_AXES, counts, result.operand(counts))

    for n in range(p.n):
        for oh0, th in row_tiles(p, m):
            for ow0, tw in tiles(p.ow, m.tile_ow):
                for _ in nest.spatial_tile(epi, n, oh0, th, ow0, tw, store):
                    pass


def _check_operands(em, p: ConvProblem, x: DramTensor, w: DramTensor) -> None:
    if x.dtype != w.dtype or x.dtype not in ACC_DTYPE:
        raise TypeError(f"{em.layer_name}: the array multiplies float32, bf16 or int8 operands, not {x.dtype.name} "
                        f"by {w.dtype.name}")
    if x.dtype.itemsize != p.itemsize:
        raise AssertionError(f"{em.layer_name}: internal error: {x.dtype.name} operands of a problem of "
                             f"{p.itemsize}-byte elements")


class _ConvNest:
    """One convolution's nest on the matrix unit, emitted piece by piece in nest order: its buffers
    (Emitter.allocate of the nest's list), the weights' k order, and the running counts of halos,
    weight tiles and output tiles that pick each one's buffer."""

    def __init__(self, em, p: ConvProblem, m: TileMapping, x: DramTensor | None, w: DramTensor,
                 epilogue: EpilogueLayout | None, fill: Callable | None, bases: dict | None = None):
        """`bases`: the nest's buffers where a cascade allocated them (lower.codegen.cascade), without a
        halo where it reads its input from the scratchpad (then `x` is None)."""
        if x is not None:
            _check_operands(em, p, x, w)
        self.em, self.p, self.m, self.x, self.w, self.fill = em, p, m, x, w, fill
        self.epilogue = epilogue
        self.acc_type = ACC_DTYPE[w.dtype]   # the operands' type, x's as well (_check_operands)
        self.bufs = 2 if m.double_buffer else 1
        self.shape = LayerShape.of("matrix", p, epilogue.extras if epilogue else NO_EXTRAS)
        self.one = bool(one_spatial_tile(self.shape, m, np))
        self.bases = em.allocate(matrix_buffers(self.shape, m, np)) if bases is None else bases
        self.taps = p.kh * p.kw
        # the weights' k order: (kernel row, kernel column, channel), stacked (kernel column, kernel row, channel).
        # Resident, they are held a channel tile after another, each [taps][channels of the tile][O], so
        # that a MATMUL's k (a kernel row's or the whole kernel's taps over the tile's channels) is one run
        self.w_axes = (3, 2, 1, 0) if m.stacked else (2, 3, 1, 0)
        self.w_counts = (p.kw, p.kh) if m.stacked else (p.kh, p.kw)
        self.c_tiles = tiles(p.c, m.tile_c)
        # one accumulator tile: the epilogue writes its result to the scratchpad, so the next tile's
        # MATMULs wait for the epilogue only, not the store; a transposed nest's COPY does that already
        self.final = tile_expr.LocalTile(Space.SPAD, self.bases["result"][0], (1, 1, 1)) \
            if self.bases["result"] else None
        self.n_halo = self.n_w = self.n_out = 0
        self.shared = None   # the spatial tile's halo, where one LOAD serves every output-channel tile

    def start(self, extras, channel0: int = 0, origin: tuple[int, int] = (0, 0)) -> Epilogue:
        """LOAD what the nest holds throughout (resident weights, the epilogue's whole vectors); its Epilogue
        (`channel0`: emit_conv's, `origin`: a cascade's, Epilogue's)."""
        self.load_resident_weights()
        m = self.m
        return Epilogue(self.em, self.epilogue, list(extras), self.bases, m.tile_o, self.p.o, self.bufs,
                        m.tile_oh * m.tile_ow * m.tile_o, self.one, channel0, origin, self.fill)

    def spatial_tile(self, epi: Epilogue, n, oh0, th, ow0, tw, write, inside=None, into=None, outs=None,
                     ins=None, block=None, ahead: int = 0) -> Iterator[str | None]:
        """A spatial tile's output-channel tiles: their sums, epilogue, and write(n, o0, oh0, ow0, counts,
        result), yielding after each tile's epilogue (a cascade interleaves its members' tiles).  In a
        cascade (lower.codegen.cascade), `inside`: the scratchpad base of the tile's input, channel tiles
        one after another, each [rows][cols][its channels]; `into`: (base, type) of where the output goes
        in that form instead, the epilogue writing each tile there.  A chunked
        cascade's: `outs`, the output-channel tiles to run now (the halo LOADed with the first), or
        `ins`, the input-channel tiles to add to the sums now (the epilogue and write after the last);
        `inside` and `into` then hold those tiles alone.  `block`: (rows each channel tile holds in `into`,
        the row the tile starts at there) where the tile is some rows of a window (a line-buffered halo,
        lower.codegen.halo.computed), else (th, 0).  `ahead`: where not 0, the sums of that many tiles (at
        most the accumulator's buffers) run ahead of the first epilogue, and it yields "sums" after them."""
        p, m = self.p, self.m
        o_tiles = tiles(p.o, m.tile_o) if outs is None else outs
        if inside is None and len(self.c_tiles) == 1 and o_tiles[0][0] == 0:
            self.shared = self.load_halo(n, oh0, th, ow0, tw, 0, p.c)
        line, pitch = tile_line(self.shape, th, tw)   # transposed: C[o][line position], else C[row][col][o]
        summed = []
        for k, (o0, to) in enumerate(o_tiles):
            acc_tile = self.accumulate(n, oh0, th, ow0, tw, o0, to, self.shared, line, pitch, inside, ins, len(summed))
            if ins is not None and ins[-1] != self.c_tiles[-1]:   # later chunks add to the sums
                continue
            summed.append((o0, to, acc_tile))
            depth = max(ahead, 1)
            if len(summed) < depth and k < len(o_tiles) - 1:
                continue
            if ahead and k < depth:
                yield "sums"
            while summed and (len(summed) >= depth or k == len(o_tiles) - 1):
                o0, to, acc_tile = summed.pop(0)
                final = self.final
                if into is not None:
                    base, dtype = into
                    held, row0 = block or (th, 0)
                    at = ((o0 - o_tiles[0][0]) * held + row0 * to) * tw * dtype.itemsize
                    final = tile_expr.LocalTile(Space.SPAD, base + at, (th, tw, to), dtype)
                result = epi.emit(self.em, acc_tile, n, o0, oh0, ow0, (th, tw, to), self.n_out % self.bufs, final,
                                  typed=into is not None)
                if into is None:
                    write(n, o0, oh0, ow0, (th, tw, to), result)
                self.n_out += 1
                yield

    def load_resident_weights(self) -> None:
        """LOAD all the weights once, a channel tile after another, when the mapping keeps them resident."""
        if not self.m.weights_resident:
            return
        p, base = self.p, self.bases["weights"][0]
        for c0, tc in self.c_tiles:
            self.em.load_box(self.w, (0, c0, 0, 0), self.w_axes, (*self.w_counts, tc, p.o), Space.SPAD,
                             base + c0 * self.taps * p.o * self.w.dtype.itemsize, local=self.w.dtype)

    def load_halo(self, n, oh0, th, ow0, tw, c0, tc):
        """LOAD the input window of an output tile; returns (base, iw) or None if all padding."""
        p = self.p
        ih, iw = p.halo(th, tw)
        (pt, _), (pl, _) = p.padding
        r0, q0 = oh0 * p.stride[0] - pt, ow0 * p.stride[1] - pl
        top, left = max(0, -r0), max(0, -q0)
        bottom, right = max(0, r0 + ih - p.h), max(0, q0 + iw - p.w)
        if ih - top - bottom <= 0 or iw - left - right <= 0:
            return None
        if max(top, bottom, left, right) > 255:
            raise LoweringError(f"{self.em.layer_name}: padding of {max(top, bottom, left, right)} exceeds the "
                                f"DMA's 255")
        base = self.bases["halo"][self.n_halo % len(self.bases["halo"])]
        self.n_halo += 1
        if self.m.stacked:
            self._load_stacked_rows(base, n, r0, q0, th, iw, left, right, c0, tc)
        else:
            self.em.load(self.x, (n, c0, r0 + top, q0 + left), (2, 3, 1), (ih - top - bottom, iw - left - right, tc),
                         Operand(Space.SPAD, base, (iw * tc, tc, 1)), pad=(top, bottom, left, right, 0, 0),
                         local=self.x.dtype)
        return base, iw

    def _load_stacked_rows(self, base, n, r0, q0, th, iw, left, right, c0, tc) -> None:
        """A stacked halo: each output row's kernel rows side by side, [column][kernel row][channel]; a
        row whose kernel rows are all padding is filled with zeros."""
        p, x = self.p, self.x
        for r in range(th):
            row = base + r * iw * p.kh * tc * x.dtype.itemsize
            first = r0 + r * p.stride[0]
            above, below = max(0, -first), max(0, first + p.kh - p.h)
            if above + below >= p.kh:
                self.fill(Operand(Space.SPAD, row, (p.kh * tc, tc, 1)), (iw, p.kh, tc), 0.0, x.dtype)
                continue
            self.em.load(x, (n, c0, first + above, q0 + left), (3, 2, 1), (iw - left - right, p.kh - above - below, tc),
                         Operand(Space.SPAD, row, (p.kh * tc, tc, 1)), pad=(left, right, above, below, 0, 0),
                         local=x.dtype)

    def accumulate(self, n, oh0, th, ow0, tw, o0, to, shared, line, pitch, inside=None,
                   ins=None, later: int = 0) -> tile_expr.LocalTile:
        """An output tile's sums over every input-channel tile (those of `ins`, added to the sums of the
        ones before, where given), zero where its whole receptive field is padding, as a (rows, cols,
        channels) tile: the accumulator tile, or a transposed nest's COPY of it out of C[o][line
        position].  `inside`: a cascade's input in the scratchpad (spatial_tile); `later`: the tiles whose
        sums are held ahead of this one's (their epilogues not yet emitted), each in its own buffer."""
        m, acc_type = self.m, self.acc_type
        c_base = self.bases["accumulator"][(self.n_out + later) % m.acc_buffers]
        c_op = Operand(Space.ACC, c_base, (0, line, 1) if m.transposed else (tw * to, to, 1))
        c_tiles = self.c_tiles if ins is None else ins
        first = c_tiles[0] == self.c_tiles[0]
        for c0, tc in c_tiles:
            if inside is not None:
                halo = inside + (c0 - c_tiles[0][0]) * th * tw * self.w.dtype.itemsize, tw
            else:
                halo = shared if len(self.c_tiles) == 1 else self.load_halo(n, oh0, th, ow0, tw, c0, tc)
            if halo is None:
                continue
            self.matmuls(c_op, halo, self.weights(o0, to, c0, tc), th, tw, tc, to, line, accumulate=not first)
            first = False
        if first:   # the whole receptive field is padding: the sum is zero
            self.fill(c_op, (1, to, line) if m.transposed else (th, tw, to), 0.0, acc_type)
        if not m.transposed:
            return tile_expr.LocalTile(Space.ACC, c_base, (th, tw, to), acc_type)
        turned = tile_expr.LocalTile(Space.SPAD, self.bases["turned"][(self.n_out + later) % m.acc_buffers],
                                     (th, tw, to), acc_type)
        self.em.vector(VectorFunc.COPY, turned.operand((th, tw, to)), Operand(Space.ACC, c_base, (pitch, 1, line)),
                       None, (th, tw, to), dtype=acc_type)
        return turned

    def weights(self, o0, to, c0, tc) -> tuple[int, int, int]:
        """(base, k stride, tap stride) in the scratchpad of the weights of a tile of output channels and
        of input channels: where they are resident, else LOADed now into the next weight buffer."""
        p, wb = self.p, self.w.dtype.itemsize
        if self.m.weights_resident:
            return self.bases["weights"][0] + (c0 * self.taps * p.o + o0) * wb, p.o, tc * p.o
        base = self.bases["weights"][self.n_w % self.bufs]
        self.n_w += 1
        self.em.load_box(self.w, (o0, c0, 0, 0), self.w_axes, (*self.w_counts, tc, to), Space.SPAD, base,
                         local=self.w.dtype)
        return base, to, tc * to

    def matmuls(self, c_op: Operand, halo, weights, th, tw, tc, to, line, accumulate: bool) -> None:
        """One input-channel tile's MATMULs into the accumulator tile `c_op`: the first accumulates onto
        it or not as `accumulate` says, the others do."""
        p, m, dtype = self.p, self.m, self.w.dtype
        (h_base, iw), (w_base, k_stride, tap_stride) = halo, weights
        xb = wb = dtype.itemsize
        (sh, sw), (dh, dw) = p.stride, p.dilation
        if m.stacked:   # k = (kernel column, kernel row, channel), contiguous in the halo
            self.em.matmul(Operand(Space.SPAD, h_base, (iw * p.kh * tc, sw * p.kh * tc, 1)),
                           Operand(Space.SPAD, w_base, (k_stride, 1, 0)), c_op, th, tw, self.taps * tc, to,
                           accumulate=accumulate, dtype=dtype)
            return
        # With unit column dilation a kernel row's taps are contiguous in the halo
        # ((kw, c) -> kw * tc + c) and in the weights: one MATMUL of k = kw * tc.
        fold = p.kw if dw == 1 else 1
        for kh in range(p.kh):
            for kw in range(0, p.kw, fold):
                a_base = h_base + (kh * dh * iw * tc + kw * dw * tc) * xb
                b_base = w_base + (kh * p.kw + kw) * tap_stride * wb
                if m.transposed:   # A: the weights' transpose [o][k]; B: the halo's [k][line]
                    self.em.matmul(Operand(Space.SPAD, b_base, (0, 1, k_stride)),
                                   Operand(Space.SPAD, a_base, (1, sw * tc, 0)), c_op, 1, to, fold * tc, line,
                                   accumulate=accumulate, dtype=dtype)
                else:
                    self.em.matmul(Operand(Space.SPAD, a_base, (sh * iw * tc, sw * tc, 1)),
                                   Operand(Space.SPAD, b_base, (k_stride, 1, 0)), c_op, th, tw, fold * tc, to,
                                   accumulate=accumulate, dtype=dtype)
                accumulate = True


def as_conv(t: DramTensor, role: str) -> DramTensor:
    """A 2-D matmul operand as an NCHW conv view: a[M,K] -> x[1,K,1,M]; b[K,N] -> w[N,K,1,1];
    out[M,N] -> [1,N,1,M]; dims past the first two (a requant record's words) stay last."""
    (d0, d1, *dr), (s0, s1, *sr) = t.shape, t.strides
    if role == "w":
        return DramTensor(t.region, t.offset, (d1, d0, 1, 1, *dr), (s1, s0, 0, 0, *sr), t.dtype)
    return DramTensor(t.region, t.offset, (1, d1, 1, d0, *dr), (0, s1, 0, s0, *sr), t.dtype)
