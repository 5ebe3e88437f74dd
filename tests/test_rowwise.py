"""Row cascades (lower.schedule.rowwise, lower.codegen.rowwise): a residual add -> layer norm's vector
layers in one pass per row block; checked against PyTorch, against the same model compiled layer by
layer, its cost against the simulator, refused where it does not fit; an int8 graph's float islands and
a bf16 graph's norms too."""

import numpy as np
import pytest
import torch
from helpers import rel_err, vector_busy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_int8_attention import assert_matches_reference, cosine

import stagec
from stagec import zoo
from stagec.isa import HardwareConfig
from stagec.lower.graph.graph_ir import Graph
from stagec.lower.schedule.rowwise import RowCascade, row_cost
from stagec.lower.schedule.rowwise import plans as row_plans
from stagec.pipeline import PIPELINE, Compilation, Request, position, run
from stagec.report import make_report
from stagec.sim.energy import energy_pj

# 24 KiB of scratchpad: a few rows a block, so blocks alternate buffers and the last one is ragged
TIGHT = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=24 * 1024, accumulator_bytes=8 * 1024,
                       dma_bandwidth_bytes_per_cycle=4.0)


class PostNorm(torch.nn.Module):
    """LayerNorm(x + y): the sum is read by the norm alone, so it never goes to DRAM."""

    def __init__(self, width: int):
        super().__init__()
        torch.manual_seed(0)
        self.norm = torch.nn.LayerNorm(width)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

        self.eval()

    def forward(self, x, y):
        return self.norm(x + y)


class PreNorm(torch.nn.Module):
    """A pre-norm block's seam: h = x + f(x) is the next residual, so its store stays, its re-reads go."""

    def __init__(self, width: int):
        super().__init__()
        torch.manual_seed(0)
        self.f, self.g = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.eval()

    def forward(self, x):
        h = x + self.f(x)
        return self.g(self.norm(h)) + h


class RMSNorm(torch.nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w after a residual add (LLaMA's norm): the same kind of chain."""

    def __init__(self, width: int):
        super().__init__()
        torch.manual_seed(1)
        self.w = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x, y):
        h = x + y
        return h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) * self.w


def inputs(model, rows=(2, 37), width=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = 1 if isinstance(model, PreNorm) else 2
    return tuple(torch.randn(*rows, width, generator=g) * 3 + 1 for _ in range(n))


def compiled(model, args, **options):
    return run(PIPELINE, Compilation(Request(model, args, **options)))


def rows_of(c) -> list[RowCascade]:
    return [x for x in c.schedule.cascades if isinstance(x, RowCascade)]


def moved(report) -> float:
    return report.actions.dram_read_bytes + report.actions.dram_write_bytes


@pytest.mark.parametrize("kind", [PostNorm, PreNorm, RMSNorm])
@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_row_cascade_matches_pytorch_and_the_unfused_program(kind, hw):
    model = kind(48)
    args = inputs(model)
    c = compiled(model, args, hw=hw)
    (cascade,) = rows_of(c)
    assert cascade.layers[0].startswith("add") and any("reduce" in name for name in cascade.layers)
    if hw is TIGHT:
        assert cascade.tile[0] < 74 and 74 % cascade.tile[0]       # several blocks, the last one ragged
    y, report = stagec.simulate(c.program, *args)
    y_alone, alone = stagec.simulate(stagec.compile(model, args, hw=hw, fuse_layers=False), *args)
    ref = model(*args).detach().numpy()
    assert rel_err(y, ref) < 1e-5
    assert rel_err(y, y_alone) < 1e-5
    # layer by layer the sum goes to DRAM and comes back at least twice (the row sum, the deviations)
    assert moved(report) + 2 * 74 * 48 * 4 <= moved(alone)


def test_pre_norm_keeps_the_residual_store_not_its_rereads():
    """The residual sum is stored once (the block's last add reads it) and never read back inside."""
    model = PreNorm(64)
    args = inputs(model, width=64)
    c = compiled(model, args)
    (cascade,) = rows_of(c)
    report = make_report(c.program)
    layers = {r.name: r for r in report.layers}
    first = layers[cascade.layers[0]]
    assert first.actions.dram_write_bytes == 2 * 37 * 64 * 4
    reads = sum(layers[name].actions.dram_read_bytes for name in cascade.layers)
    # x, f(x), the weight and bias once each, and three scalars (1/C twice, epsilon)
    assert reads == 2 * (2 * 37 * 64 * 4) + 2 * 64 * 4 + 3 * 4


@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_the_row_cost_predicts_the_simulator(hw):
    """The cost the mapper ranks a row cascade by: its DRAM bytes, instructions and vector ops are the
    program's, its cycles within 15% of the timed simulation and its energy (over the simulated
    cycles) within 5%; the footprint it checked is the one the emitter allocated."""
    model = PostNorm(48)
    args = inputs(model, rows=(3, 50))
    c = compiled(model, args, hw=hw)
    (cascade,) = rows_of(c)
    assert f"  {cascade}\n" in str(c.schedule)
    (plan,) = row_plans(c.graph, c.layout)
    report = make_report(c.program)
    assert {r.name for r in report.layers} == set(cascade.layers)     # the program is the cascade alone
    cost = row_cost(plan, cascade.tile[0], hw)
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in report.layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in report.layers)
    assert cost.cycles == pytest.approx(report.cycles, rel=0.15)
    energy = sum(energy_pj(cost.actions, report.cycles, hw).values())
    assert energy == pytest.approx(sum(report.energy_pj.values()), rel=0.05)
    assert c.program.metadata["local_peak_bytes"][cascade.layers[0]][0] == cost.spad_bytes


