"""Cycle timing: closed forms per dataflow and when bandwidth-bound, overlap, the reference, gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from programs import mutate, relu_matmul
from timing_programs import load_store_load, pipeline, roomy_hw, single_matmul

import stagec
from stagec.isa import verify
from stagec.sim.costs import dma_cycles, matmul_cycles
from stagec.sim.timing import TimingError, program_cycles, program_times, timeline
from stagec.sim.timing_reference import reference_times

AMPLE = {"dma_bandwidth_bytes_per_cycle": 1e6, "dma_latency_cycles": 0.0}

# SCALE-Sim 3.0.0 (scalesim-project), GEMM mode, 16x16 array, USER bandwidth 1000: COMPUTE_REPORT.csv
# "Total Cycles" per (M, N, K) layer.  SCALE-Sim reports the last cycle's index, one less than the count.
SCALESIM_16x16 = {
    "weight_stationary": {(200, 80, 96): 7379, (64, 64, 64): 1759, (100, 40, 300): 8321},
    "output_stationary": {(200, 80, 96): 8189, (64, 64, 64): 1503, (100, 40, 300): 6929},
}


@pytest.mark.parametrize("dataflow", ["weight_stationary", "output_stationary"])
def test_matmul_formula_matches_scalesim(dataflow):
    for (m, n, k), cycles in SCALESIM_16x16[dataflow].items():
        assert matmul_cycles(m, k, n, 16, 16, dataflow) == cycles + 1


@pytest.mark.parametrize("dataflow,expected", [("weight_stationary", 6 * 5 * (2 * 16 + 16 + 200 - 2)),
                                               ("output_stationary", 13 * 5 * (16 + 16 + 96 - 2))])
def test_single_layer_is_the_closed_form_when_dma_hides(dataflow, expected):
    program = single_matmul(200, 96, 80, roomy_hw(dataflow=dataflow, **AMPLE))
    verify(program)
    tl = timeline(program)
    assert tl.cycles == pytest.approx(expected, abs=1.0)          # DMA: 0.2 cycles in all
    assert tl.busy_cycles()[1] == pytest.approx(expected, rel=1e-6)


def test_a_dma_bound_program_takes_its_bytes_over_the_bandwidth():
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=0.5, dma_latency_cycles=0.0)
    program = single_matmul(64, 32, 48, hw)
    nbytes = 4 * (64 * 32 + 32 * 48 + 64 * 48)
    compute = matmul_cycles(64, 32, 48, 16, 16, hw.dataflow)
    assert timeline(program).cycles == pytest.approx(nbytes / 0.5 + compute)   # a chain: nothing overlaps


def test_loads_and_stores_share_the_dram_channel():
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=4.0, dma_latency_cycles=10.0)
    tl = timeline(load_store_load(100, 60, 40, hw))
    # LOAD x; then the independent LOAD y and the STORE both issue at its end and queue for the channel:
    # the STORE's latency hides under LOAD y's transfer, its transfer follows it.
    assert tl.cycles == pytest.approx(2 * 10 + (100 + 60 + 40))
    assert tl.grant[1] == pytest.approx(tl.end[2])        # the STORE got the channel when LOAD y let go


def test_double_buffering_overlaps_units():
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=64.0, dma_latency_cycles=20.0)
    program = pipeline(8, 64, 64, 64, hw)
    verify(program)
    tl = timeline(program)
    single = timeline(pipeline(8, 64, 64, 64, hw, buffers=1))
    serial = float(np.sum(tl.end - tl.start))
    assert tl.busy_cycles().max() <= tl.cycles < single.cycles < serial


def test_compiled_conv_overlaps_and_matches_the_reference():
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 24, 3, padding=1), torch.nn.ReLU()).eval()
    program = stagec.compile(model, (torch.randn(1, 8, 24, 24),), hw=stagec.HardwareConfig(array_rows=8,
                                                                                               array_cols=8))
    tl = timeline(program)
    start, grant, end = reference_times(program.code, program.hw)
    np.testing.assert_allclose(tl.end, end, rtol=1e-6)
    np.testing.assert_allclose(tl.grant, grant, rtol=1e-6)
    np.testing.assert_allclose(tl.start, start, rtol=1e-6)
    assert tl.busy_cycles().max() <= tl.cycles < np.sum(tl.end - tl.start)


def test_tokens_order_instructions():
    program, _, _ = relu_matmul(roomy_hw(dma_latency_cycles=7.0))
    tl = timeline(program)
    load_a, load_b, mm, relu, st = range(5)
    assert tl.start[mm] == tl.end[load_b]                 # waits for both loads (in order on one queue)
    assert tl.start[relu] == tl.end[mm] and tl.start[st] == tl.end[relu]
    assert tl.cycles == pytest.approx(tl.end[st])


def test_tokens_that_cannot_be_timed_are_errors():
    program, _, _ = relu_matmul()          # LOAD a, LOAD b, MATMUL, VECTOR, STORE
    unmatched = mutate(program, 4, pop=int(program.code["pop"][4]) | 1 << 1)
    with pytest.raises(TimingError, match="instruction 4 pops a token from the MATRIX queue that no instruction"):
        timeline(unmatched)
    late = mutate(mutate(program, 1, pop=1 << 1), 2, push=int(program.code["push"][2]) | 1 << 0)
    with pytest.raises(TimingError, match="instruction 1 waits for a token from the MATRIX queue that instruction 2"):
        timeline(late)


def test_dma_formula():
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=8.0, dma_latency_cycles=30.0)
    assert dma_cycles(800, hw) == 130.0
    assert float(dma_cycles(jnp.float32(800), hw, jnp)) == 130.0


def _central_difference(f, hw, name, rel=1e-2):
    """(f(x + h) - f(x - h)) / 2h; a step of 1% stays clear of float32 rounding of cycle counts."""
    value = getattr(hw, name)
    h = value * rel
    return (f(hw.replace(**{name: value + h})) - f(hw.replace(**{name: value - h}))) / (2 * h)


@pytest.mark.parametrize("bandwidth", [2.0, 40.0])       # DMA-bound, then compute-bound
def test_cycle_gradient_matches_finite_differences(bandwidth):
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=bandwidth, dma_latency_cycles=25.0)
    program = pipeline(6, 48, 64, 40, hw)
    grad = jax.grad(program_cycles, argnums=1)(program, hw)

    def cycles(h):
        return float(program_cycles(program, h))

    for name in ("dma_bandwidth_bytes_per_cycle", "dma_latency_cycles"):
        assert float(getattr(grad, name)) == pytest.approx(_central_difference(cycles, hw, name), rel=1e-2)
    assert float(grad.clock_hz) == 0.0 and float(grad.energy_pj_per_mac_fp32) == 0.0


def test_gradient_through_transcendental_vector_time():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Softmax(-1)).eval()     # exp
    program = stagec.compile(model, (torch.randn(4, 16),))
    grad = jax.grad(program_cycles, argnums=1)(program, program.hw)
    fd = _central_difference(lambda h: float(program_cycles(program, h)), program.hw,
                             "vector_cycles_per_transcendental")
    assert float(grad.vector_cycles_per_transcendental) == pytest.approx(fd, rel=1e-2)
    assert fd > 0


def test_vmap_over_configs_matches_one_at_a_time():
    hw = roomy_hw(dma_latency_cycles=25.0)
    program = pipeline(4, 32, 64, 32, hw)
    bandwidths = jnp.array([1.0, 4.0, 32.0])
    batched = jax.vmap(lambda bw: program_cycles(program, hw.replace(dma_bandwidth_bytes_per_cycle=bw)))(bandwidths)
    single = [float(program_cycles(program, hw.replace(dma_bandwidth_bytes_per_cycle=float(b)))) for b in bandwidths]
    np.testing.assert_allclose(np.asarray(batched), single, rtol=1e-6)


def test_times_are_jax_arrays_of_every_instruction():
    program = pipeline(3, 16, 16, 16, roomy_hw())
    start, grant, end = program_times(program)
    assert start.shape == grant.shape == end.shape == (len(program),)
    assert bool(jnp.all(start <= grant)) and bool(jnp.all(grant <= end))
