"""Flash attention (lower.schedule.flash, lower.codegen.flash): Q·K^T -> softmax -> P·V per query block,
the score matrix never in DRAM; checked against PyTorch, against the same model compiled layer by
layer, its cost against the simulator, refused where it does not fit."""

import numpy as np
import pytest
import torch
from helpers import rel_err, simulated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stagec
from stagec import zoo
from stagec.isa import HardwareConfig
from stagec.lower.schedule.cascade import MAX_MEMBERS
from stagec.lower.schedule.flash import FlashAttention, flash_cost
from stagec.lower.schedule.flash_int8 import ROLES as INT8_ROLES
from stagec.pipeline import PIPELINE, Compilation, Request, run
from stagec.report import make_report
from stagec.sim.energy import energy_pj

# 8 KiB of accumulator: S's and the output's blocks force several key blocks, so the running max rescales
TIGHT = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=64 * 1024, accumulator_bytes=8 * 1024,
                       dma_bandwidth_bytes_per_cycle=4.0)
WEARABLE = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=128 * 1024, accumulator_bytes=32 * 1024,
                          dma_bandwidth_bytes_per_cycle=4.0)


class Attention(torch.nn.Module):
    """softmax(Q K^T) V over heads (the scale folded into Q, as Whisper's projection does)."""

    def forward(self, q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


def inputs(heads=2, queries=100, keys=72, dim=16, seed=0, lead=(1,)):
    """Q, K, V of `heads` heads (a batch of `lead` before them)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*lead, heads, n, dim, generator=g) * 2 for n in (queries, keys, keys))


def flash_of(program) -> list[dict]:
    """The program's flash cascades: six or seven layers (a pointwise cascade has at most MAX_MEMBERS),
    matmuls among them (a row cascade, lower.schedule.rowwise, has none)."""
    op = {layer.name: layer.op for layer in program.layers}
    return [c for c in program.metadata.get("cascades", ())
            if len(c["layers"]) > MAX_MEMBERS and any(op[name] == "matmul" for name in c["layers"])]


@pytest.mark.parametrize(("hw", "shape"), [(HardwareConfig(), (2, 100, 72, 16)), (TIGHT, (2, 100, 72, 16)),
                                           (TIGHT, (3, 37, 130, 8)), (WEARABLE, (2, 64, 256, 32))],
                         ids=["default", "tight", "tight-ragged", "wearable"])
def test_flash_attention_matches_pytorch_and_the_unfused_program(hw, shape):
    args = inputs(*shape)
    program, y, report = simulated(Attention(), args, hw=hw)
    _, y_alone, alone = simulated(Attention(), args, hw=hw, fuse_layers=False)
    (cascade,) = flash_of(program)
    q, k = cascade["tile"]
    if hw is TIGHT:
        assert k < shape[2]                     # several key blocks: the online rescaling runs
    assert rel_err(y, Attention()(*args).numpy()) < 1e-5
    assert rel_err(y, y_alone) < 1e-5
    moved = report.actions.dram_read_bytes + report.actions.dram_write_bytes
    scores = shape[0] * shape[1] * shape[2] * 4
    # layer by layer writes the scores and reads them back (and the exponentials, twice): flash does not
    assert moved + 2 * scores <= alone.actions.dram_read_bytes + alone.actions.dram_write_bytes


@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_the_flash_cost_predicts_the_simulator(hw):
    """The cost the mapper ranks a flash cascade by: its DRAM bytes, instructions, MACs and vector ops
    are the program's, its cycles within 15% of the timed simulation and its energy (over the
    simulated cycles) within 2%; the footprint it checked is the one the emitter allocated."""
    args = inputs(2, 96, 80, 16, lead=())      # [heads, tokens, dim]: the output needs no copy
    c = run(PIPELINE, Compilation(Request(Attention(), args, hw=hw)))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert f"  {cascade}\n" in str(c.schedule)
    report = make_report(c.program)
    layers = [r for r in report.layers if r.name in cascade.layers]
    cost = flash_cost(cascade.dims, *cascade.tile, hw)
    for action in ("dram_read_bytes", "dram_write_bytes", "macs_fp32", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)
    assert len(layers) == len(report.layers)     # the program is the attention alone
    assert cost.cycles == pytest.approx(report.cycles, rel=0.15)
    energy = sum(energy_pj(cost.actions, report.cycles, hw).values())
    assert energy == pytest.approx(sum(report.energy_pj.values()), rel=0.02)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)


def test_attention_that_does_not_fit_runs_layer_by_layer():
    """A head dim whose blocks cannot fit the accumulator (a 64-wide output block needs 256 bytes a
    query row) keeps the layers apart, and they run as before."""
    hw = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=64 * 1024, accumulator_bytes=256)
    args = inputs(1, 16, 16, 64)
    program, y, _ = simulated(Attention(), args, hw=hw)
    assert not flash_of(program)
    assert rel_err(y, Attention()(*args).numpy()) < 1e-5


def test_int8_attention_runs_as_its_own_cascade():
    """int8 requantizes the scores before softmax and quantizes P at a fixed scale: no online softmax
    (its rescaling would change P's int8 values), the int8 cascade instead (tests/test_int8_flash.py)."""
    args = inputs(2, 32, 32, 16)
    program = stagec.compile(Attention(), args, quantize="int8", calibration=[args])
    assert [len(c["layers"]) for c in flash_of(program)] == [len(INT8_ROLES)]


@pytest.mark.parametrize("name", ["whisper_tiny_encoder", "bert_base"])
def test_zoo_attention_runs_flash_style(name):
    """The reduced zoo Whisper encoder's and BERT's (masked, scaled) self-attention blocks each run as
    one flash cascade, and the model's outputs are the unfused program's."""
    model, args, kwargs = zoo.build(name, reduced=True)
    program = stagec.compile(model, args, kwargs=kwargs)
    unfused = stagec.compile(model, args, kwargs=kwargs, fuse_layers=False)
    assert len(flash_of(program)) == 2
    y, _ = stagec.simulate(program, *args, **kwargs)
    y_alone, _ = stagec.simulate(unfused, *args, **kwargs)
    assert rel_err(np.asarray(y.last_hidden_state), np.asarray(y_alone.last_hidden_state)) < 1e-5
    assert rel_err(np.asarray(y.last_hidden_state), model(*args, **kwargs).last_hidden_state.detach().numpy()) < 1e-5


class MaskedAttention(torch.nn.Module):
    """BERT's attention: scaled scores, a padding mask (each query may see the keys before its
    sequence's end), softmax, times V."""

    def __init__(self, visible: int, left: bool = False):
        super().__init__()
        self.visible, self.left = visible, left

    def forward(self, q, k, v):
        at = torch.arange(k.shape[-2])
        keep = (at >= k.shape[-2] - self.visible if self.left else at < self.visible).expand(q.shape[-2], -1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


@pytest.mark.parametrize(("hw", "heads", "lead"), [(HardwareConfig(), 2, (1,)), (TIGHT, 2, (1,)), (TIGHT, 1, ())],
                         ids=["default", "tight", "one-head-3d"])
def test_masked_scaled_attention_runs_flash_style(hw, heads, lead):
    """The scores' scale (an epilogue of their matmul) and a mask (a select before softmax) run in the
    cascade; outputs equal PyTorch's and the unfused program's; the cost still predicts the
    simulator's DRAM bytes, instructions and vector ops.  One head given as 3-D tensors too: no view
    keeps the mask from S's matmul, whose epilogue it stays out of (lower.graph.passes.fuse_epilogues),
    taking the scale with it."""
    args, model = inputs(heads, 40, 56, 16, lead=lead), MaskedAttention(45)
    c = run(PIPELINE, Compilation(Request(model, args, hw=hw)))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert cascade.scale is not None and cascade.fill is not None and len(cascade.layers) == 7
    y, report = stagec.simulate(c.program, *args)
    _, y_alone, _ = simulated(model, args, hw=hw, fuse_layers=False)
    assert rel_err(y, model(*args).numpy()) < 1e-5
    assert rel_err(y, y_alone) < 1e-5
    layers = [r for r in report.layers if r.name in cascade.layers]
    cost = flash_cost(cascade.dims, *cascade.tile, hw, scale=True, masked=True, mask=cascade.mask)
    for action in ("dram_read_bytes", "dram_write_bytes", "macs_fp32", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads=st.integers(1, 3), queries=st.integers(1, 70), keys=st.integers(1, 90),
       dim=st.sampled_from([4, 8, 16, 24]), array=st.sampled_from([4, 8, 16]),
       spad_kib=st.sampled_from([16, 32, 64]), acc_kib=st.sampled_from([2, 4, 16]), masked=st.booleans())
def test_random_attention_on_random_hardware(heads, queries, keys, dim, array, spad_kib, acc_kib, masked):
    """Whatever the shapes and the memories, attention equals the unfused program (flash-style where a
    tiling fits and pays, layer by layer otherwise), never emitted illegally (the program verifies)."""
    hw = HardwareConfig(array_rows=array, array_cols=array, scratchpad_bytes=spad_kib * 1024,
                        accumulator_bytes=acc_kib * 1024)
    args = inputs(heads, queries, keys, dim)
    model = MaskedAttention(max(keys // 2, 1)) if masked else Attention()
    program, y, _ = simulated(model, args, hw=hw)
    _, y_alone, _ = simulated(model, args, hw=hw, fuse_layers=False)
    assert rel_err(y, y_alone) < 1e-5
    assert rel_err(y, model(*args).numpy()) < 1e-5


def test_a_mask_that_hides_a_whole_first_key_block():
    """Left padding: the first key blocks are masked for every row (SDPA's fill is -inf), so the running
    max starts at the fill; the next block's rescaling wipes those blocks out, as softmax does."""
    args, model = inputs(2, 24, 64, 8), MaskedAttention(20, left=True)
    program, y, _ = simulated(model, args, hw=TIGHT)
    (cascade,) = flash_of(program)
    assert cascade["tile"][1] < 64 - 20            # the first key block is all padding
    assert np.isfinite(y).all()
    assert rel_err(y, model(*args).numpy()) < 1e-5


@pytest.mark.parametrize("hw", [HardwareConfig(), TIGHT], ids=["default", "tight"])
def test_bf16_attention_runs_flash_style(hw):
    """quantize='bf16': attention runs flash-style with bf16 operands on the array, S, P, l and r rounded
    to bf16 where the layers store them: the outputs are the unfused program's within a bf16 step (the
    online rescaling rounds P against a running max) and as far from PyTorch's as the layers'; the cost
    counts the program's DRAM bytes, bf16 MACs, vector ops and instructions."""
    args = inputs(2, 96, 80, 16, lead=())
    c = run(PIPELINE, Compilation(Request(Attention(), args, hw=hw, quantize="bf16")))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert cascade.bf16
    if hw is TIGHT:
        assert cascade.tile[1] < 80                     # several key blocks: the online rescaling runs
    y, report = stagec.simulate(c.program, *args)
    _, y_alone, alone = simulated(Attention(), args, hw=hw, quantize="bf16", fuse_layers=False)
    assert rel_err(y, y_alone) <= 2.0**-7
    ref = Attention()(*args).numpy()     # bf16 scores of magnitude ~30 carry ~0.1 of error into exp: 5% measured
    assert rel_err(y, ref) <= 1.25 * rel_err(y_alone, ref)
    assert moved_bytes(report) + 2 * 2 * 96 * 80 * 2 <= moved_bytes(alone)
    layers = [r for r in report.layers if r.name in cascade.layers]
    cost = flash_cost(cascade.dims, *cascade.tile, hw, bf16=True, out_itemsize=cascade.out_itemsize)
    for action in ("dram_read_bytes", "dram_write_bytes", "macs_bf16", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)


def moved_bytes(report) -> float:
    return report.actions.dram_read_bytes + report.actions.dram_write_bytes


def test_bf16_zoo_whisper_runs_flash_style():
    """The reduced zoo Whisper encoder in bf16: both attention blocks flash-style, the outputs the unfused
    program's within a bf16 step of their scale."""
    model, args, kwargs = zoo.build("whisper_tiny_encoder", reduced=True)
    program = stagec.compile(model, args, kwargs=kwargs, quantize="bf16")
    unfused = stagec.compile(model, args, kwargs=kwargs, quantize="bf16", fuse_layers=False)
    assert len(flash_of(program)) == 2
    y, _ = stagec.simulate(program, *args, **kwargs)
    y_alone, _ = stagec.simulate(unfused, *args, **kwargs)
    assert rel_err(np.asarray(y.last_hidden_state), np.asarray(y_alone.last_hidden_state)) <= 2.0**-7


def test_one_head_attention_runs_flash_style():
    """One head: bmm squeezes the head dim and the batch dim, two reshapes between softmax's 1/sum and P·V,
    which defer_row_scale looks through; the attention runs as one flash cascade."""
    args = inputs(1, 40, 56, 16)
    program, y, _ = simulated(Attention(), args, hw=TIGHT)
    _, y_alone, _ = simulated(Attention(), args, hw=TIGHT, fuse_layers=False)
    assert len(flash_of(program)) == 1
    assert rel_err(y, Attention()(*args).numpy()) < 1e-5
    assert rel_err(y, y_alone) < 1e-5


def test_a_mask_shared_by_heads_is_loaded_once_per_query_block():
    """BERT's mask is one for every head: where the mapper keeps a query block's mask row resident, the
    program LOADs the mask once (its layer's DRAM reads: the mask's bytes and the fill and zero constants),
    not once per head, and the cost counts the program's DRAM bytes, instructions and vector ops."""
    args, model = inputs(3, 40, 56, 16), MaskedAttention(45)
    c = run(PIPELINE, Compilation(Request(model, args, hw=TIGHT)))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert cascade.mask.heads == 3 and cascade.mask.resident
    y, report = stagec.simulate(c.program, *args)
    assert rel_err(y, model(*args).numpy()) < 1e-5
    mask_layer = [r for r in report.layers if r.name == cascade.layers[1]][0]
    assert mask_layer.actions.dram_read_bytes == 40 * 56 * 4 + 2 * 4
    cost = flash_cost(cascade.dims, *cascade.tile, TIGHT, scale=True, masked=True, mask=cascade.mask)
    unshared = flash_cost(cascade.dims, *cascade.tile, TIGHT, scale=True, masked=True)
    assert unshared.actions.dram_read_bytes - cost.actions.dram_read_bytes == 2 * 40 * 56 * 4
    layers = [r for r in report.layers if r.name in cascade.layers]
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)


def test_bf16_masked_attention_runs_flash_style():
    """quantize='bf16' with BERT's mask: S rounded to bf16 where its layer stores it, then the fill
    SELECTed (held at float32's lowest, where the layers' bf16 rounds it to -inf: exp gives 0 for both):
    the outputs are the unfused program's within a bf16 step and as far from PyTorch's as the layers';
    the cost counts the program's DRAM bytes (a bf16 mask's two bytes an element), vector ops and
    instructions."""
    args, model, hw = inputs(2, 40, 56, 16), MaskedAttention(45), TIGHT
    c = run(PIPELINE, Compilation(Request(model, args, hw=hw, quantize="bf16")))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert cascade.bf16 and cascade.fill is not None and cascade.tile[1] < 56
    y, report = stagec.simulate(c.program, *args)
    _, y_alone, alone = simulated(model, args, hw=hw, quantize="bf16", fuse_layers=False)
    assert rel_err(y, y_alone) <= 2.0**-7
    ref = model(*args).numpy()
    assert rel_err(y, ref) <= 1.25 * rel_err(y_alone, ref)
    assert moved_bytes(report) + 2 * 2 * 40 * 56 * 2 <= moved_bytes(alone)
    layers = [r for r in report.layers if r.name in cascade.layers]
    cost = flash_cost(cascade.dims, *cascade.tile, hw, scale=True, masked=True, bf16=True,
                      out_itemsize=cascade.out_itemsize, mask=cascade.mask)
    for action in ("dram_read_bytes", "dram_write_bytes", "macs_bf16", "vector_ops"):
        assert getattr(cost.actions, action) == sum(getattr(r.actions, action) for r in layers), action
    assert cost.instructions == sum(sum(r.instructions.values()) for r in layers)


class ScaledAttention(torch.nn.Module):
    """softmax(Q K^T * scale) V, the scale a constant of S's matmul epilogue."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        return torch.softmax((q @ k.transpose(-1, -2)) * self.scale, -1) @ v


def test_a_zero_scale_is_a_scale():
    """A scale of 0.0 (every key weighted alike) is matched as the scores' scale, not taken for none:
    the attention runs as one flash cascade scaled by 0.0 and equals PyTorch."""
    args, model = inputs(2, 24, 40, 8), ScaledAttention(0.0)
    c = run(PIPELINE, Compilation(Request(model, args, hw=TIGHT)))
    (cascade,) = [x for x in c.schedule.cascades if isinstance(x, FlashAttention)]
    assert cascade.scale == 0.0
    y, _ = stagec.simulate(c.program, *args)
    assert rel_err(y, model(*args).numpy()) < 1e-5
