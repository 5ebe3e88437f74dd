"""int8 and bf16 no slower than fp32 where they do the same work (issue 18): a bf16 layer's clamp folded as
fp32's is, its rounding done by the epilogue's last step; int8 attention's two sweeps pipelined, so the
array and the vector unit overlap, and sized as the attention it is (unmasked: no mask's buffers).

Small shapes on a small array; correctness against the program compiled without the change (bit for bit),
the integer reference (stagec.int8_reference) and PyTorch."""

import dataclasses

import numpy as np
import torch
from helpers import rel_err, simulated
from test_clamp import WITHOUT_FOLD, block, vector_funcs
from test_int8_attention import assert_matches_reference
from test_int8_flash import attention_graph, lowered

import stagec
from stagec.isa import HardwareConfig
from stagec.isa.instructions import DType, Opcode, VectorFunc
from stagec.lower.graph.graph_ir import Graph
from stagec.lower.schedule.flash_int8 import (
    Int8Attention,
    int8_flash_buffers,
    int8_flash_cost,
    map_int8_flash,
    match,
    shape_of,
)
from stagec.lower.schedule.halo import RECOMPUTE
from stagec.pipeline import PIPELINE, position, run
from stagec.report import make_report

SMALL = HardwareConfig(array_rows=8, array_cols=8, scratchpad_bytes=128 * 1024, accumulator_bytes=32 * 1024)


def test_a_bf16_clamped_conv_folds_its_epilogue_and_rounds_it_as_it_writes(monkeypatch):
    """A bf16 ReLU6 block: each expand/depthwise epilogue is one CLAMP (was add, relu, min and a COPY to
    bf16 in a cascade), writing bf16 where the cascade keeps its intermediate; the result is the unfolded
    program's bit for bit and PyTorch's within bf16's rounding; no bf16 layer takes more cycles than fp32's.
    (Its halo recomputed: a line buffer COPYs its shared rows forward, in bf16.)"""
    monkeypatch.setattr("stagec.lower.schedule.cascade_map.HALOS", (RECOMPUTE,))
    model, x = block(torch.nn.ReLU6)
    folded, y, report = simulated(model, x, hw=SMALL, quantize="bf16")
    before, y_before, _ = simulated(model, x, hw=SMALL, stages=WITHOUT_FOLD, quantize="bf16")
    now, was = vector_funcs(folded), vector_funcs(before)
    assert now["CLAMP"] == was["MIN"] > 0 and now["RELU"] == now["MIN"] == 0
    code = folded.code
    clamps = code[(code["opcode"] == Opcode.VECTOR) & (code["func"] == VectorFunc.CLAMP)]
    assert (clamps["out_dtype"] == DType.BF16).any()        # a cascade's bf16 intermediate, rounded by CLAMP
    vectors = code[code["opcode"] == Opcode.VECTOR]
    assert not ((vectors["func"] == VectorFunc.COPY) & (vectors["out_dtype"] == DType.BF16)).any()
    assert np.array_equal(y, y_before) and rel_err(y, model(x).detach().numpy()) < 2e-2
    _, _, fp32 = simulated(model, x, hw=SMALL)
    fp32_cycles = {r.name: r.cycles for r in fp32.layers}
    convs = [r for r in report.layers if r.op == "conv"]     # not the input's copy to bf16, which fp32 has not
    assert len(convs) == 3 and all(r.cycles <= fp32_cycles[r.name] for r in convs)


def _with_pipelining(c, pipelined: bool):
    """Compilation `c`'s program again, its int8 attention cascade pipelined or not."""
    cascades = tuple(dataclasses.replace(a, pipelined=pipelined) if isinstance(a, Int8Attention) else a
                     for a in c.schedule.cascades)
    schedule = dataclasses.replace(c.schedule, cascades=cascades)
    return run(PIPELINE[position("program"):], dataclasses.replace(c, schedule=schedule)).program


def test_pipelined_int8_attention_overlaps_the_units_and_computes_the_same():
    """Int8 attention (2 heads, 48 tokens) on a small array: pipelined, its program computes what the
    sweeps one after the other compute, bit for bit (the same instructions, reordered, the score rows
    and maxes double-buffered), the integer reference's values; it takes fewer cycles, as the cost says."""
    _, x, graph = attention_graph(2, 48)
    (cascade,) = [a for a in lowered(graph, SMALL).schedule.cascades if isinstance(a, Int8Attention)]
    pv = [n for n in graph.nodes if n.name == cascade.layers[-1]][0].output     # P·V's int8 result, an output too
    graph = Graph(graph.inputs, graph.outputs + (pv,), graph.nodes, graph.constants)
    c = lowered(graph, SMALL)
    programs = {p: _with_pipelining(c, p) for p in (True, False)}
    outs = {p: stagec.simulate(prog, x.numpy()) for p, prog in programs.items()}
    for a, b in zip(outs[True][0], outs[False][0], strict=True):
        assert np.array_equal(a, b)
    assert_matches_reference(graph, [x.numpy()], outs[True][0], fp32_tolerance=1e-5)
    (pattern,) = match(graph, c.layout)
    cycles = {p: make_report(programs[p]).cycles for p in programs}
    assert cycles[True] < cycles[False]
    for p in programs:
        cost = int8_flash_cost(shape_of(pattern, graph, c.layout, pipelined=p), *cascade.tile, SMALL)
        spans = [r.cycles for r in make_report(programs[p]).layers if r.name in cascade.layers]
        # the cycles, not the charge the search ranks by (which adds a charge per instruction: no time)
        assert abs(cost.cycles - sum(spans)) <= 0.25 * sum(spans), p


def test_an_unmasked_int8_attention_is_sized_without_a_mask():
    """The mapper sizes an unmasked attention's buffers as the emitter allocates them: no float score row
    or mask blocks (it had sized them as a masked one's, four times the bytes, and so took smaller blocks)."""
    _, _, graph = attention_graph(2, 48)
    c = lowered(graph, SMALL)
    (pattern,) = match(graph, c.layout)
    (tq, tk), *_ = map_int8_flash(shape_of(pattern, graph, c.layout), SMALL, "edp")[0]
    _, sh = map_int8_flash(shape_of(pattern, graph, c.layout), SMALL, "edp")
    assert sh.mask is None
    names = {b.name for b in int8_flash_buffers(sh, tq, tk)}
    assert "sf" not in names and "mask" not in names


def test_an_int8_transformer_block_takes_no_more_cycles_than_fp32():
    """Whisper's encoder layer, small (width 64, 4 heads, 96 frames, FFN 128) on a small array: int8
    (its softmax, layer norms and GELU bf16 islands) simulates in no more cycles than fp32."""
    from stagec import zoo
    hf = zoo._transformers()
    config = hf.WhisperConfig(d_model=64, encoder_layers=1, encoder_attention_heads=4, encoder_ffn_dim=128,
                              num_mel_bins=8, max_source_positions=96, attn_implementation="sdpa")
    model = zoo._instantiate(hf.models.whisper.modeling_whisper.WhisperEncoder, config)
    mel = torch.randn(1, 8, 192, generator=torch.Generator().manual_seed(1))
    calibration = [((torch.randn(1, 8, 192, generator=torch.Generator().manual_seed(s)),), {}) for s in (2, 3)]
    cycles = {}
    for quantize in ("int8", None):
        program = stagec.compile(model, (mel,), hw=SMALL, quantize=quantize,
                                 calibration=calibration if quantize else None)
        cycles[quantize] = make_report(program).cycles
    assert cycles["int8"] <= cycles[None]
