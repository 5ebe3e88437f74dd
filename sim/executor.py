"""The batched executor: runs a Plan group by group, each group one jitted function.

A load from the data region that one group reads whole runs inside that group's
function (when no store between overwrites its bytes), so XLA reads the DRAM box
straight into the layout the compute wants; so does a vector op that one compute
group reads whole (one pass instead of two).  A join lays out the values a read
spans (plan.py) as local memory holds them.  Compiled functions are cached by
the group's static signature, so a shape met once (in this program or an earlier
one) is never compiled again; the dynamic parts (which rows, at which offsets,
which DRAM addresses) are arguments.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import ReferenceFallbackWarning
from stagec.isa.instructions import AccMode, DType, PadValue
from stagec.isa.opcodes import VECTOR_FUNCS, check_gather_indices
from stagec.isa.program import Program
from stagec.isa.semantics import ACCUMULATE, Namespace, accumulate, pad_value

from . import reference
from .fixed_point import requantize
from .plan import DRAM_CONST, Group, Plan, PlanError, box_positions, build_plan, offsets, read_dims


def _convert(x, to: DType):
    """COPY's conversion (isa.semantics.convert): float -> int truncates and saturates, NaN -> 0."""
    t = to.numpy
    if jnp.issubdtype(x.dtype, jnp.floating) and np.issubdtype(t, np.integer):
        info = np.iinfo(t)
        x = jnp.clip(jnp.nan_to_num(jnp.trunc(x), nan=0.0), info.min, info.max)
    return x.astype(t)


JAX = Namespace(jnp, lax.erf, lax.rsqrt, requantize, _convert)   # the vector functions' semantics, in JAX
HIGHEST = lax.Precision.HIGHEST


def _read(P, rows, offs, rel, how):
    """Member values of producer array P [R, L] at rows/offs (T, J) through pattern rel -> (T, J, E)."""
    if how == "whole":          # every producer row entirely, in order
        return P.reshape(*rows.shape, -1)
    if how == "rows":           # whole rows, in another order
        return P[rows]
    if how != "gather":         # ("box", dims, live, span): an affine grid of boxes, as slices
        _, dims, live, span = how
        start = rows[0, 0] * P.shape[1] + offs[0, 0]
        return _take_box(lax.dynamic_slice(P.reshape(-1), (start,), (span,)), dims, live).reshape(*rows.shape, -1)
    idx = (rows * P.shape[1] + offs)[..., None] + rel
    return P.reshape(-1).at[idx].get(mode="promise_in_bounds")


# --- DMA groups over a regular grid of boxes: slices and reshapes instead of gathers and scatters ---

def _grid(bases: np.ndarray, depth: int = 3) -> tuple | None:
    """The members' DRAM bases as an affine grid ((count, stride), ...), outermost first, or None."""
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
    outer = _grid(b[:, 0], depth - 1)
    return None if outer is None else (*outer, (r, d))


def _box(dims, unique: bool):
    """A strided read or write of `dims` ((count, stride), ...; natural order) as nested slices:
    (live dims (natural index, count, stride) by decreasing stride, span), or None where the box
    overlaps itself or is too sparse to be worth reading whole."""
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


def _take_box(flat, dims, live):
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


def _in_live_order(vals, dims, live):
    """vals (dims' counts, natural order) with its axes the live dims', by decreasing stride."""
    natural = sorted(k for k, _, _ in live)
    return vals.reshape([dims[k][0] for k in natural]).transpose([natural.index(k) for k, _, _ in live])


ROW_SCATTER = lax.ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=(0,))


def _put_box(vals, dims, live, span):
    """The inverse of _take_box: vals (dims' counts, natural order) laid out flat over span elements
    (zeros between the box's elements)."""
    x = _in_live_order(vals, dims, live)[..., None]
    for _, c, s in reversed(live):
        x = _fit(x, s)
        x = x.reshape(*x.shape[:-2], c * s)
    return _fit(x, span)


def _contiguous_run(live) -> tuple[int, int]:
    """(how many live dims lie outside the box's innermost contiguous run, the run's length)."""
    inner, width = len(live), 1
    while inner and live[inner - 1][2] == width:
        inner -= 1
        width *= live[inner][1]
    return inner, width


