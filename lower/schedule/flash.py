"""Flash attention: a cascade of attention's Q·K^T -> softmax -> P·V whose score matrix never leaves the chip.

The pattern (what a traced attention becomes after defer_row_scale): S = Q @ K^T (a batched MATMUL, its
epilogue none or a constant scale), optionally masked (select(pred, fill, S), fill a constant: BERT's padding
mask; one head's 3-D scores take their scale in the mask instead, `MASK_EXPRS`), m = max(S) and l = sum(E)
over S's rows (REDUCEs), E = exp(S - m) (an ELEMENTWISE), r = recip(l), O = (E @ V) * r (a batched MATMUL
whose epilogue is the deferred row scale), every intermediate read by the pattern alone, float32 throughout or
a bf16 graph's (S, P, l and r then rounded to bf16 where the layers store them, S before the mask, the matmuls
bf16 x bf16; the online rescaling makes P's rounding differ from the layers' by a bf16 step at most); int8
attention requantizes the scores and quantizes P at a fixed scale, which an online softmax's rescaling does
not commute with: lower.schedule.flash_int8 keeps its score rows in the scratchpad instead).  Views between
them (reshapes, broadcasts) emit nothing.

It runs per batch (head) and query block of `tq` rows: Q's block is loaded once; per key block of
`tk` columns, K^T's and V's blocks (and the mask's) are loaded, S's block computed on the array into
the accumulator (scaled and masked there by the vector unit), and the vector unit keeps the online
softmax (Milakov & Gimelshein 2018; Dao et al. 2022): the running row max m and sum l; each block's
new max rescales l and the output accumulator by alpha = exp(m_old - m_new), P = exp(S - m_new) goes
to the scratchpad, and the array adds P @ V into the output accumulator. After the last key block
the output is multiplied by 1/l and stored. DRAM sees Q and the output once and K and V once per
query block.  A mask that several heads share (BERT's, broadcast over its heads) may instead stay
resident: a query block's whole mask row LOADed once, its zeros found once, and those heads run one
after another over it (`Mask`, chosen by cost where it fits).

`flash_cost` counts the instructions the emitter (lower.codegen.flash) issues and composes them as
the timing simulator charges them, the units overlapping: the busiest of the load queue, the
DRAM channel, the array and the vector unit, plus one query block's loads (fill) and its last
vector work and store (drain).  The mapper searches (tq, tk) under the scratchpad and
accumulator (`choose_flash`) and takes the cascade where its objective beats the layers' own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from stagec.isa.instructions import MAX_COUNT, Space
from stagec.sim.costs import array_per_pe, matmul_cycles, vector_cycles
from stagec.sim.energy import ActionCounts, energy_pj

from ..graph.graph_ir import OpKind, Step
from .attention_walk import Walk, mask_inputs, row_reduce, shared_heads
from .buffers import Buffer, local_bytes, words
from .cascade import CascadeRecord
from .cascade_map import layer_cost
from .nest_cost import dma_cycles
from .search import INSTRUCTION_CHARGE, objective_of, tile_sizes
from .tensors import DTYPE_OF

F32 = 4
ROWS = ("m", "m_next", "l", "alpha", "rowwise")   # the per-row statistics, one float per query row each
CONSTS = ("scale", "fill", "zero")                  # scalars the vector unit reads (those a cascade has)


class Mask(NamedTuple):
    """How a cascade reads its mask: the bytes of its DRAM element; how many consecutive heads (the
    trailing batch dims) read the same mask (BERT's broadcasts over all its heads); `resident`: a
    query block's whole mask row LOADed once for those heads (its zeros found once), else each key
    block's mask LOADed for every head."""

    itemsize: int = F32
    heads: int = 1
    resident: bool = False


UNSHARED = Mask()


@dataclass(frozen=True)
class FlashAttention(CascadeRecord):
    """Attention's layers (node names: S's matmul, the mask's select if any, the max, the exp, the sum,
    the recip, the P·V matmul) run flash-style over query blocks of tile[0] rows and key blocks of tile[1];
    `dims`: (batch, queries M, keys N, head dim D); `saved_bytes`: the DRAM bytes of S, E and their
    row vectors that layer by layer moves."""

    layers: tuple[str, ...]
    tile: tuple[int, int]
    dims: tuple[int, int, int, int]
    saved_bytes: int
    scale: float | None = None    # S's matmul epilogue: times this constant
    fill: float | None = None     # a mask: S where the predicate is nonzero, else this constant
    mappings: tuple = ()          # its members keep their own tilings: the cascade's tile is its own
    bf16: bool = False            # a bf16 graph's (its values rounded as the layers store them)
    out_itemsize: int = F32       # bytes of an output element (a bf16 graph may return float32)
    mask: Mask = UNSHARED         # how a masked cascade reads its mask

    @property
    def mask_row(self) -> int:
        """A resident mask row's length (the keys), else 0."""
        return self.dims[2] * (self.fill is not None and self.mask.resident)

    @property
    def roles(self) -> tuple[str, ...]:
        """What each of `layers` is (lower.codegen.flash attributes each instruction to its layer)."""
        return ROLES if self.fill is not None else tuple(r for r in ROLES if r != "mask")

    def __str__(self) -> str:
        return (f"cascade {' -> '.join(self.layers)}: flash attention, query block {self.tile[0]}, key block "
                f"{self.tile[1]}, saves {self.saved_bytes / 1024:.1f} KiB of DRAM")


class Attention(NamedTuple):
    """A matched pattern's nodes (module doc; `mask` None where S goes to softmax unmasked) and its
    constants (`scale`, `fill`: None where absent)."""

    scores: object
    mask: object
    row_max: object
    exp: object
    row_sum: object
    recip: object
    pv: object
    scale: float | None = None
    fill: float | None = None

    @property
    def nodes(self) -> list:
        return [n for n in self[:7] if n is not None]


ROLES = ("scores", "mask", "max", "exp", "sum", "recip", "pv")
def flash_buffers(tq, tk, d, masked: bool = False, bf16: bool = False, mask_row: int = 0) -> list[Buffer]:
    """What a flash cascade holds: Q's, K^T's, V's, P's and the output's blocks (two each, so the next
    block's loads and the last one's store overlap), the per-row statistics; S's blocks (two) and
    the output accumulator in the accumulator; bf16, P's bf16 blocks (two) and a rounding's scratch;
    masked, the mask's blocks (two), or two resident rows of `mask_row` keys."""
    block = words(tq * tk * 2, 2)
    narrow = bf16 * [Buffer("pb", Space.SPAD, block, 2), Buffer("round", Space.SPAD, block)]
    return [Buffer("q", Space.SPAD, tq * d * F32, 2), Buffer("kt", Space.SPAD, d * tk * F32, 2),
            Buffer("v", Space.SPAD, tk * d * F32, 2), Buffer("p", Space.SPAD, tq * tk * F32, 2),
            Buffer("out", Space.SPAD, tq * d * F32, 2), Buffer("rows", Space.SPAD, tq * F32, len(ROWS)),
            Buffer("consts", Space.SPAD, F32, len(CONSTS)), Buffer("s", Space.ACC, tq * tk * F32, 2),
            Buffer("o", Space.ACC, tq * d * F32),
            *masked * [Buffer("mask", Space.SPAD, tq * (mask_row or tk) * F32, 2)], *narrow]


class FlashCost(NamedTuple):
    """cycles, instructions, actions (sim.energy's), per-unit busy cycles, scratchpad and accumulator bytes."""

    cycles: float
    instructions: int
    actions: ActionCounts
    units: dict
    spad_bytes: int
    acc_bytes: int

    @property
    def charged(self) -> tuple[float, ActionCounts]:
        """(charged cycles, actions): what search_blocks ranks a tiling by."""
        return self.cycles + INSTRUCTION_CHARGE * self.instructions, self.actions


class Vec(NamedTuple):
    """A vector instruction as the cost counts it: elements, transcendental, reduced run, and its
    distinct bytes read and written in the scratchpad and the accumulator."""

    elements: int
    transcendental: bool = False
    reduce: int = 1
    spad_r: int = 0
    spad_w: int = 0
    acc_r: int = 0
    acc_w: int = 0


def block_vectors(q: int, t: int, d: int, first: bool) -> list[Vec]:
    """The vector instructions of one key block of t columns for q query rows (lower.codegen.flash's
    order): the row max, the running max and alpha = exp(m_old - m_new) (but the first block), P =
    exp(S - m), l scaled by alpha (but the first) and P's row sums added, the output scaled by alpha."""
    qt, w = q * t * F32, q * F32
    rescale = [] if first else [Vec(q, spad_r=2 * w, spad_w=w), Vec(q, spad_r=2 * w, spad_w=w),
                                Vec(q, True, spad_r=w, spad_w=w)]
    scale_l = [] if first else [Vec(q, spad_r=2 * w, spad_w=w)]
    scale_o = [] if first else [Vec(q * d, spad_r=w, acc_r=q * d * F32, acc_w=q * d * F32)]
    return ([Vec(q * t, reduce=t, acc_r=qt, spad_w=w)] + rescale
            + [Vec(q * t, spad_r=w, acc_r=qt, spad_w=qt), Vec(q * t, True, spad_r=qt, spad_w=qt)] + scale_l
            + [Vec(q * t, reduce=t, spad_r=qt + (not first) * w, spad_w=w)] + scale_o)


def score_vectors(q: int, t: int, scale: bool, masked: bool, resident: bool = False) -> list[Vec]:
    """S's block finished as the layers compute it: times the scale, then the mask (its block's
    zeros found, but where a resident row's were, and the fill SELECTed there)."""
    qt = q * t * F32
    return (scale * [Vec(q * t, spad_r=F32, acc_r=qt, acc_w=qt)]
            + masked * (not resident) * mask_zeros(q * t) + masked * [Vec(q * t, spad_r=qt + F32, acc_r=qt, acc_w=qt)])


def mask_zeros(elements: int) -> list[Vec]:
    """A mask's zeros found: CMP_EQ against 0 in place."""
    return [Vec(elements, spad_r=elements * F32 + F32, spad_w=elements * F32)]


def final_vectors(q: int, d: int) -> list[Vec]:
    """After the last key block: r = 1/l, the output times r into the scratchpad."""
    return [Vec(q, True, spad_r=q * F32, spad_w=q * F32), Vec(q * d, spad_r=q * F32, acc_r=q * d * F32,
                                                               spad_w=q * d * F32)]


def rounding(elements: int) -> list[Vec]:
    """A bf16 value rounded where the layers STORE it (lower.codegen.tile_expr.round_bf16): two COPYs; P's
    rounded by its EXP as it writes it, then the second alone (widened back for its row sums)."""
    return [Vec(elements, spad_r=elements * F32, spad_w=elements * 2), Vec(elements, spad_r=elements * 2,
                                                                          spad_w=elements * F32)]


def _matmul(m: int, k: int, n: int, accumulate: bool, itemsize: int, hw) -> tuple:
    """(cycles, MACs, scratchpad reads, accumulator reads, accumulator writes) of one MATMUL of
    `itemsize`-byte operands, as sim.costs and sim.energy charge it."""
    cols_f = math.ceil(n / hw.array_cols)
    per_pe = int(array_per_pe(itemsize, hw))
    if hw.dataflow == "weight_stationary":
        rf = math.ceil(k / (hw.array_rows * per_pe))
        spad, cw, cr = m * k * cols_f + k * n, m * n * rf, m * n * (rf - 1 + accumulate)
    else:
        rf = math.ceil(m / hw.array_rows)
        spad, cw, cr = m * k * cols_f + k * n * rf, m * n, m * n * accumulate
    cycles = float(matmul_cycles(m, k, n, hw.array_rows, hw.array_cols, hw.dataflow, per_pe=per_pe))
    return cycles, m * k * n, spad * itemsize, cr * F32, cw * F32


def _sizes(total: int, tile: int) -> list[tuple[int, int]]:
    """(block size, how many) of a dimension cut into tiles."""
    full, rest = divmod(total, tile)
    return [(tile, full)] * (full > 0) + [(rest, 1)] * (rest > 0)


def flash_cost(dims, tq: int, tk: int, hw, scale: bool = False, masked: bool = False, bf16: bool = False,
               out_itemsize: int = F32, mask: Mask = UNSHARED, footprint=None) -> FlashCost:
    """The cost of a flash cascade of `dims` (batch, M, N, D) in blocks of tq x tk, its scores
    scaled and masked (read as `mask` says) or not, float32 or bf16 (S, P, l and r rounded as the layers
    store them), its output of `out_itemsize` bytes an element, as lower.codegen.flash emits it (module doc);
    `footprint`: its (scratchpad, accumulator) bytes where the caller has them (search_blocks)."""
    b, m, n, d = dims
    resident = masked and mask.resident
    item = 2 if bf16 else F32
    t = dict.fromkeys(("matrix", "vector", "vector_ops", "spad_r", "spad_w", "acc_r", "acc_w", "macs",
                       "instructions"), 0.0)

    def add(vectors: list[Vec], times: int) -> None:
        for v in vectors:
            t["vector"] += times * float(vector_cycles(v.elements, hw.vector_lanes, transcendental=v.transcendental,
                                                       reduce_length=v.reduce,
                                                       cycles_per_transcendental=hw.vector_cycles_per_transcendental))
            t["vector_ops"] += times * v.elements
            for k in ("spad_r", "spad_w", "acc_r", "acc_w"):
                t[k] += times * getattr(v, k)
        t["instructions"] += times * len(vectors)

    nk = -(-n // tk)
    for q, q_times in _sizes(m, tq):
        blocks = _sizes(n, tk)
        firsts = [(blocks[0][0], 1, True)] + [(kb, times - (i == 0), False) for i, (kb, times) in enumerate(blocks)]
        for kb, times, first in firsts:
            if times <= 0:
                continue
            for mm in (_matmul(q, d, kb, False, item, hw), _matmul(q, kb, d, not first, item, hw)):
                t["matrix"] += b * q_times * times * mm[0]
                t["macs"] += b * q_times * times * mm[1]
                t["spad_r"] += b * q_times * times * mm[2]
                t["acc_r"] += b * q_times * times * mm[3]
                t["acc_w"] += b * q_times * times * mm[4]
            t["instructions"] += b * q_times * times * 2
            add(score_vectors(q, kb, scale, masked, resident) + block_vectors(q, kb, d, first)
                + bf16 * (rounding(q * kb) + rounding(q * kb)[1:]), b * q_times * times)
        add(final_vectors(q, d) + bf16 * 2 * rounding(q), b * q_times)
        add(resident * mask_zeros(q * n), b // mask.heads * q_times)
    nq = -(-m // tq)
    consts = scale + 2 * masked                 # LOADs of one element each, once
    mask_loads = b // mask.heads * nq if resident else b * nq * nk
    loads = b * nq * (1 + 2 * nk) + masked * mask_loads + consts
    q_bytes, out_bytes = b * m * d * item, b * m * d * out_itemsize
    mask_bytes = masked * (b // mask.heads if resident else b) * m * n * mask.itemsize
    read = q_bytes + b * nq * 2 * n * d * item + mask_bytes + consts * F32
    acts = ActionCounts(macs_int8=0.0, macs_bf16=bf16 * t["macs"], macs_fp32=(not bf16) * t["macs"],
                        vector_ops=t["vector_ops"],
                        scratchpad_read_bytes=t["spad_r"] + q_bytes, scratchpad_write_bytes=t["spad_w"] + read,
                        accumulator_read_bytes=t["acc_r"], accumulator_write_bytes=t["acc_w"],
                        dram_read_bytes=read, dram_write_bytes=out_bytes)
    units = {"load": dma_cycles(loads, read, hw), "store": dma_cycles(b * nq, out_bytes, hw),
             "channel": (read + out_bytes) / hw.dma_bandwidth_bytes_per_cycle,
             "matrix": t["matrix"], "vector": t["vector"]}
    q0, k0 = min(tq, m), min(tk, n)
    fill = dma_cycles(3 + masked, (q0 + 2 * k0) * d * item + masked * q0 * (n if resident else k0) * mask.itemsize, hw)
    drain = sum(float(vector_cycles(v.elements, hw.vector_lanes, transcendental=v.transcendental,
                                    cycles_per_transcendental=hw.vector_cycles_per_transcendental))
                for v in final_vectors(q0, d)) + dma_cycles(1, q0 * d * out_itemsize, hw)
    spad, acc = footprint or local_bytes(flash_buffers(tq, tk, d, masked, bf16, n * resident))
    return FlashCost(fill + max(units.values()) + drain, int(loads + b * nq + t["instructions"]), acts, units,
                     int(spad), int(acc))


SUB_EXP = (Step("sub", (0, 1)), Step("exp", (2,)))


def match(graph, layout, excluded=frozenset()) -> list[Attention]:
    """Every attention of the module doc's pattern in `graph`, its layers emitted (views between them
    emit nothing, every intermediate read by the pattern alone), none of them in `excluded`."""
    walk = Walk(graph, layout)
    node_of, readers = walk.node_of, walk.readers

    def constant(v) -> float | None:
        """The value of a one-element constant that `v` views, else None."""
        p = walk.producer.get(v.id)
        while walk.view(p):
            v, p = p.inputs[0], walk.producer.get(p.inputs[0].id)
        c = graph.constants.get(v.id)
        return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None

    found = []
    for pv in graph.nodes:
        if pv.op != OpKind.MATMUL or len(pv.inputs) != 3 or pv.attr("epilogue") != (Step("mul", (0, 1)),):
            continue
        e, r = node_of(pv.inputs[0], OpKind.ELEMENTWISE), node_of(pv.inputs[2], OpKind.ELEMENTWISE)
        if e is None or r is None or e.attr("expr") != SUB_EXP or r.attr("expr") != (Step("recip", (0,)),):
            continue
        total, mx = node_of(r.inputs[0], OpKind.REDUCE), node_of(e.inputs[1], OpKind.REDUCE)
        mask = node_of(e.inputs[0], OpKind.ELEMENTWISE)
        parts = mask_inputs(mask) if mask is not None else None
        fill = constant(parts.fill) if parts is not None else None
        if mask is not None and (fill is None or not fill < math.inf):     # -inf or finite (lower.codegen.flash)
            continue
        s = node_of(parts.scores if mask else e.inputs[0], OpKind.MATMUL)
        if (total is None or mx is None or s is None or not row_reduce(total, "sum") or not row_reduce(mx, "max")
                or node_of(total.inputs[0], OpKind.ELEMENTWISE) is not e
                or node_of(mx.inputs[0], OpKind.ELEMENTWISE if mask else OpKind.MATMUL) is not (mask or s)):
            continue
        scaled = (s.attr("epilogue") == (Step("mul", (0, 1)),) and len(s.inputs) == 3
                  and constant(s.inputs[2]) is not None)    # a scale of 0.0 is a scale
        plain = len(s.inputs) == 2 and not s.attr("epilogue")
        masked_scale = parts is not None and parts.scale is not None
        if not (scaled or plain) or masked_scale and (not plain or constant(parts.scale) is None):
            continue
        scale = constant(parts.scale) if masked_scale else constant(s.inputs[2]) if scaled else None
        a = Attention(s, mask, mx, e, total, r, pv, scale, fill)
        scores_read_by = {mask.name} if mask else {mx.name, e.name}
        expected = [scores_read_by] + ([{mx.name, e.name}] if mask else []) + [
            {e.name}, {total.name, pv.name}, {r.name}, {pv.name}]
        if (any(readers(n) != want for n, want in zip(a.nodes[:-1], expected, strict=True))
                or any(n.name in excluded for n in a.nodes)
                or not _one_float(a, graph)):
            continue
        found.append(a)
    return found


def _one_float(a: Attention, graph) -> bool:
    """Whether the attention computes in float32 or in bf16 (its constants float32, a mask's fill a view
    of one, its result either: a bf16 graph's last layer returns the model's float32)."""
    fill = mask_inputs(a.mask).fill if a.mask is not None else None
    held = {v.dtype for n in a.nodes for v in (*n.inputs, n.output) if v.id not in graph.constants
            and v is not a.pv.output and v is not fill}
    return held in ({"float32"}, {"bfloat16"}) and a.pv.output.dtype in (
        "float32", "bfloat16") and all(graph.constants[v.id].dtype == "float32" for n in a.nodes for v in n.inputs
                                       if v.id in graph.constants)


def dims_of(a: Attention) -> tuple[int, int, int, int]:
    """(batch, M, N, D) of an attention: its heads, queries, keys and head dim."""
    *batch, m, n = a.scores.output.shape
    return math.prod(batch), m, n, a.pv.output.shape[-1]


def _layers_alone(a: Attention, tilings: dict, hw, objective: str) -> tuple[float, float]:
    """A lower bound of (charged cycles, energy) of the attention's layers run one by one: the two
    matmuls as the default mapper tiled them (once per batch), the vector layers their DRAM traffic
    alone (bytes over the channel, their DRAM energy)."""
    cycles = energy = 0.0
    batch = dims_of(a)[0]
    for node in (a.scores, a.pv):
        c, e, _ = layer_cost(tilings[node.name].nests[0], tilings[node.name].mapping, hw, objective)
        cycles, energy = cycles + batch * c, energy + batch * e
    moved = sum(v.size * DTYPE_OF[v.dtype].itemsize for n in a.nodes[1:-1] for v in (*n.inputs, n.output))
    return cycles + moved / hw.dma_bandwidth_bytes_per_cycle, energy + moved * hw.energy_pj_per_dram_byte


def search_blocks(m: int, n: int, buffers, cost, hw, objective: str):
    """The (query block, key block) of least objective whose `buffers(tq, tk)` fit the scratchpad and
    the accumulator, with its (charged cycles, energy), or None; `cost(tq, tk, footprint)`: (charged cycles,
    actions), given the (scratchpad, accumulator) bytes the fit was checked on, not computed twice."""
    best = None
    for tq in tile_sizes(m, MAX_COUNT):
        for tk in tile_sizes(n, MAX_COUNT):
            spad, acc = local_bytes(buffers(int(tq), int(tk)))
            if spad > hw.scratchpad_bytes or acc > hw.accumulator_bytes:
                continue
            charged, actions = cost(int(tq), int(tk), (spad, acc))
            energy = sum(energy_pj(actions, charged, hw).values())
            value = objective_of(charged, energy, objective)
            if best is None or value < best[0]:
                best = (value, (int(tq), int(tk)), charged, energy)
    return best and best[1:]


def map_flash(dims, hw, objective: str, scale: bool = False, masked: bool = False, bf16: bool = False,
              out_itemsize: int = F32, mask: Mask = UNSHARED):
    """(the (tq, tk) of least objective that fits, with its (charged cycles, energy), or None; the way it
    reads its mask): a mask that several heads share is kept resident where that pays and fits."""
    def search(way: Mask):
        def cost(tq: int, tk: int, footprint):
            return flash_cost(dims, tq, tk, hw, scale, masked, bf16, out_itemsize, way, footprint).charged
        return search_blocks(dims[1], dims[2], lambda tq, tk: flash_buffers(
            tq, tk, dims[3], masked, bf16, dims[2] * way.resident), cost, hw, objective)
    return mask_ways(mask, masked, search, objective)


def mask_ways(mask: Mask, masked: bool, search, objective: str):
    """(search_blocks' best of `search(way)` over the ways to read a mask, that way): per key block, or
    resident where heads share it; (None, mask) where none fits."""
    best = None
    for way in [mask] + [mask._replace(resident=True)] * (masked and mask.heads > 1):
        mapped = search(way)
        if mapped and (best is None or objective_of(*mapped[1:], objective) < objective_of(*best[0][1:], objective)):
            best = (mapped, way)
    return best or (None, mask)


def pays(a, mapped, tilings: dict, hw, objective: str):
    """(tile, DRAM bytes saved) of attention `a` (a matched pattern: its `nodes`, the last P·V) mapped as
    `mapped` (search_blocks'), where its objective is below a lower bound of its layers' own; else None."""
    if mapped is None:
        return None
    tile, cycles, energy = mapped
    if objective_of(cycles, energy, objective) >= objective_of(*_layers_alone(a, tilings, hw, objective), objective):
        return None
    return tile, sum(n.output.size * DTYPE_OF[n.output.dtype].itemsize * 2 for n in a.nodes[:-1])


def choose_flash(graph, layout, tilings: dict, hw, objective: str, excluded) -> list[FlashAttention]:
    """The attentions (`match`) that run flash-style: where a tiling fits and its objective is below
    a lower bound of the layers' own (a cascade that does not fit is never emitted: the layers run alone)."""
    chosen, walk = [], Walk(graph, layout)
    for a in match(graph, layout, excluded):
        dims = dims_of(a)
        bf16 = a.scores.inputs[0].dtype == "bfloat16"
        out = DTYPE_OF[a.pv.output.dtype].itemsize
        pred = a.mask and mask_inputs(a.mask).pred
        mask = UNSHARED if a.mask is None else Mask(DTYPE_OF[pred.dtype].itemsize, shared_heads(pred, walk))
        mapped, mask = map_flash(dims, hw, objective, a.scale is not None, a.fill is not None, bf16, out, mask)
        taken = pays(a, mapped, tilings, hw, objective)
        if taken is not None:
            chosen.append(FlashAttention(tuple(n.name for n in a.nodes), taken[0], dims, taken[1], a.scale, a.fill,
                                         bf16=bf16, out_itemsize=out, mask=mask))
    return chosen
