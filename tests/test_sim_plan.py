"""The batched executor's plan: programs whose dataflow is irregular still run batched."""

import numpy as np
import pytest
import torch
from helpers import rel_err
from torch import nn

import stagec


class ConcatThenPointwise(nn.Module):
    """Segformer's decode head in small: a 1x1 conv over a concat of tensors made at different depths,
    so the conv's accumulate chain over channel tiles loads each tile from another producer."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 16, 3, padding=1)
        self.second = nn.Conv2d(16, 16, 3, padding=1)
        self.fuse = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        a = self.first(x)
        b = torch.relu(self.second(a))
        return self.fuse(torch.cat([a, b], dim=1))


def test_pointwise_conv_over_concat_of_two_producers():
    torch.manual_seed(0)
    model, x = ConcatThenPointwise().eval(), torch.randn(1, 3, 6, 6)
    # a scratchpad so small that the fuse conv reduces over several channel tiles
    hw = stagec.HardwareConfig(array_rows=4, array_cols=4, scratchpad_bytes=2048, accumulator_bytes=1024,
                               vector_lanes=4)
    program = stagec.compile(model, (x,), hw=hw)
    out, _ = stagec.simulate(program, x)
    assert program.cache["executor"] is not None
    with torch.no_grad():
        assert rel_err(out, model(x).numpy()) < 1e-4


class WideRows(nn.Module):
    """Attention over 96 positions: score tiles stored as rows of contiguous elements (one windowed
    scatter), read back as strided boxes of the producer's values and broadcast row maxima."""

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_box_reads_and_row_scatter_stores_match_the_reference_interpreter():
    from stagec.sim import reference
    from stagec.sim.executor import Executor
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    program = stagec.compile(WideRows().eval(), (q, k, v))
    inputs = [t.numpy() for t in (q, k, v)]
    got = Executor(program).run(inputs)[0]
    want = reference.execute(program, inputs)[0]
    assert rel_err(got, want) < 1e-6
    with torch.no_grad():
        assert rel_err(got, WideRows()(q, k, v).numpy()) < 1e-4


def _program(ins, inputs, outputs):
    """A one-layer program of hand-written instructions (tokens inserted) over float32 DRAM vectors
    ((name, byte offset, length) each)."""
    from stagec.isa import DType, Layer, Program, TensorRef
    from stagec.isa.instructions import encode
    from stagec.lower.codegen.tokens import insert_tokens
    refs = [tuple(TensorRef(name, off, DType.F32, (n,)) for name, off, n in ts) for ts in (inputs, outputs)]
    return insert_tokens(Program(code=encode(ins), layer_ids=np.zeros(len(ins), np.int32),
                                 layers=(Layer("t", "test", (), ()),), inputs=refs[0], outputs=refs[1], regions=(),
                                 constants=b"", dram_bytes=4096, hw=stagec.HardwareConfig()))


