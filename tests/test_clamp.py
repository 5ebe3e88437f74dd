"""CLAMP (isa) and fold_clamps (lower.graph.clamp): a float layer's bias add and ReLU/ReLU6/hardtanh as one
vector instruction per epilogue tile, equal to the three it replaces."""

import collections

import numpy as np
import torch
from helpers import check_fused_against_unfused, rel_err, simulated
from hypothesis import given, settings
from hypothesis import strategies as st

from stagec.isa import HardwareConfig
from stagec.isa.instructions import Opcode, VectorFunc
from stagec.isa.opcodes import VECTOR_FUNCS
from stagec.isa.semantics import NUMPY
from stagec.lower.graph.clamp import fold_clamps
from stagec.lower.graph.evaluate import evaluate
from stagec.pipeline import PIPELINE, Compilation, Request, position, run

SMALL = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=128 * 1024, accumulator_bytes=32 * 1024)
WITHOUT_FOLD = tuple(s for s in PIPELINE if s.name != "fold_clamps")


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(0.0, 6.0), (-0.5, 1.5), (0.0, np.inf), (-np.inf, 2.0)]))
def test_clamp_function_is_the_add_max_min_it_replaces(seed, bounds):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    bias = (rng.standard_normal((3, 1, 1)) * 2).astype(np.float32)
    records = np.stack(np.broadcast_arrays(bias, *np.float32(bounds), np.float32(0)), -1).astype(np.float32)
    got = VECTOR_FUNCS[VectorFunc.CLAMP].apply(NUMPY, x, records)
    # float64: the add is exact there, rounded once to float32 as the fp32 add rounds
    want = np.clip(x.astype(np.float64) + bias, *bounds).astype(np.float32)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    before = np.minimum(np.maximum(x + bias, np.float32(bounds[0])), np.float32(bounds[1]))
    assert np.array_equal(got, before)


def block(act, seed=0):
    """An inverted residual block's body: 1x1 expand, 3x3 depthwise, 1x1 project, batch norms folded."""
    torch.manual_seed(seed)
    layers = [torch.nn.Conv2d(8, 24, 1), torch.nn.BatchNorm2d(24), act(),
              torch.nn.Conv2d(24, 24, 3, padding=1, groups=24), torch.nn.BatchNorm2d(24), act(),
              torch.nn.Conv2d(24, 8, 1)]
    model = torch.nn.Sequential(*layers).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    return model, torch.randn(1, 8, 12, 12) * 3


def vector_funcs(program) -> collections.Counter:
    code = program.code
    return collections.Counter(VectorFunc(int(f)).name for f in code["func"][code["opcode"] == Opcode.VECTOR])


def test_relu6_epilogue_is_one_clamp_per_tile_and_results_do_not_change():
    """In a cascade; layer by layer the same epilogues (test_fused_clamp_blocks_match_unfused_and_pytorch)."""
    model, x = block(torch.nn.ReLU6)
    folded, y, _ = simulated(model, x, hw=SMALL)
    before, y_before, _ = simulated(model, x, hw=SMALL, stages=WITHOUT_FOLD)
    now, was = vector_funcs(folded), vector_funcs(before)
    # each ReLU6 epilogue tile was add, relu, min: one CLAMP each now, only the projection's bias add left
    assert now["CLAMP"] == was["MIN"] > 0 and now["RELU"] == now["MIN"] == 0
    assert now["ADD"] == was["ADD"] - was["MIN"]
    assert np.abs(y - y_before).max() == 0 and rel_err(y, model(x).detach().numpy()) < 1e-5


def test_fold_keeps_the_graph_value():
    model, x = block(lambda: torch.nn.Hardtanh(-0.5, 1.5))
    graph = run(PIPELINE[:position("fold_clamps")], Compilation(Request(model, (x,)))).graph
    folded = fold_clamps(graph)
    steps = [n.attr("epilogue") for n in folded.nodes if n.attr("epilogue")]
    assert sum(e[0].func == "clamp" and len(e) == 1 for e in steps) == 2
    (a,), (b,) = evaluate(graph, x.numpy()), evaluate(folded, x.numpy())
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_fused_clamp_blocks_match_unfused_and_pytorch():
    model, x = block(torch.nn.ReLU, seed=1)
    check_fused_against_unfused(model, x, SMALL)