@functools.cache
def _load_fn(sig, grid=None):
    n, strides, pad, padval, _, dtype = sig
    fill = pad_value(PadValue(padval), dtype)
    box_dims = (*grid, *zip(n, strides, strict=True)) if grid is not None else None
    box = _box(box_dims, unique=False) if box_dims is not None else None
    if box is not None:
        live, span = box

        def run_box(mem, bases):
            v = _take_box(lax.dynamic_slice(mem, (bases[0],), (span,)), box_dims, live)
            v = v.reshape(-1, *n)
            if any(pad):
                v = jnp.pad(v, ((0, 0), (pad[0], pad[1]), (pad[2], pad[3]), (pad[4], pad[5])), constant_values=fill)
            return v.reshape(v.shape[0], -1)
        return jax.jit(run_box)

    dims = (n[0] + pad[0] + pad[1], n[1] + pad[2] + pad[3], n[2] + pad[4] + pad[5])
    i0, i1, i2 = np.meshgrid(*(np.arange(d) - pad[2 * k] for k, d in enumerate(dims)), indexing="ij")
    inside = ((i0 >= 0) & (i0 < n[0]) & (i1 >= 0) & (i1 < n[1]) & (i2 >= 0) & (i2 < n[2])).reshape(-1)
    rel = np.where(inside, (i0 * strides[0] + i1 * strides[1] + i2 * strides[2]).reshape(-1), 0).astype(np.int32)

    def run(mem, bases):
        v = mem.at[bases[:, None] + rel].get(mode="promise_in_bounds")
        return v if inside.all() else jnp.where(inside, v, fill)
    return jax.jit(run)


@functools.cache
def _gather_fn(sig, how):
    """Indirect DMA: each member's n0 row indices come from a local value; the rows are checked."""
    n, strides, index_stride, _, _ = sig
    rel_idx = offsets((index_stride, 0, 0), (n[0], 1, 1)).astype(np.int32)
    rel_row = offsets((0, strides[1], strides[2]), (1, n[1], n[2])).astype(np.int32)

    def run(mem, P, rows, offs, bases):
        idx = _read(P, rows, offs, rel_idx, how)[:, 0]                      # (T, n0)
        safe = jnp.where((idx < 0) | (idx >= n[3]), 0, idx)   # out-of-range rows are reported, not read
        addr = bases[:, None, None] + safe[..., None] * strides[0] + rel_row   # (T, n0, n1*n2)
        return mem.at[addr].get(mode="promise_in_bounds").reshape(idx.shape[0], -1), idx
    return jax.jit(run)


@functools.cache
def _store_fn(sig, how, grid=None):
    n, dram_strides, local, _ = sig
    rel_src = offsets(local, n).astype(np.int32)
    dims = (*grid, *zip(n, dram_strides, strict=True)) if grid is not None else None
    box = _box(dims, unique=True) if dims is not None else None
    if box is None:
        rel_dram = offsets(dram_strides, n).astype(np.int32)

        def run(data, P, rows, offs, bases):
            vals = _read(P, rows, offs, rel_src, how)
            idx = (bases[:, None] + rel_dram).reshape(-1)
            return data.at[idx].set(vals.reshape(-1), mode="promise_in_bounds", unique_indices=True)
        return jax.jit(run, donate_argnums=0)
    live, span = box
    inner, width = _contiguous_run(live)
    if width >= 64:
        # runs of `width` contiguous elements: one windowed scatter, in place (QK^T's 54 MB scores:
        # 17 ms against 44 ms for the padded layout below)
        starts = box_positions([(c, s) for _, c, s in live[:inner]]).astype(np.int32)[:, None]

        def run_rows(data, P, rows, offs, bases):
            vals = _in_live_order(_read(P, rows, offs, rel_src, how), dims, live).reshape(-1, width)
            return lax.scatter(data, bases[0] + starts, vals, ROW_SCATTER, indices_are_sorted=True,
                               unique_indices=True, mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS)
        return jax.jit(run_rows, donate_argnums=0)
    mask = np.zeros(span, bool)
    mask[box_positions(dims)] = True
    # two computations: XLA fuses the box's transposes and pads into an in-place update of the
    # whole DRAM array as one slow loop (54 MB: 57 ms against 38 ms apart)
    layout = jax.jit(lambda P, rows, offs: _put_box(_read(P, rows, offs, rel_src, how), dims, live, span))

    def write(data, new, bases):
        if not mask.all():
            new = jnp.where(mask, new, lax.dynamic_slice(data, (bases[0],), (span,)))
        return lax.dynamic_update_slice(data, new, (bases[0],))
    write = jax.jit(write, donate_argnums=0)
    return lambda data, P, rows, offs, bases: write(data, layout(P, rows, offs), bases)


