"""Configs that differ in their memories alone share one pricing of a layer's candidates
(lower.schedule.mapper.shared_pricing, what codesign's exact search scores configs under): the nest's
cost does not depend on the capacities, and the mapper's choice with the pricing shared is the one it
makes alone, for every objective, where the capacities bind."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stagec.isa import HardwareConfig
from stagec.lower.schedule import nest_map
from stagec.lower.schedule.nest import ConvProblem, Exact, LayerShape
from stagec.lower.schedule.nest_cost import nest_cost
from stagec.lower.schedule.nest_map import candidates, map_nest, priced_on, shared_pricing
from stagec.lower.schedule.search import OBJECTIVES

PAD = ((1, 1), (1, 1))
LAYERS = [("matrix", ConvProblem(1, 24, 10, 10, 40, 3, 3, padding=PAD)),
          ("matrix", ConvProblem(1, 48, 6, 6, 20, itemsize=1, out_itemsize=1)),
          ("depthwise", ConvProblem(1, 16, 12, 12, 16, 3, 3, (2, 2), PAD)),
          ("pool", ConvProblem(1, 8, 8, 8, 8, 2, 2, (2, 2)))]
# the same array, vector unit and DMA; memories nothing fits, then tight (the capacities bind) to roomy
MEMORIES = [dict(scratchpad_bytes=64, scratchpad_banks=1, accumulator_bytes=64, accumulator_banks=1),
            dict(scratchpad_bytes=4096, scratchpad_banks=2, accumulator_bytes=1024, accumulator_banks=1),
            dict(scratchpad_bytes=12288, scratchpad_banks=4, accumulator_bytes=4096, accumulator_banks=2),
            dict(scratchpad_bytes=65536, scratchpad_banks=8, accumulator_bytes=16384, accumulator_banks=4)]
BASE = HardwareConfig(array_rows=8, array_cols=4, dma_bandwidth_bytes_per_cycle=8)


@pytest.mark.parametrize("kind,p", LAYERS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(LAYERS)])
def test_a_nest_costs_the_same_whatever_its_memories_hold(kind, p):
    """Every candidate of the mapper's grid: cycles, instructions, action counts and footprint equal
    on configs that differ in capacities and banks alone (what priced_on drops)."""
    L = LayerShape.of(kind, p)
    m, ok = candidates(L)
    shape = np.broadcast_shapes(ok.shape, *(np.shape(getattr(m, f.name)) for f in dataclasses.fields(m)))
    points = nest_map._at(m, shape, np.flatnonzero(np.broadcast_to(ok, shape))[::7])   # thousands, every switch
    costs = [nest_cost(L, points, BASE.replace(**memories), Exact) for memories in MEMORIES]
    for cost in costs[1:]:
        for field in ("cycles", "instructions", "spad_bytes", "acc_bytes"):
            assert np.array_equal(getattr(cost, field), getattr(costs[0], field)), field
        for name, counts in cost.actions.to_dict().items():
            assert np.array_equal(counts, costs[0].actions.to_dict()[name]), name
    assert len({priced_on(BASE.replace(**memories)) for memories in MEMORIES}) == 1


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_mapper_chooses_alike_with_its_pricing_shared(objective):
    """Each layer on each config, the pricing shared across the configs (each config's search run
    afresh: nest_map._map_nest's cache cleared), is mapped as the mapper maps it with nothing shared."""
    configs = [BASE.replace(**memories) for memories in MEMORIES]

    def mapped():
        nest_map._map_nest.cache_clear()
        found = []
        for kind, p in LAYERS:
            for hw in configs:
                try:
                    found.append(map_nest(kind, p, hw, with_cost=True, objective=objective))
                except nest_map.TilingError as e:
                    found.append(str(e))
        return found

    alone = mapped()
    with shared_pricing():
        shared = mapped()
        assert nest_map._sharing[-1].cache_info().hits >= len(LAYERS) * (len(configs) - 1)
    assert shared == alone
    per_layer = [alone[i:i + len(configs)] for i in range(0, len(alone), len(configs))]
    assert any(isinstance(found[0], str) for found in per_layer)       # some layer fits nothing in the tightest
    if objective != "size":    # whose small tiles no memory here binds
        assert any(len({f[0] for f in found[1:]}) > 1 for found in per_layer)   # the memories bind
