"""int8 attention as one cascade (lower.schedule.flash_int8, lower.codegen.flash_int8): its int8 score rows
in the scratchpad, never in DRAM.

Checked three ways: against the same graph compiled layer by layer (the cascade computes every layer's
values in the layers' order, but for the row sum's float order: its int8 results may differ by one
step where a float lies on a rounding boundary, and so at most 1 LSB), against the independent
integer reference (stagec.int8_reference, up to rounding ties, as tests/test_int8_attention.py), and
against fp32 PyTorch by cosine (>= 0.98, int8's target for attention)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import vector_busy
from test_int8_attention import COSINE, SelfAttention, _calibration, assert_matches_reference, cosine

import stagec
from stagec import zoo
from stagec.isa import HardwareConfig
from stagec.lower.graph.graph_ir import Graph
from stagec.lower.schedule.flash_int8 import (
    MASKED_ROLES,
    ROLES,
    Int8Attention,
    int8_flash_cost,
    map_int8_flash,
    match,
    shape_of,
)
from stagec.pipeline import PIPELINE, Compilation, Request, build_graph, position, run
from stagec.precision import calibration_batches
from stagec.report import make_report

# 4 KiB of accumulator: several query and key blocks, so both sweeps and the parities run
TIGHT = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=64 * 1024, accumulator_bytes=4 * 1024,
                       dma_bandwidth_bytes_per_cycle=4.0)


def int8_attention_of(program) -> list[dict]:
    """The program's int8 attention cascades: eight layers, the first the scores' matmul."""
    op = {layer.name: layer.op for layer in program.layers}
    return [c for c in program.metadata.get("cascades", ())
            if len(c["layers"]) == len(ROLES) and op[c["layers"][0]] == op[c["layers"][-1]] == "matmul"]


def lowered(graph: Graph, hw, fuse_layers: bool = True) -> Compilation:
    """`graph` through the stages from `pack` on: its schedule and program."""
    return run(PIPELINE[position("pack"):], Compilation(Request(None, hw=hw, fuse_layers=fuse_layers), graph=graph))


class MaskedSelfAttention(torch.nn.Module):
    """BERT's self-attention: heads split from one projection, SDPA with a padding mask (keys from
    `visible` on hidden) broadcast over heads and queries, an output projection (P·V's result int8)."""

    def __init__(self, width: int, heads: int, visible: int):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.heads, self.visible = heads, visible

    def forward(self, x):
        b, t, width = x.shape
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in self.qkv(x).chunk(3, -1))
        keep = (torch.arange(t) < self.visible).expand(t, -1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(o.transpose(1, 2).reshape(b, t, width))


def attention_graph(heads: int, tokens: int, fallback: str = "bf16", visible: int | None = None):
    """(model, x, int8 graph) of self-attention over `tokens` (width 16 a head), masked where `visible`."""
    torch.manual_seed(0)
    width = 16 * heads
    model = (SelfAttention(width, heads) if visible is None else MaskedSelfAttention(width, heads, visible)).eval()
    x = torch.randn(1, tokens, width)
    _, graph = build_graph(model, (x,), quantize="int8", calibration=_calibration(x.shape), fallback=fallback)
    return model, x, graph


@pytest.mark.parametrize("fallback", ["bf16", "fp32"])
@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_int8_attention_runs_as_one_cascade(hw, fallback):
    """Self-attention (2 heads, 48 tokens): the scores, softmax and P·V run as one cascade whose int8
    P·V result is the layers' within 1 LSB; the outputs match the integer reference and PyTorch."""
    cascade = assert_one_cascade(*attention_graph(2, 48, fallback), hw)
    assert cascade.roles == ROLES


@pytest.mark.parametrize(("fallback", "heads"), [("fp32", 2), ("bf16", 1)], ids=["fp32", "bf16-one-head"])
def test_masked_int8_attention_runs_as_one_cascade(fallback, heads):
    """BERT's masked attention: the int8 scores dequantized and the fill SELECTed where the mask is 0 in
    the float island (one layer), its max a float row's: one cascade, its float scores' row in the
    scratchpad, its P·V result the layers' within 1 LSB, the outputs the integer reference's and PyTorch's."""
    cascade = assert_one_cascade(*attention_graph(heads, 48, fallback, visible=35), TIGHT)
    assert cascade.roles == MASKED_ROLES


class OneHead3D(torch.nn.Module):
    """One head of masked self-attention over 3-D (batch, tokens, width) Q, K and V: no reshape between
    the scores' matmul and the mask."""

    def __init__(self, width: int, visible: int):
        super().__init__()
        self.qkv, self.out, self.visible = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width), visible

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        keep = (torch.arange(x.shape[1]) < self.visible).expand(x.shape[1], -1)
        return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


def test_masked_one_head_3d_int8_attention_runs_as_one_cascade():
    """The mask of 3-D scores stays a layer of its own (lower.graph.passes.fuse_epilogues): one masked
    cascade, the layers' P·V within 1 LSB, the integer reference's and PyTorch's outputs."""
    torch.manual_seed(0)
    model, x = OneHead3D(16, 35).eval(), torch.randn(1, 48, 16)
    _, graph = build_graph(model, (x,), quantize="int8", calibration=_calibration(x.shape), fallback="bf16")
    assert assert_one_cascade(model, x, graph, TIGHT).roles == MASKED_ROLES