@functools.cache
def _matmul_fn(sig, hows, grid, permuted):
    """One chain per member: out[t] = init[t] + sum_j A[t,j] @ B[t,j].  The members are blocks of
    `grid` = S distinct A reads x O distinct B reads (a tiled loop nest: spatial tiles x output-channel
    tiles, one block per attention head), so each A and B is read once; when `permuted`, `sel` puts
    the products in member order."""
    j, (m1, m0, k, n), pa, pb, pc, has_init, _, out_dtype = sig
    s, o = grid
    rel_a = offsets(pa, (m1, m0, k)).astype(np.int32)
    rel_b = offsets((*pb, 0), (k, n, 1)).astype(np.int32)
    rel_c = offsets(pc, (m1, m0, n)).astype(np.int32)
    acc = out_dtype.numpy

    def run(pa_, ra, oa, pb_, rb, ob, sel, *init):
        blocks = ra.shape[0] // s
        a = _read(pa_, ra, oa, rel_a, hows[0]).reshape(blocks, s, j, m1 * m0, k)
        b = _read(pb_, rb, ob, rel_b, hows[1]).reshape(blocks, o, j, k, n)
        out = jnp.einsum("bsjmk,bojkn->bsomn", a, b, precision=HIGHEST, preferred_element_type=acc)
        out = out.reshape(blocks * s * o, m1 * m0 * n)
        out = out[sel] if permuted else out
        if has_init:
            out = _read(*init, rel_c, hows[2]).reshape(out.shape) + out
        return out
    return jax.jit(run)


@functools.cache
def _vector_fn(sig, hows):
    """Each member a chain of vector ops: the function (isa.opcodes, in JAX) of each, accumulated."""
    j, func, acc, n, pd, p1, p2, has_init, _, out_dtype = sig
    f = VECTOR_FUNCS[func]
    rel1 = offsets(p1, n).astype(np.int32)
    rel2 = None
    if f.sources == 2:   # records (REQUANT's): f.src2_words words each, strides counting records
        rel2 = (offsets(p2, n)[:, None] * f.src2_words + np.arange(f.src2_words)).reshape(-1).astype(np.int32)
    rel_dst = offsets(pd, (n[0], n[1], 1) if f.reduction else n).astype(np.int32)
    words = (f.src2_words,) if f.src2_words > 1 else ()

    def run(*args):
        t = args[1].shape[0]
        sources = [_read(*args[:3], rel1, hows[0]).reshape(t, j, *n)]
        rest = args[3:]
        if f.sources == 2:
            sources.append(_read(*rest[:3], rel2, hows[1]).reshape(t, j, *n, *words))
            rest = rest[3:]
        init = _read(*rest, rel_dst, hows[2]).reshape(t, -1) if has_init else None
        if f.reads_dst:
            sources.append(init.reshape(sources[0].shape))
        v = JAX.convert(f.apply(JAX, *sources).reshape(t, j, -1), out_dtype)
        if acc == AccMode.OVERWRITE:
            return v[:, 0]
        return accumulate(JAX, acc, init, _chain(acc, v)) if has_init else _chain(acc, v)
    return jax.jit(run)


def _chain(acc: AccMode, v):
    """A chain's members' values (T, J, L) accumulated in order."""
    return getattr(jnp, ACCUMULATE[AccMode(acc)][1])(v, axis=1)


@functools.cache
def _join_fn(sig, hows):
    """Each member's value laid out from its pieces ((start, rows, row length): consecutive rows of a
    producer group), pasted in program order (a later writer's elements over an earlier one's, as
    local memory holds them)."""
    dtype, length, layout = sig
    rels = [np.arange(n, dtype=np.int32) for _, _, n in layout]

    def run(*args):
        out = jnp.zeros((args[1].shape[0], length), dtype.numpy)
        for j, ((start, rows, n), how) in enumerate(zip(layout, hows, strict=True)):
            piece = _read(*args[3 * j:3 * j + 3], rels[j], how).reshape(-1, rows * n)
            out = out.at[:, start:start + rows * n].set(piece)
        return out
    return jax.jit(run)