def test_rows_that_do_not_fit_run_layer_by_layer():
    """Rows of 1024 floats: a block's buffers (two of each full value) outgrow 8 KiB of scratchpad,
    so the layers run alone, tiled along the row, and the result is the same."""
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=8 * 1024, accumulator_bytes=4 * 1024)
    model = PostNorm(1024)
    args = inputs(model, rows=(1, 6), width=1024)
    c = compiled(model, args, hw=hw)
    assert not rows_of(c) and row_plans(c.graph, c.layout)
    y, _ = stagec.simulate(c.program, *args)
    assert rel_err(y, model(*args).detach().numpy()) < 1e-5


def test_unfused_programs_have_no_row_cascades():
    """fuse_layers=False runs every layer alone."""
    model = PreNorm(32)
    assert not rows_of(compiled(model, inputs(model, width=32), fuse_layers=False))


def int8_islands(model, args, fallback: str):
    """(compilation, graph with every row cascade's int8 result an output too) of `model`, int8 with its
    float islands in `fallback`."""
    c = compiled(model, args, quantize="int8", calibration=[args], fallback=fallback)
    names = {name for x in rows_of(c) for name in x.layers}
    extra = tuple(n.output for n in c.graph.nodes if n.name in names and n.output.dtype == "int8")
    assert extra            # the layer norm's island ends quantizing its result for the next matmul
    return c, Graph(c.graph.inputs, c.graph.outputs + extra, c.graph.nodes, c.graph.constants)


@pytest.mark.parametrize("fallback", ["bf16", "fp32"])
@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_int8_float_islands_run_as_row_cascades(fallback, hw):
    """An int8 graph's layer norm island (int8 in, the norm's result quantized to int8 out; the residual
    add before it an integer one) runs as a row cascade: its int8 results are the layers' within 1 LSB
    (only a row's summation order differs), the outputs match the integer reference (up to rounding
    ties) and PyTorch."""
    model = PreNorm(48)
    args = inputs(model, width=48)
    c, graph = int8_islands(model, args, fallback)
    assert any("reduce" in name for x in rows_of(c) for name in x.layers)
    x = [a.numpy() for a in args]
    fused, alone = (run(PIPELINE[position("pack"):], Compilation(Request(None, hw=hw, fuse_layers=f), graph=graph))
                    for f in (True, False))
    assert rows_of(fused) and not rows_of(alone)
    got, want = (stagec.simulate(k.program, *x)[0] for k in (fused, alone))
    for a, b in zip(got[1:], want[1:], strict=True):
        assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 1
    assert_matches_reference(graph, x, got, fp32_tolerance=1e-5)
    assert cosine(got[0], model(*args).detach().numpy()) >= 0.99
    assert moved(make_report(fused.program)) < moved(make_report(alone.program))


def test_bf16_layer_norms_run_as_row_cascades():
    """quantize='bf16': the residual add -> layer norm runs as a row cascade, each value rounded to bf16
    where the layers store it: the outputs are the unfused program's (within a bf16 step of the
    outputs' scale) and PyTorch's (within bf16's precision)."""
    model = PostNorm(48)
    args = inputs(model)
    c = compiled(model, args, quantize="bf16")
    (cascade,) = rows_of(c)
    assert len(cascade.layers) == 7
    y, report = stagec.simulate(c.program, *args)
    y_alone, alone = stagec.simulate(stagec.compile(model, args, quantize="bf16", fuse_layers=False), *args)
    assert rel_err(y, y_alone) <= 2.0**-8
    assert rel_err(y, model(*args).detach().numpy()) < 2e-2
    assert moved(report) < moved(alone)


