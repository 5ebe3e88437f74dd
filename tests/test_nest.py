"""A loop nest is described once (lower.schedule.nest): for random layers and mappings, every switch included,
fp32 and int8, the mapper's description, the program the emitter makes of it and the cost model's
exact mode agree on the tile counts, the bytes every queue moves, each unit's cycles and the
footprint."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import layer_cost
from stagec.costmodel.problem import layer_shape, mapping_arrays
from stagec.isa import HardwareConfig
from stagec.isa.access import accesses
from stagec.isa.instructions import ITEMSIZE, DType, Opcode, Queue, Space
from stagec.layers import layer_program, model_graph, model_layers
from stagec.lower.codegen import tile_expr
from stagec.lower.graph.graph_ir import Step
from stagec.lower.schedule import buffers
from stagec.lower.schedule.nest import SWITCHES, ConvProblem, Exact, LayerShape, TileMapping, row_tiles
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.lower.schedule.nest_map import fits, map_nest
from stagec.lower.schedule.nest_work import dims
from stagec.sim.costs import instruction_shapes, unit_cycles, unit_parameters
from stagec.sim.energy import counts_of

HW = HardwareConfig()
exact_cost = jax.jit(layer_cost)


def _conv(x, w, stride, padding, dilation, groups):
    return jax.lax.conv_general_dilated(x, w, stride, padding, rhs_dilation=dilation, feature_group_count=groups,
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))


# (layer kind, a switch every mapping drawn has on): each switch, every nest kind
CASES = [("conv", "stacked"), ("conv", "transposed"), ("conv", None), ("matmul", None), ("depthwise", None),
         ("pool", None)]


@st.composite
def layers(draw, kind: str, stacked: bool = False):
    """(function, example args) of one conv-shaped layer of `kind` with a fused epilogue: a convolution
    (grouped; one that stacks, `stacked`), a depthwise convolution, a batched matmul or a pooling,
    small enough to emit in milliseconds."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    epilogue = draw(st.sampled_from(["none", "bias", "bias_relu", "residual", "row_scale"]))
    if kind == "matmul":
        batch, m, k, n = draw(st.integers(1, 2)), draw(st.integers(1, 24)), draw(st.integers(1, 40)), \
            draw(st.integers(1, 40))
        w = rng.standard_normal((k, n), np.float32)
        args = [rng.standard_normal((batch, m, k), np.float32)]
        shape = (batch, m, n)
        core = lambda x: x @ w   # noqa: E731
    else:
        c = draw(st.integers(1, 12))
        groups = c if kind == "depthwise" else draw(st.sampled_from([1, 2])) if c % 2 == 0 else 1
        o = c if kind != "conv" else groups * draw(st.integers(1, 12))
        k = draw(st.sampled_from([3, 2] if stacked else [3, 1, 2, 4]))
        dilation = draw(st.integers(1, 2)) if kind == "conv" and not stacked else 1
        extent = (k - 1) * dilation + 1
        pad = st.sampled_from(range(extent - 1, -1, -1))
        pads = tuple((draw(pad), draw(pad)) for _ in range(2))
        stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        n, h, wd = draw(st.integers(1, 2)), draw(st.integers(extent, 14)), draw(st.integers(extent, 14))
        args = [rng.standard_normal((n, c, h, wd), np.float32)]
        if kind == "pool":
            core = lambda x: jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, k, k), (1, 1, *stride),   # noqa: E731
                                                   ((0, 0), (0, 0), *pads))
            epilogue = "none"
        else:
            w = rng.standard_normal((o, c // groups, k, k), np.float32)
            core = lambda x: _conv(x, w, stride, pads, (dilation, dilation), groups)   # noqa: E731
        shape = jax.eval_shape(core, *args).shape
    bias = rng.standard_normal(shape[-1] if kind == "matmul" else (1, shape[1], 1, 1), np.float32)
    if epilogue == "residual":
        args.append(rng.standard_normal(shape, np.float32))
    scale = rng.standard_normal(shape[:-1] + (1,), np.float32)
    steps = {"none": lambda y: y, "bias": lambda y: y + bias, "bias_relu": lambda y: jax.nn.relu(y + bias),
             "residual": lambda y, r: jax.nn.relu(y + r), "row_scale": lambda y: y * scale}[epilogue]
    return (lambda x, *rest: steps(core(x), *rest)), tuple(args)


def _mapping(draw, L: LayerShape, switch: str | None) -> TileMapping:
    """Any mapping of the layer: tile sizes within its dims, every switch where it exists (`switch` on)."""
    tiles = [draw(st.integers(1, d)) for d in (L.oh, L.ow, L.o, L.c if L.kind == 0 else 1)]
    on = {s.name: (s.name == switch or draw(st.booleans())) and bool(s.exists(L)) for s in SWITCHES}
    if on["stacked"] and on["transposed"]:
        on["transposed" if switch == "stacked" else "stacked"] = False
    return TileMapping(*tiles, **on)


def _program_counts(program):
    """What the emitted program does: instructions and bytes per queue, cycles of each unit."""
    code = program.code
    op = code["opcode"]
    n = code["n"].astype(np.int64)
    moved = n[:, 0] * n[:, 1] * n[:, 2] * ITEMSIZE[code["dtype"]]
    occupancy, _ = unit_cycles(instruction_shapes(code), unit_parameters(program.hw))
    queue = instruction_shapes(code).queue
    return {"loads": int(np.sum(op == Opcode.LOAD)), "load_bytes": int(moved[op == Opcode.LOAD].sum()),
            "stores": int(np.sum(op == Opcode.STORE)), "store_bytes": int(moved[op == Opcode.STORE].sum()),
            "matmuls": int(np.sum(op == Opcode.MATMUL)), "vectors": int(np.sum(op == Opcode.VECTOR)),
            "array_cycles": float(occupancy[queue == Queue.MATRIX].sum()),
            "vector_cycles": float(occupancy[queue == Queue.VECTOR].sum())}


def _nest_counts(L: LayerShape, cost):
    w, runs = cost.work, L.repeat
    on_array = L.kind == 0
    return {"loads": runs * (w.startup[0] + w.loads[0]), "load_bytes": runs * (w.startup[1] + w.loads[1]),
            "stores": runs * w.store[0], "store_bytes": runs * w.store[1], "matmuls": runs * w.matmuls,
            "vectors": runs * w.vectors, "array_cycles": runs * on_array * w.compute,
            "vector_cycles": runs * (w.epilogue + (not on_array) * w.compute)}


def _touched(program, space):
    """The highest byte of `space` any instruction reads or writes."""
    return max((int(np.max(np.where(a.valid & (a.space == space), a.extent()[1], 0))) for a in accesses(program.code)),
               default=0)


def layer_graph(fn, args, precision: str):
    """The graph of one layer, int8 calibrated on its own example inputs."""
    return model_graph(fn, args, **({"quantize": "int8", "calibration": [args]} if precision == "int8" else {}))


# int8 too, but for a lone max pool (quantization leaves it fp32: int8 pools follow int8 layers)
@pytest.mark.parametrize("kind, switch, precision", [(kind, switch, precision) for kind, switch in CASES
                                                     for precision in ("fp32", "int8")
                                                     if (kind, precision) != ("pool", "int8")])
@given(data=st.data())
def test_mapper_emitter_and_cost_model_describe_one_nest(kind, switch, precision, data):
    fn, args = data.draw(layers(kind, switch == "stacked"))
    graph = layer_graph(fn, args, precision)
    (found,) = model_layers(graph)
    assert found.problem.itemsize == (1 if precision == "int8" else 4)
    L = LayerShape.of(found.kind, found.problem, found.extras, found.repeat)
    m = _mapping(data.draw, L, switch)
    cost = nest_cost(L, m, HW, Exact)
    assume(fits(found.problem, cost.spad_bytes, cost.acc_bytes, m.tile_oh, m.tile_ow, HW))
    program = layer_program(graph, found, m, HW)

    # the emitter walks the nest's tiles and allocates its buffers
    assert _program_counts(program) == pytest.approx(_nest_counts(L, cost), rel=1e-12, abs=1e-9), str(m)
    assert program.metadata["local_peak_bytes"][found.name] == [cost.spad_bytes, cost.acc_bytes]
    assert _touched(program, Space.SPAD) <= cost.spad_bytes and _touched(program, Space.ACC) <= cost.acc_bytes
    d = dims(L, m, Exact, m.stacked)
    assert d.n_h == len(row_tiles(found.problem, m))
    actions = counts_of(program).total()
    for name in ("macs_int8", "macs_fp32", "dram_read_bytes", "dram_write_bytes", "vector_ops",
                 "scratchpad_write_bytes", "accumulator_read_bytes", "accumulator_write_bytes"):
        assert getattr(actions, name) == pytest.approx(getattr(cost.actions, name), rel=1e-12), name

    # the cost model's exact mode is the same function, over jax.numpy in float32
    relaxed = exact_cost(layer_shape(found.kind, found.problem, found.extras, found.repeat), mapping_arrays(m),
                         hardware_point(HW), smooth=0.0)
    for name, value in (("cycles", cost.cycles), ("spad_bytes", cost.spad_bytes), ("acc_bytes", cost.acc_bytes),
                        ("instructions", cost.instructions)):
        assert float(getattr(relaxed, name)) == pytest.approx(float(value), rel=1e-5), name
    assert float(relaxed.violation) == 0


@pytest.mark.parametrize("kind", ["conv", "depthwise"])
@given(data=st.data())
def test_the_mapper_ranks_by_the_nest_cost(kind, data):
    """The mapper's estimate of the mapping it picks is the nest's exact cost of that mapping."""
    fn, args = data.draw(layers(kind))
    (found,) = model_layers(model_graph(fn, args))
    chosen, estimate = map_nest(found.kind, found.problem, HW, found.extras, found.name, with_cost=True)
    assert estimate == float(nest_cost(LayerShape.of(found.kind, found.problem, found.extras), chosen, HW,
                                       Exact).cycles)


def test_int8_tiles_are_larger_than_fp32_tiles_on_the_same_hardware():
    """int8 operands take a quarter of the scratchpad an fp32 tile does: the mapper takes larger tiles
    of the same layer and re-reads DRAM less than a quarter as much."""
    fp32 = ConvProblem(1, 256, 14, 14, 256, 3, 3, padding=((1, 1), (1, 1)))
    int8 = dataclasses.replace(fp32, itemsize=1, out_itemsize=1)
    chosen = {p.itemsize: map_nest("matrix", p, HW) for p in (fp32, int8)}
    volume = {k: m.tile_oh * m.tile_ow * m.tile_o * m.tile_c for k, m in chosen.items()}
    traffic = {p.itemsize: (lambda w: w.loads[1] + w.startup[1])(
        nest_cost(LayerShape.of("matrix", p), chosen[p.itemsize], HW, Exact).work) for p in (fp32, int8)}
    assert volume[1] > volume[4]
    assert traffic[1] * 4 < traffic[4]


def test_a_tile_slot_is_as_wide_as_the_widest_value_it_holds():
    """An int8 tile input converted to float32 in place needs four bytes an element; read only, one."""
    expr = (Step("to_f32", (1,)), Step("add", (0, 2)))
    dtypes = (DType.F32, DType.I8)
    assert tile_expr.slot_itemsizes(expr, tile_expr.plan(expr, 2, frozenset({0, 1})), dtypes, [1]) == [4]
    assert tile_expr.slot_itemsizes(expr, tile_expr.plan(expr, 2, frozenset({0})), dtypes, [1]) == [1, 4]
    assert buffers.slot_offsets([1, 4, 2], 3) == [18, 0, 12]   # widest first: each aligned to its elements


def test_a_select_never_takes_its_predicates_slot():
    """select(pred, on_false, on_true) copies on_false to its destination first: a predicate or on_true
    dying there keeps its slot until after (its slot taken, the copy overwrote the predicate)."""
    expr = (Step("to_i32", (0,)), Step("to_i32", (1,)), Step("select", (4, 2, 3)))   # on_false: a scalar input
    p = tile_expr.plan(expr, 3, frozenset())
    assert p.dst[2] not in (p.dst[0], p.dst[1])


def _objectives(cost) -> dict:
    """Each objective of a nest's cost as the mapper defines it: cycles with the instruction charge,
    energy over those cycles, their product."""
    from stagec.lower.schedule.search import INSTRUCTION_CHARGE, TUNABLE, objective_of
    from stagec.sim.energy import energy_pj
    cycles = float(cost.cycles + INSTRUCTION_CHARGE * cost.instructions)
    energy = float(sum(energy_pj(cost.actions, cycles, HW).values()))
    return {o: float(objective_of(cycles, energy, o)) for o in TUNABLE}


def test_the_mapper_minimizes_its_objective_over_every_candidate_that_fits():
    """Exhaustive search, one candidate at a time: for each objective, none of the grid's points
    that fit beats the mapper's choice."""
    from stagec.lower.schedule.nest_map import candidates
    from stagec.lower.schedule.search import TUNABLE
    p = ConvProblem(1, 24, 4, 4, 20, 3, 3, padding=((1, 1), (1, 1)), itemsize=1, out_itemsize=1)
    grid, ok = candidates(LayerShape.of("matrix", p))
    shape = np.broadcast_shapes(ok.shape, *(np.shape(getattr(grid, f.name)) for f in dataclasses.fields(grid)))
    best = dict.fromkeys(TUNABLE, np.inf)
    for idx in zip(*np.nonzero(np.broadcast_to(ok, shape)), strict=True):
        m = TileMapping(*(np.broadcast_to(getattr(grid, f.name), shape)[idx].item()
                          for f in dataclasses.fields(grid)))
        cost = nest_cost(LayerShape.of("matrix", p), m, HW, Exact)
        if fits(p, cost.spad_bytes, cost.acc_bytes, m.tile_oh, m.tile_ow, HW):
            best = {o: min(v, _objectives(cost)[o]) for o, v in best.items()}
    for o in TUNABLE:
        chosen = nest_cost(LayerShape.of("matrix", p), map_nest("matrix", p, HW, objective=o), HW, Exact)
        assert _objectives(chosen)[o] == pytest.approx(best[o], rel=1e-9), o


def test_random_mappings_are_legal_candidates_drawn_across_the_space():
    """DOSA-style random search's mappings (mapper.random_mapping): each a point of the mapper's grid
    that is a candidate and fits the config, the draws spread over many of them, seeded; a config
    nothing fits is the mapper's own TilingError."""
    from stagec.errors import TilingError
    from stagec.lower.schedule.nest_map import candidates, footprint, random_mapping
    p = ConvProblem(1, 24, 10, 10, 40, 3, 3, padding=((1, 1), (1, 1)))
    hw = HardwareConfig(scratchpad_bytes=8192, accumulator_bytes=4096)
    grid, ok = candidates(LayerShape.of("matrix", p))
    shape = np.broadcast_shapes(ok.shape, *(np.shape(getattr(grid, f.name)) for f in dataclasses.fields(grid)))
    legal = {tuple(np.broadcast_to(getattr(grid, f.name), shape)[idx].item() for f in dataclasses.fields(grid))
             for idx in zip(*np.nonzero(np.broadcast_to(ok, shape)), strict=True)}
    draws = [random_mapping("matrix", p, hw, np.random.default_rng(k)) for k in range(30)]
    for m in draws:
        assert tuple(int(getattr(m, f.name)) for f in dataclasses.fields(m)) in legal
        spad, acc = footprint("matrix", p, m)
        assert fits(p, spad, acc, m.tile_oh, m.tile_ow, hw)
    assert len(set(draws)) > 20
    assert random_mapping("matrix", p, hw, np.random.default_rng(3)) == draws[3]
    with pytest.raises(TilingError, match="conv7: no tiling fits the scratchpad"):
        random_mapping("matrix", p, hw.replace(scratchpad_bytes=64), np.random.default_rng(0), layer="conv7")


@pytest.mark.parametrize("objective", ["latency", "energy", "edp"])
def test_the_mappers_pruned_search_picks_what_composing_every_candidate_picks(objective):
    """On grids of thousands of candidates (the test above has fewer than the mapper composes before it
    prunes), the mapper composes only those whose bound may beat the best found: composing every
    candidate that fits must pick the same mapping, ties included."""
    from stagec.isa import HardwareConfig
    from stagec.lower.schedule.nest import ConvProblem, Exact, LayerShape
    from stagec.lower.schedule.nest_cost import nest_cost
    from stagec.lower.schedule.nest_map import Candidates, _at, candidates, map_nest
    from stagec.lower.schedule.search import INSTRUCTION_CHARGE, objective_of
    from stagec.sim.energy import energy_pj

    problems = [("matrix", ConvProblem(1, 64, 28, 28, 64, 3, 3, padding=((1, 1), (1, 1)))),
                ("matrix", ConvProblem(1, 160, 14, 14, 320)), ("depthwise", ConvProblem(1, 1, 56, 56, 96, 3, 3))]
    configs = [HardwareConfig(), HardwareConfig(array_rows=8, array_cols=32, scratchpad_bytes=32 * 1024,
                                                dataflow="output_stationary", dma_bandwidth_bytes_per_cycle=4.0)]
    for (kind, p), hw in ((pk, hw) for pk in problems for hw in configs):
        L = LayerShape.of(kind, p)
        grid_m, ok = candidates(L)
        shape = np.broadcast_shapes(np.shape(ok), *(np.shape(v) for v in vars(grid_m).values()))
        m = _at(grid_m, shape, np.arange(math.prod(shape)))      # every point of the grid, flat
        cost = nest_cost(L, m, hw, Exact)
        charged = cost.cycles + INSTRUCTION_CHARGE * cost.instructions
        energy = sum(energy_pj(cost.actions, charged, hw).values())
        grid = Candidates(p, m, np.broadcast_to(ok, shape).reshape(-1), cost.spad_bytes, cost.acc_bytes,
                           objective_of(charged, energy, objective))
        values = np.where(grid.fit(hw), grid.values[0], np.inf)
        assert np.isfinite(values).sum() > 1000   # more than the mapper composes before it prunes
        assert map_nest(kind, p, hw, objective=objective) == grid.candidate(int(np.argmin(values)))


def test_an_edp_mapping_reads_a_transformers_weights_once():
    """A transformer's FFN matmul in int8 (128 tokens, 768 -> 3072) on an array of one int8 MAC a PE: the
    fastest mapping re-reads the weights for every block of tokens; EDP's holds all 128 tokens and
    streams the weights once, for a fraction of the DRAM bytes and a little more time.  (Packed four a
    PE, the array is no longer the bottleneck and the fastest mapping reads them once too.)"""
    p = ConvProblem(1, 768, 1, 128, 3072, itemsize=1, out_itemsize=1)
    hw = HW.replace(array_subword_packing=False)
    costs = {o: nest_cost(LayerShape.of("matrix", p), map_nest("matrix", p, hw, objective=o), hw, Exact)
             for o in ("latency", "edp")}
    dram = {o: float(c.actions.dram_read_bytes + c.actions.dram_write_bytes) for o, c in costs.items()}
    assert dram["edp"] < 0.25 * dram["latency"]
    assert dram["edp"] < 1.25 * (768 * 3072 + 128 * 768 + 128 * 3072)   # weights, input and output, about once
    assert float(costs["edp"].cycles) < 1.3 * float(costs["latency"].cycles)
