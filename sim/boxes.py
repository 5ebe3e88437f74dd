"""Strided boxes of elements as slices and reshapes, for the batched executor's kernels.

A group's members read their operands at offsets that often form an affine grid of boxes (the
tiles of a layer); reading or writing such a grid as one strided slice, instead of gathering or
scattering every element, is what keeps large DMA groups and their readers fast.  A box is
((count, stride), ...), outermost first.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax


def box_positions(dims) -> np.ndarray:
    """The element offsets of a box ((count, stride), ...), outermost first."""
    pos = np.zeros(1, np.int64)
    for c, st in dims:
        pos = (pos[:, None] + np.arange(c) * st).reshape(-1)
    return pos


def box(strides, counts) -> tuple[tuple[int, int], ...]:
    """A pattern's ((count, stride), ...) from its strides and counts."""
    return tuple((int(c), int(st)) for c, st in zip(counts, strides, strict=True))


def read(P, rows, offs, rel, how):
    """Member values of producer array P [R, L] at rows/offs (T, J) through pattern rel -> (T, J, E);
    `how` (sim.fusion.how_to_read) says whether whole rows, an affine grid of boxes or a gather."""
    if how == "whole":          # every producer row entirely, in order
        return P.reshape(*rows.shape, -1)
    if how == "rows":           # whole rows, in another order
        return P[rows]
    if how != "gather":         # ("box", dims, live, span): an affine grid of boxes, as slices
        _, dims, live, span = how
        start = rows[0, 0] * P.shape[1] + offs[0, 0]
        return take_box(lax.dynamic_slice(P.reshape(-1), (start,), (span,)), dims, live).reshape(*rows.shape, -1)
    idx = (rows * P.shape[1] + offs)[..., None] + rel
    return P.reshape(-1).at[idx].get(mode="promise_in_bounds")


def grid(bases: np.ndarray, depth: int = 3) -> tuple | None:
    """The members' bases as an affine grid ((count, stride), ...), outermost first, or None."""
    t = len(bases)
    if t == 1:
        return ()
    d = int(bases[1] - bases[0])
    run = np.flatnonzero(bases - bases[0] != np.arange(t) * d)
    r = int(run[0]) if run.size else t
    if r == t:
        return ((t, d),)
    if depth == 1 or t % r:
        return None
    b = bases.reshape(t // r, r)
    if ((b - b[:, :1]) != np.arange(r) * d).any():
        return None
    outer = grid(b[:, 0], depth - 1)
    return None if outer is None else (*outer, (r, d))


def as_slices(dims, unique: bool):
    """A strided read or write of `dims` ((count, stride), ...; natural order) as nested slices:
    (live dims (natural index, count, stride) by decreasing stride, span), or None where the box
    overlaps itself (`unique`: or revisits an element) or is too sparse to be worth reading whole."""
    live = [(k, c, s) for k, (c, s) in enumerate(dims) if c > 1]
    if any(s < 0 for _, _, s in live) or (unique and any(s == 0 for _, _, s in live)):
        return None
    live = sorted((x for x in live if x[2] > 0), key=lambda x: -x[2])
    tail = 0
    for _, c, s in reversed(live):
        if tail >= s:
            return None
        tail += (c - 1) * s
    total = int(np.prod([c for _, c, _ in live], dtype=np.int64))
    if live and live[0][1] * live[0][2] > 8 * total + 4096:
        return None
    return tuple(live), tail + 1


def _fit(x, n: int):
    """x with its last axis cut or zero-padded to length n."""
    m = x.shape[-1]
    if m > n:
        return x[..., :n]
    if m < n:
        return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - m)])
    return x


def take_box(flat, dims, live):
    """flat[sum_j i_j * stride_j] for every index of dims, shaped by the dims' counts (natural order)."""
    x = flat
    for _, c, s in live:
        x = _fit(x, c * s).reshape(*x.shape[:-1], c, s)
    x = x[..., 0]
    order = sorted(range(len(live)), key=lambda i: live[i][0])
    x = x.transpose(order)
    keep = {k for k, _, _ in live}
    x = x.reshape([c if k in keep else 1 for k, (c, _) in enumerate(dims)])
    return jnp.broadcast_to(x, [c for c, _ in dims])


def in_live_order(vals, dims, live):
    """vals (dims' counts, natural order) with its axes the live dims', by decreasing stride."""
    natural = sorted(k for k, _, _ in live)
    return vals.reshape([dims[k][0] for k in natural]).transpose([natural.index(k) for k, _, _ in live])


def put_box(vals, dims, live, span):
    """The inverse of take_box: vals (dims' counts, natural order) laid out flat over span elements
    (zeros between the box's elements)."""
    x = in_live_order(vals, dims, live)[..., None]
    for _, c, s in reversed(live):
        x = _fit(x, s)
        x = x.reshape(*x.shape[:-2], c * s)
    return _fit(x, span)


def natural_run(dims) -> tuple[tuple, int]:
    """(the dims outside the innermost run of dims (natural order) that is contiguous in memory, the
    run's length): values laid out in natural order are those runs one after another, as they are."""
    live = [(k, c, s) for k, (c, s) in enumerate(dims) if c != 1]
    inner, width = contiguous_run(live)
    return tuple((c, s) for _, c, s in live[:inner]), width


def contiguous_run(live) -> tuple[int, int]:
    """(how many live dims lie outside the box's innermost contiguous run, the run's length)."""
    inner, width = len(live), 1
    while inner and live[inner - 1][2] == width:
        inner -= 1
        width *= live[inner][1]
    return inner, width
