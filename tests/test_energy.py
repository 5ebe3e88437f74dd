"""Energy and area: action counts against hand counts, the energy table, gradients."""

import jax
import pytest
from programs import relu_matmul
from timing_programs import roomy_hw, single_matmul

from stagec.sim.energy import action_counts, area_mm2, energy_pj, program_energy_pj
from stagec.sim.timing import program_cycles


def test_relu_matmul_counts_by_hand():
    # LOAD a [8,4] and b [4,5] (fp32) into the scratchpad; MATMUL 8x4x5 into the accumulator (one fold of
    # a 16x16 array); RELU in place on the accumulator; STORE c [8,5].
    program, _, _ = relu_matmul()
    counts = action_counts(program.code, program.hw).total()
    a, b, c = 8 * 4 * 4, 4 * 5 * 4, 8 * 5 * 4
    assert counts.macs_fp32 == 8 * 4 * 5 and counts.macs_int8 == counts.macs_bf16 == 0
    assert counts.vector_ops == 40
    assert counts.dram_read_bytes == a + b and counts.dram_write_bytes == c
    assert counts.scratchpad_write_bytes == a + b           # the two LOADs
    assert counts.scratchpad_read_bytes == a + b            # the MATMUL reads A and B once (one fold each way)
    assert counts.accumulator_write_bytes == c + c          # MATMUL result, RELU result
    assert counts.accumulator_read_bytes == c + c           # RELU source, STORE source


@pytest.mark.parametrize("dataflow", ["weight_stationary", "output_stationary"])
def test_folds_reread_operands(dataflow):
    # 40x48x40 on 16x16: 3 reduction folds, 3 column folds, 3 row folds.
    hw = roomy_hw(dataflow=dataflow)
    counts = action_counts(single_matmul(40, 48, 40, hw).code, hw).total()
    a, b, c = 40 * 48 * 4, 48 * 40 * 4, 40 * 40 * 4
    loads_in = a + b
    if dataflow == "weight_stationary":    # A streams once per column fold; partial sums once per reduction fold
        assert counts.scratchpad_read_bytes == 3 * a + b
        assert counts.accumulator_write_bytes == 3 * c and counts.accumulator_read_bytes == 2 * c + c   # + STORE
    else:                                  # A once per column fold, B once per row fold; outputs written once
        assert counts.scratchpad_read_bytes == 3 * a + 3 * b
        assert counts.accumulator_write_bytes == c and counts.accumulator_read_bytes == c   # the STORE
    assert counts.scratchpad_write_bytes == loads_in


def test_energy_is_counts_times_the_table_plus_leakage():
    program, _, _ = relu_matmul()
    hw = program.hw
    counts = action_counts(program.code, hw).total()
    parts = energy_pj(counts, 1000.0, hw)
    assert parts["mac"] == pytest.approx(160 * hw.energy_pj_per_mac_fp32)
    assert parts["vector"] == pytest.approx(40 * hw.energy_pj_per_vector_op)
    assert parts["scratchpad"] == pytest.approx((208 + 208) * hw.energy_pj_per_spad_byte)
    assert parts["accumulator"] == pytest.approx((320 + 320) * hw.energy_pj_per_acc_byte)
    assert parts["dram"] == pytest.approx((208 + 160) * hw.energy_pj_per_dram_byte)
    # P x t, in pJ: the accelerator's leakage and its DRAM interface's static power, per byte/cycle
    static_mw = hw.leakage_mw + hw.dram_phy_mw_per_byte_per_cycle * hw.dma_bandwidth_bytes_per_cycle
    assert parts["leakage"] == pytest.approx(static_mw * 1e-3 * 1000 / hw.clock_hz * 1e12)


def test_energy_gradient_matches_counts_and_finite_differences():
    hw = roomy_hw(dma_bandwidth_bytes_per_cycle=2.0, leakage_mw=50.0)
    program = single_matmul(64, 32, 48, hw)
    grad = jax.grad(program_energy_pj, argnums=1)(program, hw)
    counts = action_counts(program.code, hw).total()
    assert float(grad.energy_pj_per_dram_byte) == pytest.approx(counts.dram_read_bytes + counts.dram_write_bytes)
    assert float(grad.energy_pj_per_mac_fp32) == pytest.approx(counts.macs_fp32)
    cycles = float(program_cycles(program, hw))
    assert float(grad.leakage_mw) == pytest.approx(1e9 * cycles / hw.clock_hz, rel=1e-5)
    for name in ("dma_bandwidth_bytes_per_cycle", "clock_hz"):
        step = getattr(hw, name) * 1e-2
        fd = (float(program_energy_pj(program, hw.replace(**{name: getattr(hw, name) + step})))
              - float(program_energy_pj(program, hw.replace(**{name: getattr(hw, name) - step})))) / (2 * step)
        assert float(getattr(grad, name)) == pytest.approx(fd, rel=1e-2)


def test_area_from_the_table():
    hw = roomy_hw(array_rows=32, array_cols=8)
    area = area_mm2(hw)
    assert area["array"] == pytest.approx(256 * hw.area_mm2_per_pe)
    assert area["scratchpad"] == pytest.approx(4096 * hw.area_mm2_per_sram_kib)
    interface = hw.dma_bandwidth_bytes_per_cycle * hw.area_mm2_per_dram_byte_per_cycle
    assert area["dram_interface"] == pytest.approx(interface)