def test_tiles_cutting_dram_rows_are_stored_as_their_own_runs():
    """-x of a 4 x 64 matrix in tiles of 2 rows x 16 columns (whisper's softmax tiles in small): each
    tile's rows are 16-element runs in DRAM; the store group writes them in the values' own order
    (no transpose to DRAM order), and every element lands where the reference interpreter puts it."""
    from stagec.isa import Operand, Space, VectorFunc, store, vector
    from stagec.isa import load as load_ins
    from stagec.sim.executor import Executor
    from stagec.sim.reference import execute as reference
    rows, cols, th, tw, x_off, out_off = 4, 64, 2, 16, 1024, 2048
    dram, local, tile = (0, cols, 1), (0, tw, 1), (1, th, tw)
    ins = []
    for r in range(0, rows, th):
        for c in range(0, cols, tw):
            at = 4 * (r * cols + c)
            ins += [load_ins(Operand(Space.DRAM, x_off + at, dram), Operand(Space.SPAD, 0, local), tile),
                    vector(VectorFunc.NEG, Operand(Space.SPAD, 512, local), Operand(Space.SPAD, 0, local), None, tile),
                    store(Operand(Space.DRAM, out_off + at, dram), Operand(Space.SPAD, 512, local), tile)]
    program = _program(ins, [("x", x_off, rows * cols)], [("out", out_off, rows * cols)])
    x = np.linspace(-2, 2, rows * cols, dtype=np.float32)
    ex = Executor(program)
    assert [len(g.members) for g in ex.plan.groups if g.kind == "store"] == [rows // th * cols // tw]
    (got,) = ex.run([x])
    np.testing.assert_array_equal(got, reference(program, [x])[0])
    np.testing.assert_array_equal(got, -x)


def _load_store_hazard_program(n=16):
    """out = x + exp(y), where exp(y) is stored over x's bytes before the add reads its load of x."""
    from stagec.isa import Operand, Space, VectorFunc, store, vector
    from stagec.isa import load as load_ins
    x_off, y_off, out_off, s, tile, rows = 1024, 1536, 2048, (0, 0, 1), (1, 1, n), (0, n // 2, 1)
    ins = [
        load_ins(Operand(Space.DRAM, x_off, s), Operand(Space.SPAD, 0, s), tile),
        load_ins(Operand(Space.DRAM, y_off, rows), Operand(Space.SPAD, 256, rows), (1, 2, n // 2)),   # its own group
        vector(VectorFunc.EXP, Operand(Space.SPAD, 512, s), Operand(Space.SPAD, 256, s), None, tile),
        store(Operand(Space.DRAM, x_off, s), Operand(Space.SPAD, 512, s), tile),
        vector(VectorFunc.ADD, Operand(Space.SPAD, 768, s), Operand(Space.SPAD, 0, s), Operand(Space.SPAD, 512, s),
               tile),
        store(Operand(Space.DRAM, out_off, s), Operand(Space.SPAD, 768, s), tile),
    ]
    return _program(ins, [("x", x_off, n), ("y", y_off, n)], [("out", out_off, n)])


def test_a_load_runs_inside_its_reader_only_where_no_store_overwrites_its_bytes_between():
    from stagec.sim.executor import Executor
    from stagec.sim.reference import execute as reference
    program = _load_store_hazard_program()
    x, y = np.linspace(-1, 1, 16, dtype=np.float32), np.linspace(0, 2, 16, dtype=np.float32)
    ex = Executor(program)
    inlined = {ex.plan.groups[g].instructions[0] for g in ex.inlined}
    assert inlined == {1}   # y's load runs inside exp; x's does not: the store between overwrites x's bytes
    (got,) = ex.run([x, y])
    np.testing.assert_allclose(got, x + np.exp(y), rtol=1e-6)
    np.testing.assert_allclose(got, reference(program, [x, y])[0], rtol=1e-6)


def test_attention_probabilities_are_loaded_inside_the_matmul_that_reads_them():
    from stagec.sim import reference
    from stagec.sim.executor import Executor
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 96, 16) for _ in range(3))
    program = stagec.compile(WideRows().eval(), (q, k, v))
    inputs = [t.numpy() for t in (q, k, v)]
    ex = Executor(program)
    kinds = {ex.plan.groups[g].kind for g in ex.inlined}
    readers = {g.kind for g in ex.plan.groups for r in g.reads.values() if r.src in ex.inlined}
    assert kinds == {"load"} and "matmul" in readers
    assert rel_err(ex.run(inputs)[0], reference.execute(program, inputs)[0]) < 1e-6


def test_vector_ops_one_compute_group_reads_run_inside_it():
    from stagec.sim import reference
    from stagec.sim.executor import Executor
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.LayerNorm(64), nn.GELU()).eval(), torch.randn(1, 96, 64)
    program = stagec.compile(model, (x,))
    ex = Executor(program)
    assert ex.deferred and all(ex.plan.groups[g].kind == "vector" for g in ex.deferred)
    assert len(ex.steps) + len(ex.inlined) + len(ex.deferred) == len(ex.plan.groups)   # each group runs once
    want = reference.execute(program, [x.numpy()])[0]
    for _ in range(2):   # a second run: the values the first one freed are made again
        assert rel_err(ex.run([x.numpy()])[0], want) < 1e-6
    with torch.no_grad():
        assert rel_err(want, model(x).numpy()) < 1e-4


def _spanning_read_program(pieces, n=16):
    """out = exp(local[0:n]), local memory LOADed in `pieces` ((DRAM element, local element, count), in
    program order; a later piece overwrites an earlier one), the EXP reading all of them at once."""
    from stagec.isa import Operand, Space, VectorFunc, store, vector
    from stagec.isa import load as load_ins
    x_off, out_off, s = 1024, 2048, (0, 0, 1)
    ins = [load_ins(Operand(Space.DRAM, x_off + 4 * d, s), Operand(Space.SPAD, 4 * loc, s), (1, 1, count))
           for d, loc, count in pieces]
    ins += [vector(VectorFunc.EXP, Operand(Space.SPAD, 512, s), Operand(Space.SPAD, 0, s), None, (1, 1, n)),
            store(Operand(Space.DRAM, out_off, s), Operand(Space.SPAD, 512, s), (1, 1, n))]
    return _program(ins, [("x", x_off, n)], [("out", out_off, n)])


def test_a_read_of_consecutive_rows_of_one_load_group_reads_them_in_place():
    """A stacked conv's MATMUL reads the rows its per-row LOADs wrote side by side: one value, no join."""
    from stagec.sim.executor import Executor
    from stagec.sim.plan import build_plan
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    program = _spanning_read_program([(4 * k, 4 * k, 4) for k in range(4)])
    plan = build_plan(program)
    (load,) = [g for g in plan.groups if g.kind == "load"]
    assert len(load.members) == 4 and not [g for g in plan.groups if g.kind == "join"]
    np.testing.assert_allclose(Executor(program).run([x])[0], np.exp(x), rtol=1e-6)


SPANS = {
    "rows in reverse order": [(4 * k, 4 * k, 4) for k in (3, 2, 1, 0)],
    "pieces of two shapes (a box its DMA split at the count limit)": [(0, 0, 10), (10, 10, 6)],
    "a later piece over part of an earlier one": [(4, 0, 12), (8, 8, 8)],
    "pieces of two shapes, some rows of one group": [(0, 0, 3), (3, 3, 3), (6, 6, 10)],
}


@pytest.mark.parametrize("pieces", SPANS.values(), ids=SPANS.keys())
def test_a_read_spanning_other_producers_reads_their_join(pieces):
    """Any read spanning several producers runs batched: it reads their values laid out as local
    memory holds them (program order: a later LOAD's elements over an earlier one's)."""
    from stagec.sim.executor import Executor
    from stagec.sim.plan import build_plan
    from stagec.sim.reference import execute as reference
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    local = np.zeros(16, np.float32)
    for d, loc, count in pieces:
        local[loc:loc + count] = x[d:d + count]
    program = _spanning_read_program(pieces)
    assert [g.kind for g in build_plan(program).groups].count("join") == 1
    (got,) = Executor(program).run([x])
    np.testing.assert_allclose(got, np.exp(local), rtol=1e-6)
    np.testing.assert_allclose(got, reference(program, [x])[0], rtol=1e-6)


def test_a_program_outside_the_batched_model_runs_on_the_reference_interpreter_with_a_warning():
    """Library users still get results from a program the plan refuses (a LOAD writing every other
    element: a non-contiguous value), with a ReferenceFallbackWarning; the suite makes that warning
    an error everywhere else."""
    from stagec.errors import ReferenceFallbackWarning
    from stagec.isa import Operand, Space, VectorFunc, store, vector
    from stagec.isa import load as load_ins
    n, s, every_other = 8, (0, 0, 1), (0, 0, 2)
    ins = [load_ins(Operand(Space.DRAM, 1024, s), Operand(Space.SPAD, 0, every_other), (1, 1, n)),
           vector(VectorFunc.EXP, Operand(Space.SPAD, 512, s), Operand(Space.SPAD, 0, every_other), None, (1, 1, n)),
           store(Operand(Space.DRAM, 2048, s), Operand(Space.SPAD, 512, s), (1, 1, n))]
    program = _program(ins, [("x", 1024, n)], [("out", 2048, n)])
    x = np.linspace(-1, 1, n, dtype=np.float32)
    with pytest.warns(ReferenceFallbackWarning, match="non-contiguous"):
        (out,), _ = stagec.simulate(program, x)
    assert program.cache["executor"] is None
    np.testing.assert_allclose(out, np.exp(x), rtol=1e-6)


def test_a_chain_whose_operands_come_from_several_groups_reads_their_union():
    """C = a0 @ W0 + a1 @ W1, one accumulating chain whose W0 and W1 come from LOADs of two shapes
    (two groups of one level, as a weight box its DMA split unevenly): the chain reads them from one
    value laying out both groups."""
    from stagec.isa import Operand, Space, matmul, store
    from stagec.isa import load as load_ins
    from stagec.sim.executor import Executor
    from stagec.sim.plan import build_plan
    from stagec.sim.reference import execute as reference
    s = (0, 0, 1)
    w_pattern, a_pattern, c_pattern = (2, 1, 0), (0, 3, 1), (0, 2, 1)   # W [3][2], a [1][3], C [1][2]
    ins = [load_ins(Operand(Space.DRAM, 1024, s), Operand(Space.SPAD, 0, s), (1, 1, 6)),      # a0, a1
           load_ins(Operand(Space.DRAM, 1024 + 24, s), Operand(Space.SPAD, 64, s), (1, 1, 6)),  # W0
           load_ins(Operand(Space.DRAM, 1024 + 48, s), Operand(Space.SPAD, 128, s), (1, 1, 10)),  # W1 and 4 more
           matmul(Operand(Space.SPAD, 0, a_pattern), Operand(Space.SPAD, 64, w_pattern),
                  Operand(Space.ACC, 0, c_pattern), 1, 1, 3, 2, accumulate=False),
           matmul(Operand(Space.SPAD, 12, a_pattern), Operand(Space.SPAD, 128, w_pattern),
                  Operand(Space.ACC, 0, c_pattern), 1, 1, 3, 2, accumulate=True),
           store(Operand(Space.DRAM, 2048, s), Operand(Space.ACC, 0, s), (1, 1, 2))]
    program = _program(ins, [("x", 1024, 22)], [("out", 2048, 2)])
    plan = build_plan(program)
    (chain,) = [g for g in plan.groups if g.kind == "matmul"]
    assert chain.sig.chain == 2 and plan.groups[chain.reads["b"].src].kind == "join"
    x = np.linspace(-1, 1, 22, dtype=np.float32)
    want = x[0:3] @ x[6:12].reshape(3, 2) + x[3:6] @ x[12:18].reshape(3, 2)
    (got,) = Executor(program).run([x])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, reference(program, [x])[0], rtol=1e-6)
