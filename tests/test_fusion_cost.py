"""Fusion in the cost model (costmodel.fusion, stagec.fusing) and in co-design: the relaxed chain cost at
temperature 0 is the compiler's cascades' cost, which predicts the simulator; relaxed fusion choices
descend to the exhaustive optimum; codesign with fusion picks hardware that moves less DRAM."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from helpers import seeded_graph

from stagec.codesigning import Workloads, codesign_graphs
from stagec.costmodel.codesign import CodesignSettings, _step, workload_costs
from stagec.costmodel.fusion import start_params
from stagec.costmodel.hardware import hardware_point
from stagec.costmodel.model import DEFAULT_CONSTANTS
from stagec.costmodel.problem import mapping_arrays, stack
from stagec.fusing import cascades_of, schedule
from stagec.isa import HardwareConfig
from stagec.lower.schedule.cascade import MAX_MEMBERS, cascade_cost
from stagec.lower.schedule.cascade_map import map_cascade
from stagec.lower.schedule.halo import LINE
from stagec.lower.schedule.nest import Exact, LayerShape
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.lower.schedule.search import INSTRUCTION_CHARGE

HW = HardwareConfig()


class Block(torch.nn.Module):
    """An inverted residual block without its residual: 1x1 expand, depthwise 3x3, 1x1 project."""

    def __init__(self, c=16, expand=96, out=24):
        super().__init__()
        self.a = torch.nn.Conv2d(c, expand, 1)
        self.b = torch.nn.Conv2d(expand, expand, 3, padding=1, groups=expand)
        self.c = torch.nn.Conv2d(expand, out, 1)

    def forward(self, x):
        return self.c(torch.nn.functional.relu6(self.b(torch.nn.functional.relu6(self.a(x)))))


class Stem(torch.nn.Module):
    """A stem: a 3x3 stride-2 conv, then a depthwise 3x3 and a 1x1 projection."""

    def __init__(self, c=3, hidden=32, out=16):
        super().__init__()
        self.a = torch.nn.Conv2d(c, hidden, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.c = torch.nn.Conv2d(hidden, out, 1)

    def forward(self, x):
        return self.c(torch.nn.functional.relu6(self.b(torch.nn.functional.relu6(self.a(x)))))


@pytest.fixture(scope="module")
def block():
    return seeded_graph(Block(), (1, 16, 28, 28))


def _relaxed(work: Workloads, hw, fusion, smooth):
    """The descent's (cycles, energy, violation) of the one model with `fusion`'s relaxed parameters."""
    maps = stack([mapping_arrays(work.mapping(u, hw)) for u in work.rows])
    return workload_costs(work.shapes, maps, hardware_point(hw), work.counts, work.workload, 1, DEFAULT_CONSTANTS,
                          smooth, tuple(work.chains(hw)), fusion)


def _discrete(params):
    """The start parameters with each switch's choice made (edges, weight residency, the last member's
    single accumulator tile, chunking, the line buffer): probability 0 or 1."""
    def sure(logits):
        return jnp.where(logits > 0, 1e4, -1e4)
    residency = slice(3, 2 + 2 * MAX_MEMBERS, 2)
    return {"edges": tuple(map(sure, params["edges"])),
            "segments": tuple(t.at[:, residency].set(sure(t[:, residency])).at[:, -3:].set(sure(t[:, -3:]))
                              for t in params["segments"])}


@pytest.mark.parametrize("model", ["block", "stem"])
def test_the_relaxed_chain_cost_at_temperature_0_is_the_compilers_and_predicts_the_simulator(model, block,
                                                                                              monkeypatch):
    """One source of truth: the descent's chain cost with the compiler's fusion choice and tiles, at
    temperature 0, is the exact model's price of the compiler's schedule (its cascades' cost,
    lower.schedule.cascade.cascade_cost); that predicts the simulated program's DRAM bytes exactly and
    its cycles within 15% (as tests/test_halo_cascade.py's cascade alone).  The compiler keeps a line
    buffer on this block (lower.schedule.halo.LINE), which the relaxed segment's halo logit takes; on
    the stem, forced, its conv's kernel rows stacked, which the relaxed segment takes with it."""
    if model == "stem":
        monkeypatch.setattr("stagec.lower.schedule.cascade_map.HALOS", (LINE,))
        block = seeded_graph(Stem(), (1, 3, 32, 32))
    work = Workloads([block], "latency", DEFAULT_CONSTANTS)
    c = schedule(block, HW, "latency")
    (cascade,) = cascades_of(c)
    assert len(cascade.layers) >= 2 and cascade.halo == LINE
    assert cascade.mappings[0].stacked == (model == "stem")
    (chain,) = work.chains(HW)
    assert sum(chain.fused) == len(cascade.layers) - 1          # the start is the compiler's choice
    cycles, energy, violation = _relaxed(work, HW, _discrete(start_params([chain], HW, "latency")), 0.0)
    predicted = work.predict(HW)
    assert float(cycles[0]) == pytest.approx(predicted[0][0], rel=1e-5)
    assert float(energy[0]) == pytest.approx(predicted[1][0], rel=1e-5)
    assert float(violation) == 0.0
    unfused = Workloads([block], "latency", DEFAULT_CONSTANTS, fusion=False)
    assert unfused.predict(HW, unfused.model_mappings(HW))[2][0] > predicted[2][0]   # fused moves less DRAM
    (report,) = work.simulate(HW)
    assert [k["layers"] for k in report.cascades] == [list(cascade.layers)]
    assert predicted[2][0] == report.actions.dram_read_bytes + report.actions.dram_write_bytes
    assert predicted[0][0] == pytest.approx(report.cycles, rel=0.15)


def _segmentations(n: int):
    """Every way to cut a chain of n members: per edge, fused (True) or cut."""
    return list(itertools.product((False, True), repeat=n - 1))


def _groups(edges) -> list[tuple[int, int]]:
    cuts = [0] + [e + 1 for e, fused in enumerate(edges) if not fused] + [len(edges) + 1]
    return list(zip(cuts, cuts[1:], strict=False))


def test_relaxed_fusion_descends_to_the_exhaustive_optimum():
    """Three 1x1 convolutions on a small grid of scratchpad sizes: every way to cut the chain (a fused
    segment at its best legal tiling, map_cascade; illegal where none fits) priced exactly, the
    cheapest (1) by the compiler's charged cycles is the compiler's choice, and (2) by the cost model's
    cycles is where the relaxed edges descend from undecided (probability 1/2) at a low temperature,
    rounded."""
    graph = seeded_graph(torch.nn.Sequential(torch.nn.Conv2d(16, 64, 1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 1),
                                       torch.nn.ReLU(), torch.nn.Conv2d(64, 16, 1)), (1, 16, 24, 24))
    chosen = set()
    for kib in (16, 32, 64, 128):
        hw = HardwareConfig(scratchpad_bytes=kib * 1024)
        work = Workloads([graph], "latency", DEFAULT_CONSTANTS)
        (chain,) = work.chains(hw)
        compiler = {tuple(k.layers) for k in cascades_of(schedule(graph, hw, "latency"))}
        charged, model = _exhaustive(work, chain, hw)
        assert {chain.names[i:j] for i, j in _groups(charged) if j - i > 1} == compiler
        assert tuple(e > 0 for e in _descend(work, chain, hw)) == model, kib
        chosen.add(model)
    assert len(chosen) > 1          # the scratchpad's size changes what fuses


def _exhaustive(work, chain, hw):
    """The cheapest way to cut `chain` by the compiler's charged cycles, and by the cost model's."""
    alone = [nest_cost(LayerShape.of(*nest), work.mapping(work.rows[r], hw), hw, Exact)
             for nest, r in zip(chain.nests, chain.rows, strict=True)]
    costs = {}
    for edges in _segmentations(len(chain.nests)):
        total = np.zeros(2)
        for i, j in _groups(edges):
            if j - i == 1:
                cost = alone[i]
            else:
                mapped = map_cascade(chain.nests[i:j], hw, "latency")
                if mapped is None:
                    total += np.inf
                    continue
                cost = cascade_cost([LayerShape.of(*n) for n in chain.nests[i:j]], list(mapped[1]), hw, Exact)
            total += [cost.cycles + INSTRUCTION_CHARGE * cost.instructions, cost.cycles]
        costs[edges] = total
    return tuple(min(costs, key=lambda e: costs[e][k]) for k in (0, 1))


def _descend(work, chain, hw, steps=200):
    """The chain's edge logits after adam on the relaxed objective (log cycles + violation penalty) from
    0, the segments' tiles held at their best legal tilings (weights resident or not, not in between)."""
    params = _discrete(start_params([chain], hw, "latency"))

    @jax.jit
    def loss(edges):
        cycles, _, violation = _relaxed(work, hw, {**params, "edges": (edges,)}, 0.02)
        return jnp.log(cycles[0]) + 20.0 * violation

    edges, opt = jnp.zeros(len(chain.nests) - 1), optax.adam(0.2)
    state = opt.init(edges)
    for _ in range(steps):
        updates, state = opt.update(jax.grad(loss)(edges), state)
        edges = optax.apply_updates(edges, updates)
    return np.asarray(edges)


SMALL = CodesignSettings(steps=10, array_range=(4.0, 16.0), memory_range=(32768.0, 262144.0), starts=2, confirm=2,
                         report_every=0)


def test_codesign_with_fusion_moves_less_dram_and_predicts_it():
    """An inverted residual block's tail (depthwise 3x3, 1x1 projection; its 96-channel activation can
    stay on chip): at one area budget, codesign with fusion picks a config whose simulated program
    (fused, as compile fuses it) moves no more DRAM than the layer-by-layer pick's, and its prediction
    is the simulated DRAM traffic (exactly: the cascade's bytes are the program's) and cycles within
    20%.  (The tail, not the whole block: each kind of segment is one more XLA compilation of the
    descent's step, minutes on a loaded CPU.)"""
    tail = seeded_graph(torch.nn.Sequential(torch.nn.Conv2d(96, 96, 3, padding=1, groups=96), torch.nn.ReLU6(),
                                      torch.nn.Conv2d(96, 24, 1)), (1, 96, 14, 14))
    compiled = _step._cache_size()
    fused = codesign_graphs([tail], 2.0, settings=SMALL, progress=False)
    # one compilation of the descent's step for all its steps (a leaf whose type changed after adam's
    # first update once cost two more, a minute each)
    assert _step._cache_size() - compiled <= 1
    alone = codesign_graphs([tail], 2.0, settings=SMALL, progress=False, fusion=False)

    def dram(result):
        return result.reports[0].actions.dram_read_bytes + result.reports[0].actions.dram_write_bytes

    assert fused.area_mm2 <= 2.0 and alone.area_mm2 <= 2.0
    assert fused.reports[0].cascades and not alone.reports[0].cascades
    assert dram(fused) <= dram(alone)
    for result in (fused, alone):
        assert result.predicted_dram_bytes[0] == dram(result)
        assert result.predicted_cycles[0] == pytest.approx(result.reports[0].cycles, rel=0.2)
