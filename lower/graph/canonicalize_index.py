"""canonicalize's rules for gathers and scatters: GATHERs of rows, and for a scatter (constant
indices only) a gather with a constant index map."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import LoweringError

from .builder import dtype_of, reshape_value, rule, transpose_value
from .graph_ir import OpKind, Step, Value


@rule("gather")
def gather(b, eqn, table, indices):
    """XLA gathers of whole slices by index (embedding lookups, take, advanced indexing,
    take_along_axis): the indexed dims of the table become one row dim, the index vectors one flat
    row number, and the rest is a GATHER of rows. A batching dim (take_along_axis' other axes) is an
    indexed dim whose index is the position along the indices' matching dim."""
    dn, sizes = eqn.params["dimension_numbers"], tuple(eqn.params["slice_sizes"])
    shape, ishape = np.shape(table), np.shape(indices)
    batching = tuple(dn.operand_batching_dims)
    indexed = tuple(dn.start_index_map) + batching
    rest = [d for d in range(len(shape)) if d not in indexed]
    if (sorted(dn.collapsed_slice_dims) != sorted(dn.start_index_map)
            or any(sizes[d] != 1 for d in indexed) or any(sizes[d] != shape[d] for d in rest)):
        raise LoweringError(f"gather of partial slices (equation `{eqn}`)")
    rows = math.prod(shape[d] for d in indexed)
    width = math.prod(shape[d] for d in rest)
    flat = reshape_value(b, transpose_value(b, table, list(indexed) + rest), (rows, width))
    batch = ishape[:-1]
    parts = [reshape_value(b, _slice_last(b, indices, k), batch) for k in range(len(dn.start_index_map))]
    parts += [np.broadcast_to(np.arange(batch[d], dtype=np.int32).reshape([-1 if a == d else 1 for a in range(
        len(batch))]), batch) for d in dn.start_indices_batching_dims]
    row = parts[0]
    for k in range(1, len(indexed)):   # row-major: row = ((i0 * d1) + i1) * d2 + i2 ...
        if isinstance(row, Value) or isinstance(parts[k], Value):
            row = b.elementwise([row, np.int32(shape[indexed[k]]), parts[k]],
                                (Step("mul", (0, 1)), Step("add", (3, 2))), batch)
        else:
            row = row * np.int32(shape[indexed[k]]) + parts[k]
    out = b.emit(OpKind.GATHER, [flat, row], (*batch, width))
    out = reshape_value(b, out, (*batch, *(shape[d] for d in rest)))
    # XLA puts the slice dims at offset_dims among the batch dims
    offset = list(dn.offset_dims)
    order = [d for d in range(len(batch) + len(rest)) if d not in offset]
    perm = [0] * (len(batch) + len(rest))
    for i, d in enumerate(order):
        perm[d] = i
    for i, d in enumerate(offset):
        perm[d] = len(batch) + i
    return transpose_value(b, out, perm)


def _slice_last(b, x, k):
    if not isinstance(x, Value):
        return np.asarray(x)[..., k]
    shape = x.shape
    return b.emit(OpKind.SLICE, [x], (*shape[:-1], 1), start=(0,) * (len(shape) - 1) + (k,),
                  limit=shape[:-1] + (k + 1,), step=(1,) * len(shape))


# --- scatter -------------------------------------------------------------------------------------
# A scatter with constant indices is a gather with a constant index map. The operand is cut into
# rows (the widest trailing block the scatter moves whole), then:
# - overwrite: each output row is one row of concat(operand rows, update rows): one GATHER;
# - combine (add, mul, min, max): layer j holds, for each output row, its j-th incoming update row
#   (or a row of the combiner's identity), gathered and combined with the operand elementwise: one
#   GATHER and one vector pass per layer, as many layers as the most updates one row receives --
#   one for index_add, index_put(accumulate=True) and scatter_add of distinct indices. (A matmul by a
#   constant 0/1 matrix would cost operand rows x update rows MACs and a constant of that size.)

_SCATTER_COMBINERS = {"scatter-add": ("add", 0), "scatter-mul": ("mul", 1), "scatter-min": ("min", np.inf),
                      "scatter-max": ("max", -np.inf)}


@rule("scatter", *_SCATTER_COMBINERS)
def scatter(b, eqn, operand, indices, updates):
    indices = b.constant_of(indices)
    if indices is None:
        raise LoweringError(f"{eqn.primitive.name} with indices computed from the model's inputs (equation `{eqn}`, "
                            f"in {b.scope or 'the top level'}): stagec lowers scatters with constant indices only")
    shape = tuple(eqn.invars[0].aval.shape)
    targets = _scatter_targets(eqn, indices)
    width = _row_width(shape, targets)
    n_rows = math.prod(shape) // width
    rows = reshape_value(b, operand, (n_rows, width))
    update_rows = reshape_value(b, updates, (targets.size // width, width))
    row_targets = targets[::width] // width   # a dropped row stays -1
    if eqn.primitive.name == "scatter":
        out = _overwrite(b, rows, update_rows, row_targets)
    else:
        out = _combine(b, *_SCATTER_COMBINERS[eqn.primitive.name], rows, update_rows, row_targets)
    return reshape_value(b, out, shape)


def _scatter_targets(eqn, indices) -> np.ndarray:
    """The flat operand position each update element (row-major) lands on, -1 where the scatter drops
    it: JAX's own transpose of the scatter (a gather) applied to the positions, counted from 1 in
    float32 (exact below 2**24)."""
    operand, _, updates = (v.aval for v in eqn.invars)
    if operand.size >= 2**24:
        raise LoweringError(f"{eqn.primitive.name} into {operand.size} elements (at most 2**24; equation `{eqn}`)")
    p = eqn.params

    def scatter_add(u):
        return lax.scatter_add(jnp.zeros(operand.shape, jnp.float32), indices, u, p["dimension_numbers"],
                               mode=p["mode"])
    _, transpose = jax.vjp(scatter_add, jnp.zeros(updates.shape, jnp.float32))
    (landed,) = transpose(np.arange(1, operand.size + 1, dtype=np.float32).reshape(operand.shape))
    return np.asarray(landed).astype(np.int64).ravel() - 1


def _row_width(shape, targets: np.ndarray) -> int:
    """The widest trailing block of the operand that every run of update elements fills whole."""
    for k in range(len(shape) + 1):
        width = math.prod(shape[k:])
        if targets.size % width:
            continue
        runs = targets.reshape(-1, width)
        whole = (runs[:, :1] % width == 0) & (runs == runs[:, :1] + np.arange(width)).all(1, keepdims=True)
        if (whole | (runs == -1).all(1, keepdims=True)).all():
            return width
    raise AssertionError("a width of 1 always fits")


def _overwrite(b, rows, update_rows, row_targets):
    n_rows = np.shape(rows)[0]
    source = np.arange(n_rows)   # output row i is row source[i] of concat(operand rows, update rows)
    landed = np.flatnonzero(row_targets >= 0)
    source[row_targets[landed]] = n_rows + landed
    if (source < n_rows).all():
        return rows
    if (source >= n_rows).all():   # every row overwritten: the operand is not read
        table, source = update_rows, source - n_rows
    else:
        table = b.emit(OpKind.CONCAT, [rows, update_rows], (n_rows + np.shape(update_rows)[0], np.shape(rows)[1]),
                       axis=0)
    return b.emit(OpKind.GATHER, [table, source.astype(np.int32)], np.shape(rows))


def _combine(b, func, identity, rows, update_rows, row_targets):
    n_rows, width = np.shape(rows)
    n_updates = np.shape(update_rows)[0]
    landed = np.flatnonzero(row_targets >= 0)
    order = landed[np.argsort(row_targets[landed], kind="stable")]
    target = row_targets[order]
    rank = np.arange(target.size) - np.searchsorted(target, target)   # among the updates to the same row
    layers = np.full((rank.max(initial=-1) + 1, n_rows), n_updates, np.int32)   # n_updates: the identity row
    layers[rank, target] = order
    dtype = dtype_of(update_rows)
    if dtype == "int32" and np.isinf(identity):
        identity = np.iinfo(np.int32).min if identity < 0 else np.iinfo(np.int32).max
    table = b.emit(OpKind.CONCAT, [update_rows, np.full((1, width), identity, dtype)], (n_updates + 1, width), axis=0)
    out = rows
    for layer in layers:
        out = b.elementwise([out, b.emit(OpKind.GATHER, [table, layer], (n_rows, width))], (Step(func, (0, 1)),),
                            (n_rows, width))
    return out
