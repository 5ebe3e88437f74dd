"""One test per verifier rule, each on a hand-broken copy of a valid program."""

import dataclasses
import re

import numpy as np
import pytest
from programs import mutate, relu_matmul, row_max, with_code

import stagec
from stagec.isa import HardwareConfig, Queue, VerificationError, verify
from stagec.sim.reference import execute


def broken(p, match, index=None, field=None):
    with pytest.raises(VerificationError, match=match) as e:
        verify(p)
    if index is not None:
        assert e.value.index == index
    if field is not None:
        assert e.value.field == field
    with pytest.raises(VerificationError):   # and it never runs
        stagec.simulate(p, np.zeros((8, 4), np.float32))


def test_valid_program_passes_and_runs():
    p, b, a = relu_matmul()
    verify(p)
    (c,), _ = stagec.simulate(p, a)
    np.testing.assert_allclose(c, np.maximum(a @ b, 0), rtol=1e-6)
    np.testing.assert_allclose(execute(p, [a])[0], c, rtol=1e-6)


def test_a_reductions_destination_may_step_only_over_a_single_element():
    """Its stride over the reduced dim moves the destination nowhere where that dim is one element (an
    int8 attention's last key block of one key: fuzz case 77038, rejected before); over more it is refused."""
    a = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    for width, stride in ((1, 1), (4, 0)):
        (c,), _ = stagec.simulate(row_max(width, stride), a)
        np.testing.assert_array_equal(c, a[:, :width].max(axis=1))
        np.testing.assert_array_equal(execute(row_max(width, stride), [a])[0], c)
    with pytest.raises(VerificationError, match="reduction's destination stride over the reduced dim") as e:
        row_max(4, 1)
    assert (e.value.index, e.value.field) == (1, "x_strides")


def test_dram_address_out_of_bounds():
    p, _, _ = relu_matmul()
    broken(mutate(p, 4, x_base=480), r"writes DRAM bytes \[0x1e0, 0x280\) outside \[0, 0x200\)", 4, "x")


def test_scratchpad_address_out_of_bounds():
    p, _, _ = relu_matmul()
    broken(mutate(p, 1, y_base=256 * 1024 - 16), r"scratchpad bytes .* outside \[0, 0x40000\)", 1, "y")


def test_tile_that_does_not_fit_the_memory():
    p, _, _ = relu_matmul(hw=HardwareConfig(accumulator_bytes=128, accumulator_banks=1), tokens=False)
    broken(p, r"tile of 160 bytes does not fit the accumulator \(128 bytes\)", 2, "z")


def test_misaligned_address():
    p, _, _ = relu_matmul()
    broken(mutate(p, 0, y_base=2), "not aligned to 4 bytes \\(4-byte elements\\)", 0, "y_base")


def test_pop_without_push():
    p, _, _ = relu_matmul()
    broken(mutate(p, 4, pop=p.code["pop"][4] | 1 << Queue.LOAD), "no earlier instruction pushed", 4, "pop")


def test_push_never_popped():
    p, _, _ = relu_matmul()
    broken(mutate(p, 0, push=1 << Queue.STORE), r"never popped \(tokens unbalanced\)", 0, "push")


def test_missing_token_is_a_race():
    p, _, _ = relu_matmul()
    code = p.code.copy()
    code["push"][3], code["pop"][4] = 0, 0   # the store no longer waits for relu
    broken(with_code(p, code), r"instruction 4: conflicts with instruction 3 \(VECTOR queue\).*race", 4)


def test_read_of_memory_nothing_wrote():
    p, _, _ = relu_matmul()
    broken(mutate(p, 2, x_base=4096), r"reads scratchpad byte 0x1000, which nothing wrote", 2, "x")
    # an output region is not initialized either
    broken(mutate(p, 0, x_base=256), r"reads DRAM byte 0x100, which nothing wrote", 0, "x")


def test_write_to_constant_region():
    p, _, _ = relu_matmul()
    broken(mutate(p, 4, x_base=0, n=[1, 2, 5, 0]), "writes the constant region", 4, "x")


def test_unused_bits_must_be_zero():
    p, _, _ = relu_matmul()
    broken(mutate(p, 3, z_base=12), "byte 48 is unused by VECTOR and must be zero", 3, "z_base")


def test_token_to_own_queue():
    p, _, _ = relu_matmul()
    broken(mutate(p, 0, push=1 << Queue.LOAD), "its own queue", 0, "push")


def test_unknown_opcode_and_function():
    p, _, _ = relu_matmul()
    broken(mutate(p, 1, opcode=9), "unknown opcode 9", 1, "opcode")
    broken(mutate(p, 3, func=99), "unknown vector function 99", 3, "func")