def _blocks(g: Group):
    """(A reads (B*S,), B reads (B*O,), sel, (S, O)): the members' (A read, B read) pairs as B blocks,
    each a full S x O grid, with sel each member's place in the blocks' products.  Members with no
    such structure are T blocks of 1 x 1."""
    a, b = g.reads["a"], g.reads["b"]
    _, ia, inv_a = np.unique(np.concatenate([a.rows, a.offs], 1), axis=0, return_index=True, return_inverse=True)
    _, ib, inv_b = np.unique(np.concatenate([b.rows, b.offs], 1), axis=0, return_index=True, return_inverse=True)
    pairs = list(zip(inv_a.reshape(-1).tolist(), inv_b.reshape(-1).tolist(), strict=True))
    partners: dict[int, list[int]] = {}
    for x, y in pairs:
        partners.setdefault(x, []).append(y)
    blocks: dict[tuple, list[int]] = {}   # the A reads that pair with one set of B reads
    for x, ys in partners.items():
        blocks.setdefault(tuple(sorted(ys)), []).append(x)
    shapes = {(len(xs), len(ys)) for ys, xs in blocks.items()}
    b_reads = [y for ys in blocks for y in ys]
    if len(shapes) != 1 or len(b_reads) != len(set(b_reads)) or len(set(pairs)) != len(pairs):
        t = len(pairs)
        return np.arange(t), np.arange(t), np.arange(t), (1, 1)
    (s, o), = shapes
    place = {}
    for bi, (ys, xs) in enumerate(blocks.items()):
        for si, x in enumerate(xs):
            for oi, y in enumerate(ys):
                place[x, y] = (bi * s + si) * o + oi
    sel = np.array([place[p] for p in pairs])
    return (ia[[x for xs in blocks.values() for x in xs]], ib[b_reads], sel, (s, o))


def _how(g: Group, slot: str, plan: Plan, rows: np.ndarray, offs: np.ndarray):
    """How to read: 'whole' (the producer's output as is), ('box', ...) (slices of an affine grid
    of boxes), 'rows' (whole rows) or 'gather'."""
    producer = plan.groups[g.reads[slot].src]
    dims = read_dims(g, slot)
    rel = box_positions(dims)
    whole = rel.size == producer.out_len and (rel == np.arange(rel.size)).all() and not offs.any()
    if whole and rows.size == len(producer.members) and (rows.reshape(-1) == np.arange(rows.size)).all():
        return "whole"
    grid = _grid((rows * producer.out_len + offs).reshape(-1))
    box = _box((*grid, *dims), unique=False) if grid is not None else None
    if box is not None:
        return ("box", (*grid, *dims), *box)
    return "rows" if whole and rows.shape[1] == 1 else "gather"


def _group_fn(g: Group, hows: tuple, grid: tuple, permuted: bool):
    if g.kind == "load":
        return _load_fn(g.sig, _grid(g.dram))
    if g.kind == "gather":
        return _gather_fn(g.sig, hows[0])
    if g.kind == "store":
        return _store_fn(g.sig, hows[0], _grid(g.dram))
    if g.kind == "matmul":
        return _matmul_fn(g.sig, hows, grid, permuted)
    if g.kind == "join":
        return _join_fn(g.sig, hows)
    return _vector_fn(g.sig, hows)


SLOTS = {"load": (), "gather": ("idx",), "store": ("src",), "matmul": ("a", "b", "init"),
         "vector": ("src1", "src2", "init")}


def _slots(g: Group) -> tuple[str, ...]:
    """The read slots of a group's function, in argument order (a join's: one per piece)."""
    return tuple(g.reads) if g.kind == "join" else SLOTS[g.kind]


def _extent(g: Group) -> tuple[int, int]:
    """The first and last DRAM element a load or store group touches."""
    n, strides = g.sig[0], g.sig[1]
    rel = offsets(strides, n[:3])
    return int(g.dram.min() + rel.min()), int(g.dram.max() + rel.max())


def _fusable(plan: Plan, partial: set[int]) -> dict[int, int]:
    """group id -> the one compute group (matmul or vector) that reads its value, and reads it
    whole (not in `partial`): such a value can be computed inside its reader's function."""
    readers: dict[int, set[int]] = {}
    for g in plan.groups:
        for r in g.reads.values():
            if r.src >= 0:
                readers.setdefault(r.src, set()).add(g.id)
    return {src: c for src, rs in readers.items() if len(rs) == 1 and src not in partial
            for c in rs if plan.groups[c].kind in ("matmul", "vector")}


