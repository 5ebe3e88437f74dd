"""CLAMP (isa) and fold_clamps (lower.graph.clamp): a float layer's bias add and ReLU/ReLU6/hardtanh as one
vector instruction per epilogue tile, equal to the three it replaces."""

import collections

import numpy as np
import pytest
import torch
from helpers import check_fused_against_unfused, rel_err, simulated
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import mutate

import stagec
from stagec.isa import HardwareConfig, VerificationError, assemble, disassemble, verify
from stagec.isa.instructions import Opcode, VectorFunc
from stagec.isa.opcodes import VECTOR_FUNCS
from stagec.isa.semantics import NUMPY, table_index
from stagec.lower.graph.clamp import fold_clamps
from stagec.lower.graph.evaluate import evaluate
from stagec.pipeline import PIPELINE, Compilation, Request, position, run
from stagec.sim.reference import execute

SMALL = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=128 * 1024, accumulator_bytes=32 * 1024)
WITHOUT_FOLD = tuple(s for s in PIPELINE if s.name != "fold_clamps")


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([(0.0, 6.0), (-0.5, 1.5), (0.0, np.inf), (-np.inf, 2.0)]))
def test_clamp_function_is_the_add_max_min_it_replaces(seed, bounds):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    bias = (rng.standard_normal((3, 1, 1)) * 2).astype(np.float32)
    # the layer's table (lo, hi, 0, 0, a bias per i0), read whole; the biases from word n3 = 4 at strides (1, 0, 0)
    table = np.concatenate([np.float32([*bounds, 0, 0]), bias.reshape(-1)]).reshape(1, 1, 1, -1)
    got = VECTOR_FUNCS[VectorFunc.CLAMP].apply(NUMPY, x, table, table_index((3, 4, 5, 4), (1, 0, 0)))
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
    # bit for bit as the ISA defines them (the reference interpreter); the batched executor's matmul sums may
    # group differently once the epilogues change, a rounding step apart
    (ref,), (ref_before,) = (execute(p, [x.numpy()]) for p in (folded, before))
    assert np.array_equal(ref, ref_before) and rel_err(y, y_before) < 1e-6
    assert rel_err(y, model(x).detach().numpy()) < 1e-5


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


def linear_relu6():
    """(program, x) of Linear(8 -> 24) + ReLU6, float32: one CLAMP table of 4 + 24 words."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.ReLU6()).eval()
    x = torch.randn(5, 8) * 3
    c = run(PIPELINE, Compilation(Request(model, (x,), hw=SMALL)))
    return c, model, x


def test_one_clamp_table_per_layer():
    """The layer's bounds are held once: its constant is lo, hi, 0, 0 and its 24 biases (no bounds per
    channel); its CLAMPs read the biases from word n3 = 4 + the tile's first channel, which the assembly
    spells; both simulators equal PyTorch."""
    c, model, x = linear_relu6()
    (table,) = [a for a in c.graph.constants.values() if a.dtype == np.float32 and a.size == 4 + 24]
    np.testing.assert_array_equal(table[:4], [0, 6, 0, 0])
    np.testing.assert_array_equal(table[4:], model[0].bias.detach().numpy())
    code = c.program.code
    clamps = np.flatnonzero((code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.CLAMP))
    assert clamps.size and set(code["n"][clamps, 3] - 4) == {0}    # one channel tile
    assert assemble(disassemble(c.program)) == c.program
    want = model(x).detach().numpy()
    assert rel_err(stagec.simulate(c.program, x)[0], want) < 1e-6
    assert rel_err(execute(c.program, [x.numpy()])[0], want) < 1e-6


def test_a_clamp_reading_past_its_table_is_refused():
    """The verifier's rules for a table: biases after the header (n3 >= 4), at non-negative strides, and
    the words up to the last one read inside the memory and written before (the dataflow walk)."""
    c, _, _ = linear_relu6()
    p = c.program
    code = p.code
    i = int(np.flatnonzero((code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.CLAMP))[0])
    n = code["n"][i].copy()
    end = (SMALL.scratchpad_bytes - int(code["z_base"][i])) // 4     # the table's last word past the scratchpad
    outside = "does not fit the scratchpad|reads scratchpad bytes .* outside"
    unwritten = SMALL.scratchpad_bytes // 8       # half-way into the scratchpad, past every buffer this program holds
    for n3, message in ((2, "n3 must be at least 4"), (end, outside), (unwritten, "which nothing wrote")):
        n[3] = n3
        with pytest.raises(VerificationError, match=message) as e:
            verify(mutate(p, i, n=n))
        assert e.value.index == i
    strides = code["z_strides"][i].copy()
    strides[2] = -1
    with pytest.raises(VerificationError, match="non-negative"):
        verify(mutate(p, i, z_strides=strides))