def test_mode_the_hardware_lacks():
    p, _, _ = relu_matmul()
    q = dataclasses.replace(p, hw=HardwareConfig(dtypes=("int8",)), cache={})
    broken(q, "F32 needs the 'fp32' mode", 0, "dtype")


def test_layout_errors():
    p, _, _ = relu_matmul()
    broken(dataclasses.replace(p, constants=p.constants[:-4], cache={}), "constant region holds 80 bytes")
    broken(dataclasses.replace(p, dram_bytes=2**17, hw=HardwareConfig(dram_bytes=2**16), cache={}),
           "program needs 131072 bytes of DRAM, hardware has 65536")


def test_loaded_programs_are_verified(tmp_path):
    p, _, _ = relu_matmul()
    bad = mutate(p, 4, x_base=480)
    path = tmp_path / "bad.stgc"
    bad.save(path)
    with pytest.raises(VerificationError, match="instruction 4"):
        stagec.load(path)


def test_compiled_programs_carry_sufficient_tokens():
    import torch
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))
    p = stagec.compile(model, (torch.randn(2, 4, 12, 12),))
    verify(with_code(p, p.code))   # a fresh verification, not the compile walk's cached facts
    # dropping any one token breaks it: every token the compiler inserts is needed
    pushes = np.flatnonzero(p.code["push"])
    for i in pushes[:: max(1, len(pushes) // 8)]:
        code = p.code.copy()
        q = int(np.flatnonzero(np.unpackbits(np.uint8(code["push"][i]))[::-1])[0])
        code["push"][i] &= ~np.uint8(1 << q)
        with pytest.raises(VerificationError):
            verify(with_code(p, code))


def test_space_bits_of_operands_an_instruction_lacks_must_be_zero():
    p, _, _ = relu_matmul()
    load_spaces, matmul_spaces = int(p.code["spaces"][0]), int(p.code["spaces"][2])
    broken(mutate(p, 0, spaces=load_spaces | 1 << 4), "the space bits of an operand", 0, "spaces")   # LOAD has no z
    broken(mutate(p, 2, spaces=matmul_spaces | 1 << 6), "the space bits of an operand", 2, "spaces")


@pytest.mark.parametrize("n, strides", [((3, 8, 4), (0, 4, 1)),     # the same row three times
                                        ((1, 8, 4), (0, 2, 1))])    # rows that overlap
def test_a_written_pattern_visits_each_element_once(n, strides):
    p, _, _ = relu_matmul()
    broken(mutate(p, 0, n=(*n, 0), y_strides=strides),
           re.escape(f"the written pattern (n={list(n)}, strides={list(strides)}) visits some element more than once"),
           0, "y")


def test_the_walk_tracks_the_dram_the_program_touches_not_all_it_declares():
    import tracemalloc
    p, _, _ = relu_matmul()
    roomy = dataclasses.replace(p, dram_bytes=2**26, cache={})
    tracemalloc.start()
    try:
        verify(roomy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**22     # the 64 MiB it declares would take 5 int32 per 4-byte granule: 320 MiB


def test_the_walk_views_a_broadcast_read_once():
    from stagec.isa.access import accesses
    from stagec.isa.verify import DataflowWalk
    p, _, _ = relu_matmul()
    q = mutate(p, 3, y_strides=(0, 0, 0))     # relu of one accumulator element, broadcast over the tile
    accs = accesses(q.code)
    walk = DataflowWalk(q, accs)
    src = next(k for k, a in enumerate(accs) if a.operand == "y" and not a.write and a.valid[3])
    assert walk.geometry[src][0][3].tolist() == [1, 1, 1, 1]


def test_an_output_the_program_never_stores_is_refused():
    p, _, _ = relu_matmul()
    half = mutate(p, 4, n=(1, 4, 5, 0))      # stores the first 4 of c's 8 rows
    broken(half, r"output 'c' byte 0x\w+ is never written by the program")
    moved = dataclasses.replace(p, outputs=(dataclasses.replace(p.outputs[0], offset=p.outputs[0].offset + 64),),
                                dram_bytes=1024, cache={})
    broken(moved, "output 'c' byte .* is never written")


def test_simulators_hold_the_dram_the_program_touches_not_all_it_declares():
    import tracemalloc

    from stagec.sim.executor import execute as batched
    p, b, a = relu_matmul()
    roomy = dataclasses.replace(p, dram_bytes=2**30, cache={})
    tracemalloc.start()
    try:
        for run in (execute, batched):
            np.testing.assert_allclose(run(roomy, [a])[0], np.maximum(a @ b, 0), rtol=1e-6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**24     # the GiB it declares would be allocated (and its trackers 8x that) otherwise