def _inlined_loads(plan: Plan, fusable: dict[int, int]) -> set[int]:
    """Loads of the data region that run inside the function of the one group reading them: XLA
    then reads the DRAM box straight into the layout the compute wants (P @ V's probabilities:
    a tile stack that the matmul would transpose back, 34 -> 20 ms).  Only where no store between
    the two writes the bytes the load reads, so that reading later reads the same values."""
    stores = {g.id: (g.sig[-1], *_extent(g)) for g in plan.groups if g.kind == "store"}
    inlined = set()
    for src, c in fusable.items():
        g = plan.groups[src]
        if g.kind != "load" or g.sig[-2] == DRAM_CONST:
            continue
        lo, hi = _extent(g)
        if not any(s in stores and stores[s][0] == g.sig[-1] and lo <= stores[s][2] and stores[s][1] <= hi
                   for s in range(src + 1, c)):
            inlined.add(src)
    return inlined


@functools.cache
def _with_producers(fn, producers: tuple):
    """fn with the values at positions `producers` ((position, producer's function), ...) computed
    inside it, from the producer's own arguments given there as a tuple."""
    def run(*args):
        args = list(args)
        for pos, producer in producers:
            args[pos] = producer(*args[pos])
        return fn(*args)
    return jax.jit(run)


@functools.cache
def recycle_large_buffers() -> bool:
    """Have glibc's malloc serve large blocks from its heap and keep freed memory, so that XLA's
    buffers of tens of MB (a group's values) reuse pages instead of mmapping fresh ones: faulting in
    and zeroing new pages cost about 4/5 of a pass over a large tensor (exp over 54 MB: 32 -> 6 ms).
    The process then keeps its peak heap rather than returning it to the OS.  False where the C
    library is not glibc (nothing changes there)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 1 << 30) and mallopt(m_trim_threshold, (1 << 31) - 1))


@functools.cache
def _fill_fn(starts: tuple):
    """Zero the DRAM arrays in place (donated) and write the inputs at their element offsets."""
    def run(data, inputs):
        data = {d: jnp.zeros_like(a) for d, a in data.items()}
        for (d, start), x in zip(starts, inputs, strict=True):
            data[d] = lax.dynamic_update_slice(data[d], x, (start,))
        return data
    return jax.jit(run, donate_argnums=0)


class Executor:
    """A program ready to run: its plan, with every group's function and device arrays prepared."""

    def __init__(self, program: Program):
        recycle_large_buffers()
        self.program = program
        self.plan = build_plan(program)
        blob = program.constants
        self.const = {d: jnp.asarray(np.frombuffer(blob[:len(blob) // d.itemsize * d.itemsize], d.numpy))
                      for d in DType if d != DType.BF16}
        self.const_values = {}   # loads of the constant region, computed on the first run
        self.spare = None        # the last run's DRAM arrays
        self.fill = _fill_fn(tuple((ref.dtype, (ref.offset - self.plan.data_origin) // ref.dtype.itemsize)
                                   for ref in program.inputs))
        prepared = []
        for g in self.plan.groups:
            reads = {s: (g.reads[s].rows, g.reads[s].offs) for s in _slots(g) if s in g.reads}
            extra, grid, permuted = (), None, False
            if g.kind == "matmul":
                ia, ib, sel, grid = _blocks(g)
                reads["a"] = tuple(x[ia] for x in reads["a"])
                reads["b"] = tuple(x[ib] for x in reads["b"])
                permuted = bool((sel != np.arange(len(sel))).any())
                extra = (jnp.asarray(sel, jnp.int32),)
            hows = tuple(_how(g, s, self.plan, *reads[s]) if s in reads else None for s in _slots(g))
            prepared.append((g, reads, extra, grid, permuted, hows))
        # Only values read whole run inside their reader: XLA would recompute a fused producer for
        # every element a gather picks (a conv's taps).
        partial = {g.reads[s].src for g, reads, *_, hows in prepared
                   for s, how in zip(_slots(g), hows, strict=True) if s in reads and how != "whole"}
        fusable = _fusable(self.plan, partial)
        inlined = _inlined_loads(self.plan, fusable)
        self.inlined = {src: (self.plan.groups[src].sig[-1], jnp.asarray(self.plan.groups[src].dram, jnp.int32))
                        for src in inlined}   # inlined load group id -> (element type, DRAM bases)
        # Likewise a vector op (softmax's x - max inside its exp: one pass over the scores instead
        # of two), unless it reads an inlined load, whose store check ends at its own reader.
        deferred = {src for src in fusable if self.plan.groups[src].kind == "vector"
                    and not any(r.src in inlined for r in self.plan.groups[src].reads.values())}
        self.deferred = {}   # deferred vector group id -> its (src, rows, offs) arguments
        self.steps = []
        fns = {}
        for g, reads, extra, grid, permuted, hows in prepared:
            if g.id in inlined:
                fns[g.id] = _group_fn(g, (), None, False)
                continue
            fn = _group_fn(g, hows, grid, permuted)
            args = [(g.reads[s].src, jnp.asarray(rows, jnp.int32), jnp.asarray(offs, jnp.int32))
                    for s, (rows, offs) in reads.items()]
            # positions in fn's arguments: the triples (value, rows, offs), matmul's sel after two of them
            producers = tuple((3 * k + (k >= 2 and g.kind == "matmul"), fns[src])
                              for k, (src, _, _) in enumerate(args) if src in inlined or src in deferred)
            fn = _with_producers(fn, producers) if producers else fn
            if g.id in deferred:
                fns[g.id] = fn
                self.deferred[g.id] = args
                continue
            dram = jnp.asarray(g.dram, jnp.int32) if g.dram is not None else None
            self.steps.append((g, fn, args, extra, dram))
        # values a step reads, through the deferred groups it runs, are freed after their last reader
        self.frees = [[] for _ in self.steps]
        last = {}
        for k, (_, _, args, _, _) in enumerate(self.steps):
            for src in self._sources(args):
                last[src] = k
        for src, k in last.items():
            self.frees[k].append(src)

    def _sources(self, args) -> set[int]:
        """The values a step's arguments read, those of the deferred groups it runs included."""
        out = set()
        for src, _, _ in args:
            if src in self.deferred:
                out |= self._sources(self.deferred[src])
            elif src not in self.inlined:
                out.add(src)
        return out

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        p, plan = self.program, self.plan
        if self.spare is None:
            self.spare = {d: jnp.zeros(plan.data_bytes // d.itemsize, d.numpy) for d in plan.dtypes}
        data, self.spare = self.spare, None
        data = self.fill(data, [np.asarray(x, ref.dtype.numpy).reshape(-1) for ref, x in zip(p.inputs, inputs,
                                                                                              strict=True)])
        values, checks = {}, []
        for (g, fn, args, extra, dram), frees in zip(self.steps, self.frees, strict=True):
            flat = [a for src, rows, offs in args for a in (self._value(src, values, data), rows, offs)]
            if g.kind in ("load", "gather"):
                space, dtype = g.sig[-2], g.sig[-1]
                mem = self.const[dtype] if space == DRAM_CONST else data[dtype]
                if g.kind == "gather":
                    values[g.id], idx = fn(mem, *flat, dram)
                    checks.append((g, idx))
                elif space == DRAM_CONST:   # weights: the same every run
                    if g.id not in self.const_values:
                        self.const_values[g.id] = fn(mem, dram)
                    values[g.id] = self.const_values[g.id]
                else:
                    values[g.id] = fn(mem, dram)
            elif g.kind == "store":
                dtype = g.sig[-1]
                data[dtype] = fn(data[dtype], *flat, dram)
            else:
                values[g.id] = fn(*flat[:6], *extra, *flat[6:])
            for src in frees:
                del values[src]
        for g, idx in checks:   # data-dependent bounds: any bad index discards the run
            idx = np.asarray(idx)
            for t in np.flatnonzero(((idx < 0) | (idx >= g.sig[0][3])).any(1))[:1]:
                check_gather_indices(g.instructions[t], idx[t], g.sig[0][3])
        outs = []
        for t in p.outputs:
            start = (t.offset - plan.data_origin) // t.dtype.itemsize
            outs.append(np.array(data[t.dtype][start:start + t.nbytes // t.dtype.itemsize]).reshape(t.shape))
        self.spare = data   # the next run zeroes these pages instead of faulting in fresh ones
        return outs

    def _value(self, src: int, values: dict, data: dict):
        """A producer group's value, or for an inlined load or a deferred vector op what its reader
        computes it from."""
        if src in self.inlined:
            dtype, bases = self.inlined[src]
            return data[dtype], bases
        if src in self.deferred:
            return tuple(a for s, rows, offs in self.deferred[src] for a in (self._value(s, values, data), rows, offs))
        return values[src]


def execute(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a program on host arrays with the batched executor (the reference interpreter when the
    program is outside the batched model)."""
    if "executor" not in program.cache:
        try:
            program.cache["executor"] = Executor(program)
        except PlanError as e:
            warnings.warn(f"batched executor cannot run this program ({e}); using the reference interpreter",
                          ReferenceFallbackWarning, stacklevel=2)
            program.cache["executor"] = None
    ex = program.cache["executor"]
    return reference.execute(program, inputs) if ex is None else ex.run(inputs)
