"""canonicalize's rules for data movement: broadcasts, reshapes, transposes and slices (views,
mostly), pads and concatenations."""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import LoweringError

from .builder import out_shape, reshape_value, rule, transpose_value
from .graph_ir import OpKind


@rule("broadcast_in_dim")
def broadcast_in_dim(b, eqn, x):
    shape, dims = tuple(eqn.params["shape"]), tuple(eqn.params["broadcast_dimensions"])
    if np.shape(x) == shape:
        return x
    return b.emit(OpKind.BROADCAST, [x], shape, dims=dims)


@rule("tile")
def tile(b, eqn, x):
    """jnp.tile (torch's repeat): each axis of size s as (1, s), broadcast to (reps, s), merged back."""
    shape, reps = np.shape(x), tuple(eqn.params["reps"])
    pairs = reshape_value(b, x, tuple(d for s in shape for d in (1, s)))
    wide = tuple(d for r, s in zip(reps, shape, strict=True) for d in (r, s))
    return reshape_value(b, b.emit(OpKind.BROADCAST, [pairs], wide, dims=tuple(range(len(wide)))), out_shape(eqn))


@rule("reshape")
def reshape(b, eqn, x, *dyn):
    return reshape_value(b, x, eqn.params["new_sizes"])


@rule("squeeze", "expand_dims")
def squeeze(b, eqn, x):
    return reshape_value(b, x, out_shape(eqn))


@rule("transpose")
def transpose(b, eqn, x):
    return transpose_value(b, x, eqn.params["permutation"])


@rule("slice")
def slice_(b, eqn, x):
    p = eqn.params
    step = tuple(p["strides"] or (1,) * len(p["start_indices"]))
    return b.emit(OpKind.SLICE, [x], out_shape(eqn), start=tuple(p["start_indices"]),
                  limit=tuple(p["limit_indices"]), step=step)


@rule("pad")
def pad(b, eqn, x, value):
    config = [tuple(int(n) for n in axis) for axis in eqn.params["padding_config"]]   # jnp.pad gives numpy ints
    if any(interior for _, _, interior in config):
        raise LoweringError(f"pad with interior padding (equation `{eqn}`)")
    if all(lo == hi == 0 for lo, hi, _ in config):   # a pad of nothing (a 1x1 conv's "same" padding): x itself
        return x
    shape = np.shape(x)
    if any(lo < 0 or hi < 0 for lo, hi, _ in config):   # negative padding crops: a slice first
        cropped = tuple(d + min(lo, 0) + min(hi, 0) for d, (lo, hi, _) in zip(shape, config, strict=True))
        x = b.emit(OpKind.SLICE, [x], cropped,
                   start=tuple(max(-lo, 0) for lo, _, _ in config),
                   limit=tuple(d - max(-hi, 0) for d, (_, hi, _) in zip(shape, config, strict=True)),
                   step=(1,) * len(shape))
    return b.emit(OpKind.PAD, [x], out_shape(eqn), lo=tuple(max(lo, 0) for lo, _, _ in config),
                  hi=tuple(max(hi, 0) for _, hi, _ in config), value=float(np.asarray(value)))


@rule("concatenate")
def concatenate(b, eqn, *xs):
    # an empty operand adds nothing (Phi-3's rotary embedding over the whole head: its pass-through part)
    xs = [x for x in xs if math.prod(np.shape(x)) > 0]
    if len(xs) == 1:
        return xs[0]
    return b.emit(OpKind.CONCAT, xs, out_shape(eqn), axis=int(eqn.params["dimension"]))