def assert_one_cascade(model, x, graph, hw) -> Int8Attention:
    """The attention of `graph` runs as one cascade whose int8 P·V result is the layers' within 1 LSB (the
    row sum's order); the outputs match the integer reference and PyTorch; DRAM falls. The cascade."""
    c = lowered(graph, hw)
    (cascade,) = [a for a in c.schedule.cascades if isinstance(a, Int8Attention)]
    assert int8_attention_of(c.program) == [cascade.to_dict()]
    if hw is TIGHT:
        assert cascade.tile[0] < 48 and cascade.tile[1] < 48     # several query and key blocks
    pv = [n for n in graph.nodes if n.name == cascade.layers[-1]][0].output
    graph = Graph(graph.inputs, graph.outputs + (pv,), graph.nodes, graph.constants)
    fused, alone = lowered(graph, hw).program, lowered(graph, hw, fuse_layers=False).program
    (got, report), (want, unfused) = (stagec.simulate(p, x.numpy()) for p in (fused, alone))
    assert np.abs(got[1].astype(np.int32) - want[1].astype(np.int32)).max() <= 1
    assert_matches_reference(graph, [x.numpy()], got, fp32_tolerance=1e-5)
    with torch.no_grad():
        assert cosine(got[0], model(x).numpy()) >= COSINE
    moved, moved_alone = (r.actions.dram_read_bytes + r.actions.dram_write_bytes for r in (report, unfused))
    # layer by layer writes the int8 scores, E (two bytes or four) and P, and reads each back: the cascade does not
    assert moved + 2 * cascade.dims[0] * 48 * 48 * 4 <= moved_alone
    return cascade


@pytest.mark.parametrize("visible", [None, 27], ids=["unmasked", "masked"])
def test_the_cost_counts_the_programs_instructions_dram_bytes_macs_and_vector_ops(visible):
    """The cost the mapper ranks the cascade by: its instructions (each K and V LOAD once), DRAM bytes (a
    mask's too), int8 MACs and vector ops are the program's; the mask, one for both heads, is LOADed once
    per query block (its row resident), not once per head."""
    _, _, graph = attention_graph(2, 40, visible=visible)
    c = lowered(graph, TIGHT)
    (cascade,) = [a for a in c.schedule.cascades if isinstance(a, Int8Attention)]
    (pattern,) = match(graph, c.layout)
    sh = shape_of(pattern, graph, c.layout, cascade.mask.resident)
    cost = int8_flash_cost(sh, *cascade.tile, TIGHT)
    acts = cost.actions
    layers = [r for r in make_report(c.program).layers if r.name in cascade.layers]
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)
    for action in ("dram_read_bytes", "dram_write_bytes", "macs_int8", "vector_ops"):
        assert getattr(acts, action) == sum(getattr(r.actions, action) for r in layers), action
    # the vector unit's cycles are the simulator's: the int8 running max packs four a lane, the reductions' trees
    assert cost.units["vector"] == vector_busy(c.program, cascade.layers, TIGHT)
    if visible is not None:
        assert cascade.mask.heads == 2 and cascade.mask.resident
        per_head = int8_flash_cost(shape_of(pattern, graph, c.layout), *cascade.tile, TIGHT).actions
        assert per_head.dram_read_bytes - acts.dram_read_bytes == 40 * 40 * 2     # a bf16 mask read once less


def test_an_attention_that_does_not_fit_runs_layer_by_layer():
    """A head dim whose blocks cannot fit the accumulator (a 64-wide output block needs 256 bytes a query
    row, S's block more) keeps the layers apart: no cascade is emitted, and the layers compute as before."""
    torch.manual_seed(0)
    x = torch.randn(1, 16, 64)
    _, graph = build_graph(SelfAttention(64, 1).eval(), (x,), quantize="int8", calibration=_calibration(x.shape))
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=64 * 1024, accumulator_bytes=256)
    c = lowered(graph, hw)
    (pattern,) = match(graph, c.layout)
    assert map_int8_flash(shape_of(pattern, graph, c.layout), hw, "edp")[0] is None
    assert not int8_attention_of(c.program)
    y, _ = stagec.simulate(c.program, x.numpy())
    assert_matches_reference(graph, [x.numpy()], [y], fp32_tolerance=1e-5)


def test_reduced_whisper_runs_its_int8_attention_as_cascades():
    """The reduced zoo Whisper encoder, int8 with bf16 islands: both attention blocks run as one cascade
    each, the outputs are the unfused program's within an int8 step of the output's scale, and PyTorch's
    by cosine; DRAM traffic falls."""
    model, args, kwargs = zoo.build("whisper_tiny_encoder", reduced=True)
    options = {"quantize": "int8", "calibration": calibration_batches(args, kwargs, 2), "fallback": "bf16"}
    program = stagec.compile(model, args, kwargs=kwargs, **options)
    unfused = stagec.compile(model, args, kwargs=kwargs, fuse_layers=False, **options)
    assert len(int8_attention_of(program)) == 2
    y, report = stagec.simulate(program, *args, **kwargs)
    y_alone, alone = stagec.simulate(unfused, *args, **kwargs)
    got, want = np.asarray(y.last_hidden_state), np.asarray(y_alone.last_hidden_state)
    assert cosine(got, want) >= 0.9999
    with torch.no_grad():
        assert cosine(got, model(*args, **kwargs).last_hidden_state.numpy()) >= COSINE
    assert report.actions.dram_read_bytes + report.actions.dram_write_bytes < (
        alone.actions.dram_read_bytes + alone.actions.dram_write_bytes)
