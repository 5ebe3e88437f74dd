"""Every conv/matmul layer the compiler emits for any hardware config runs on the batched executor
(the suite turns the reference interpreter's fallback into an error) and matches PyTorch (fp32)
or the integer reference bit for bit (int8).

`python experiments/sweep_batched.py` draws many more cases from the same strategy."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from helpers import rel_err
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import stagec
from stagec import int8_reference
from stagec.errors import TilingError
from stagec.pipeline import build_graph
from stagec.sim.executor import Executor
from stagec.sim.plan import build_plan

MAX_INSTRUCTIONS = 20_000   # beyond, compiling and verifying take longer than a test should
MAX_OUTPUTS_PER_ACC_TILE = 2_000   # the accumulator is drawn large enough for at most this many output tiles


@dataclass(frozen=True)
class LayerCase:
    """A conv (NCHW) or linear layer, its input shape, a hardware config and the precision."""

    layer: nn.Module
    shape: tuple[int, ...]
    hw: stagec.HardwareConfig
    int8: bool
    seed: int


def _bytes(draw, lo_exp: int, hi_exp: int) -> int:
    """A memory size between 2**lo_exp and 2**hi_exp bytes, not only powers of two (a multiple of 64)."""
    e = draw(st.integers(lo_exp, hi_exp - 1))
    return (1 << e) + draw(st.integers(0, 3)) * (1 << max(e - 2, 6))


@st.composite
def layer_cases(draw) -> LayerCase:
    if draw(st.booleans()):
        kh, kw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
        dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        ph, pw = draw(st.integers(0, kh // 2 * dh)), draw(st.integers(0, kw // 2 * dw))
        groups = draw(st.sampled_from([1, 1, 1, 2, 3, 4, "depthwise"]))
        per_group = draw(st.integers(1, 300 // (1 if groups == "depthwise" else groups)))
        g = per_group if groups == "depthwise" else groups
        c, o = g * (1 if groups == "depthwise" else per_group), g * draw(st.integers(1, 300 // g))
        if groups == "depthwise":
            o = c
        h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 40))
        w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 40))
        layer = nn.Conv2d(c, o, (kh, kw), (draw(st.integers(1, 3)), draw(st.integers(1, 3))), (ph, pw), (dh, dw),
                          groups=g, bias=draw(st.booleans()))
        shape, outputs = (1, c, h, w), o * h * w * kh * kw
    else:
        m, k, n = draw(st.integers(1, 40)), draw(st.integers(1, 300)), draw(st.integers(1, 300))
        layer, shape, outputs = nn.Linear(k, n, bias=draw(st.booleans())), (m, k), m * n
    acc_lo = max(10, int(np.ceil(np.log2(outputs * 4 / MAX_OUTPUTS_PER_ACC_TILE))))
    hw = stagec.HardwareConfig(array_rows=draw(st.integers(1, 64)), array_cols=draw(st.integers(1, 64)),
                               dataflow=draw(st.sampled_from(["weight_stationary", "output_stationary"])),
                               scratchpad_bytes=_bytes(draw, 12, 23), accumulator_bytes=_bytes(draw, acc_lo, 21),
                               vector_lanes=draw(st.sampled_from([1, 4, 16, 64])))
    return LayerCase(layer.eval(), shape, hw, draw(st.booleans()), draw(st.integers(0, 2**16)))


def check(case: LayerCase) -> None:
    """Compile the case's layer, build its batched plan, and compare the simulation with its reference."""
    torch.manual_seed(case.seed)
    for p in case.layer.parameters():   # weights of the scale PyTorch initializes, drawn from the case's seed
        nn.init.uniform_(p, -1 / np.sqrt(p[0].numel()), 1 / np.sqrt(p[0].numel()))
    x = torch.randn(case.shape)
    quantize = dict(quantize="int8", calibration=[(x,)]) if case.int8 else {}
    try:
        program = stagec.compile(case.layer, (x,), hw=case.hw, **quantize)
    except TilingError:   # nothing fits a memory this small for this layer
        assume(False)
    assume(len(program.code) <= MAX_INSTRUCTIONS)
    (y,) = Executor(program).run([x.numpy()])   # its plan raises PlanError where the batched executor cannot run it
    if case.int8:
        _, graph = build_graph(case.layer, (x,), **quantize)
        np.testing.assert_array_equal(y, int8_reference.run(graph, [x.numpy()])[0])
    else:
        with torch.no_grad():
            assert rel_err(y, case.layer(x).numpy()) < 1e-5


@settings(max_examples=6)   # each example compiles and simulates a program
@given(layer_cases())
def test_every_layer_runs_batched_and_matches_its_reference(case):
    check(case)


def test_issue_16s_conv_runs_batched():
    """Conv2d 64->128 3x3 over 28x28 on a 32x32 array with 1 MiB of scratchpad: its resident weights'
    LOAD was cut in two at the DMA's count field and the conv's MATMULs read across both, which the
    plan refused (the simulator fell back to the reference interpreter)."""
    x = torch.randn(1, 64, 28, 28)
    hw = stagec.HardwareConfig(array_rows=32, array_cols=32, scratchpad_bytes=1 << 20)
    build_plan(stagec.compile(nn.Conv2d(64, 128, 3, padding=1).eval(), (x,), hw=hw))


@pytest.mark.parametrize("counts, order, dmas", [
    ((3, 3, 64, 128), (2, 3, 1, 0), 1),   # a conv's resident weights: 576 x 128, not 73728 cut at 65535
    ((73728,), (0,), 1),                  # one count past the field that factors: 2 x 36864
    ((65537,), (0,), 2),                  # a prime one: cut at 65535
])
def test_a_box_past_the_dma_count_field_takes_as_few_dmas_as_its_dims_allow(counts, order, dmas):
    """A LOAD's counts are 16-bit: a longer box is cut into DMAs of counts within the field; those
    cuts are reads across several producers for the plan, so none where the box's dims allow."""
    from stagec.isa import Space
    from stagec.isa.access import element_offsets as offsets
    from stagec.lower.codegen.emitter import Emitter
    from stagec.lower.schedule.tensors import DramRegion, DramTensor
    em = Emitter(stagec.HardwareConfig())
    shape = tuple(counts[order.index(d)] for d in range(len(counts)))
    em.load_box(DramTensor.dense(DramRegion.CONST, 0, shape, order), (0,) * len(counts), order, counts, Space.SPAD, 0)
    assert len(em.instructions) == dmas
    pairs = np.concatenate([np.stack([(ins.x.base + 4 * offsets(ins.x.strides, ins.n[:3])),
                                      (ins.y.base + 4 * offsets(ins.y.strides, ins.n[:3]))], 1)
                            for ins in em.instructions])
    np.testing.assert_array_equal(np.sort(pairs, 0), np.stack([4 * np.arange(np.prod(counts))] * 2, 1))
    assert (pairs[:, 0] == pairs[:, 1]).all()   # each element lands where the dense box has it