@pytest.mark.parametrize("quantize", ["int8", "bf16"])
def test_the_row_cost_counts_narrow_values(quantize):
    """The row cost of a bf16 or int8-island cascade: its DRAM bytes and vector ops (the bf16 roundings
    too) are the program's, its vector unit's cycles the simulator's (each instruction's lanes packed by
    the simulator's rule, sim.costs.vector_instruction_cycles); the footprint it checked is the one the
    emitter allocated."""
    model = PostNorm(48)
    args = inputs(model, rows=(3, 50))
    options = {"quantize": quantize} | ({"calibration": [args], "fallback": "bf16"} if quantize == "int8" else {})
    c = compiled(model, args, **options)
    (cascade,) = rows_of(c)
    names = frozenset(n.name for n in c.graph.nodes) - set(cascade.layers)
    (plan,) = row_plans(c.graph, c.layout, names)
    layers = [r for r in make_report(c.program).layers if r.name in cascade.layers]
    cost = row_cost(plan, cascade.tile[0], HardwareConfig())
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.units["vector"] == vector_busy(c.program, cascade.layers, HardwareConfig())
    assert c.program.metadata["local_peak_bytes"][cascade.layers[0]][0] == cost.spad_bytes


@pytest.mark.parametrize("name", ["whisper_tiny_encoder", "bert_base"])
def test_zoo_layer_norms_run_as_row_cascades(name):
    """Every layer norm of the reduced zoo Whisper encoder and BERT runs in one row cascade with the
    residual (or embedding) add before it; the model's outputs are the unfused program's and PyTorch's."""
    model, args, kwargs = zoo.build(name, reduced=True)
    c = compiled(model, args, kwargs=kwargs)
    norms = sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert len(rows_of(c)) == norms and all(len(x.layers) == 7 for x in rows_of(c))
    y, _ = stagec.simulate(c.program, *args, **kwargs)
    y_alone, _ = stagec.simulate(stagec.compile(model, args, kwargs=kwargs, fuse_layers=False), *args, **kwargs)
    assert rel_err(y.last_hidden_state, y_alone.last_hidden_state) < 1e-5
    assert rel_err(y.last_hidden_state, model(*args, **kwargs).last_hidden_state.detach().numpy()) < 1e-5


class Softmax(torch.nn.Module):
    def forward(self, x, y):
        return torch.softmax(x + y, -1)


def test_a_softmax_outside_attention_is_a_row_chain():
    """A softmax that no attention holds (row max, exp, row sum, recip, scale) is a chain of the same kind."""
    args = inputs(Softmax())
    c = compiled(Softmax(), args)
    (cascade,) = rows_of(c)
    assert len(cascade.layers) == 6
    y, _ = stagec.simulate(c.program, *args)
    assert rel_err(y, Softmax()(*args).numpy()) < 1e-5


class Transposed(torch.nn.Module):
    """A member's result read again transposed: that reader would need rows of later blocks."""

    def forward(self, x, y):
        h = x + y
        return (h - h.sum(-1, keepdim=True)) * h.transpose(-1, -2).reshape(h.shape)


def test_a_transposed_reread_stays_outside_the_cascade():
    """The sum's transposed view is no row of the block: its reader is left out of the cascade (which
    stores the sum for it), where taking it in would read DRAM rows not yet written."""
    hw = HardwareConfig(scratchpad_bytes=16 * 1024)
    args = (torch.randn(64, 64), torch.randn(64, 64))
    c = compiled(Transposed(), args, hw=hw)
    (cascade,) = rows_of(c)
    assert cascade.tile[0] < 64 and len(cascade.layers) == 2
    y, _ = stagec.simulate(c.program, *args)
    assert rel_err(y, Transposed()(*args).numpy()) < 1e-5


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 90), width=st.sampled_from([2, 5, 16, 48, 130]),
       spad_kib=st.sampled_from([4, 16, 64, 256]), kind=st.sampled_from([PostNorm, PreNorm, RMSNorm]))
def test_random_rows_on_random_hardware(rows, width, spad_kib, kind):
    """Whatever the rows, width and scratchpad, the chain equals the unfused program and PyTorch
    (one pass per row block where it fits and pays, layer by layer otherwise); the program verifies."""
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=spad_kib * 1024, accumulator_bytes=4 * 1024)
    model = kind(width)
    args = inputs(model, rows=(rows,), width=width)
    y, _ = stagec.simulate(stagec.compile(model, args, hw=hw), *args)
    y_alone, _ = stagec.simulate(stagec.compile(model, args, hw=hw, fuse_layers=False), *args)
    assert rel_err(y, y_alone) < 1e-5
    assert rel_err(y, model(*args).detach().numpy()) < 1e-5
