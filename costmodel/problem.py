"""A layer and a mapping as arrays: what the cost model's functions take, so they `vmap` and trace.

`LayerShape` holds everything about a conv-shaped layer that its emitted loop nest depends on
besides the mapping (lower.schedule.ConvProblem's dims, the fused epilogue, the repeat count);
`MappingArrays` is lower.schedule.TileMapping with every field a number (tile sizes may be
fractional and the three switches probabilities in the relaxed model).  Both are pytrees of
arrays of one shape: a batch of layers or mappings is one of each with batched fields.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import jax
import jax.numpy as jnp
import numpy as np

from stagec.lower.buffers import NO_EXTRAS, Extras
from stagec.lower.schedule import ConvProblem, TileMapping

KINDS = ("matrix", "depthwise", "pool")


@dataclass(frozen=True)
class LayerShape:
    """A conv-shaped layer: NCHW x OIHW dims, window geometry, epilogue and repeat count.

    kind: index into KINDS; tile_extras / channel_extras / fixed_bytes: the epilogue's tiles (operands
    and temporaries) per buffer set / 4-byte words per output channel / bytes held once
    (lower.buffers.Extras); tile_loads: the
    epilogue operands LOADed per output tile; epi_plain / epi_hard: VECTOR instructions per output tile
    of the epilogue (transcendental ones cost vector_cycles_per_transcendental per lane group);
    repeat: how many times the whole loop nest runs (batch of a matmul, groups of a conv).
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
    tile_extras: object
    channel_extras: object
    fixed_bytes: object
    tile_loads: object
    epi_plain: object
    epi_hard: object
    repeat: object

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
class MappingArrays:
    """lower.schedule.TileMapping as numbers: tile sizes, and the double-buffering,
    weight-residency, single-accumulator, transposed and stacked switches (0/1, or probabilities in
    the relaxed model; the tuner's space has no stacked switch: a stacked mapping comes from the grid
    search, the tuner's start and fallback)."""

    tile_oh: object
    tile_ow: object
    tile_o: object
    tile_c: object
    double_buffer: object
    weights_resident: object
    single_acc: object
    transposed: object
    stacked: object


for _cls in (LayerShape, MappingArrays):
    jax.tree_util.register_dataclass(_cls, data_fields=[f.name for f in fields(_cls)], meta_fields=[])


def layer_shape(kind: str, p: ConvProblem, extras=NO_EXTRAS, epilogue=(0, 0), repeat: int = 1,
                tile_loads: int = 0) -> LayerShape:
    """One layer as a LayerShape of float32 scalars (stack several with `stack`)."""
    (pt, pb), (pl, pr) = p.padding
    extras = Extras(*extras)
    values = dict(kind=KINDS.index(kind), n=p.n, c=p.c, h=p.h, w=p.w, o=p.o, kh=p.kh, kw=p.kw,
                  stride_h=p.stride[0], stride_w=p.stride[1], pad_top=pt, pad_bottom=pb, pad_left=pl, pad_right=pr,
                  dilation_h=p.dilation[0], dilation_w=p.dilation[1], tile_extras=extras.tiles,
                  channel_extras=extras.channel_words, fixed_bytes=extras.fixed_bytes, tile_loads=tile_loads,
                  epi_plain=epilogue[0], epi_hard=epilogue[1], repeat=repeat)
    return LayerShape(**{k: np.float32(v) for k, v in values.items()})


def mapping_arrays(m: TileMapping) -> MappingArrays:
    return MappingArrays(*(np.float32(v) for v in (m.tile_oh, m.tile_ow, m.tile_o, m.tile_c, m.double_buffer,
                                                   m.weights_resident, m.single_acc, m.transposed, m.stacked)))


def to_tile_mapping(m: MappingArrays) -> TileMapping:
    """An integer MappingArrays (scalars) back as a TileMapping."""
    return TileMapping(*(int(round(float(v))) for v in (m.tile_oh, m.tile_ow, m.tile_o, m.tile_c)),
                       bool(round(float(m.double_buffer))), bool(round(float(m.weights_resident))),
                       bool(round(float(m.single_acc))), bool(round(float(m.transposed))),
                       bool(round(float(m.stacked))))


def stack(items):
    """A list of LayerShape (or MappingArrays) as one whose fields are arrays along a new first axis."""
    return jax.tree.map(lambda *xs: np.stack(xs), *items)


def broadcast_to(tree, shape):
    return jax.tree.map(lambda x: jnp.broadcast_to(x, shape), tree)
