"""Integer activations: clamps as REQUANT's saturation bounds, other functions as LUT tables (int8 to int8).

The simulator against the independent integer reference bit for bit, against fp32 PyTorch by
cosine, and each table against its float function at all 256 inputs."""

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_int8 import compile_both, cosine
from test_isa_ops import program
from torch import nn

import stagec
from stagec import int8_reference
from stagec.errors import LoweringError, QuantizationError, VerificationError
from stagec.isa import (
    DType,
    HardwareConfig,
    Operand,
    Space,
    TensorRef,
    VectorFunc,
    assemble,
    disassemble,
    store,
    vector,
    verify,
)
from stagec.isa import load as load_ins
from stagec.isa.semantics import record_fields, requantize, saturation_bounds
from stagec.lower.graph.activations import clamp_bounds
from stagec.lower.graph.evaluate import evaluate
from stagec.lower.graph.graph_ir import Graph, Node, OpKind, Step, Value
from stagec.lower.graph.requant import bounds_word, control_word, records
from stagec.pipeline import PIPELINE, Compilation, Request, lower_graph, position, run
from stagec.sim.executor import execute
from stagec.sim.fixed_point import requantize as batched_requantize
from stagec.sim.reference import execute as reference

ACTIVATIONS = {
    "relu6": (nn.ReLU6, lambda x: x.clamp(0, 6)),
    "hardtanh": (lambda: nn.Hardtanh(-0.5, 1.5), lambda x: x.clamp(-0.5, 1.5)),
    "clamp_min": (lambda: _Lambda(lambda x: x.clamp(min=-0.25)), lambda x: x.clamp(min=-0.25)),
    "hardswish": (nn.Hardswish, lambda x: x * (x + 3).clamp(0, 6) / 6),
    "hardsigmoid": (nn.Hardsigmoid, lambda x: (x + 3).clamp(0, 6) / 6),
    "sigmoid": (nn.Sigmoid, torch.sigmoid),
    "silu": (nn.SiLU, lambda x: x * torch.sigmoid(x)),
    "tanh": (nn.Tanh, torch.tanh),
    "gelu": (nn.GELU, lambda x: x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))),
    "gelu_tanh": (lambda: nn.GELU("tanh"), lambda x: 0.5 * x * (1 + torch.tanh(
        math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
}
CLAMPS = ("relu6", "hardtanh", "clamp_min")


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _net(name: str) -> nn.Module:
    """conv + act (an epilogue), max pool, act (a lone elementwise of an int8 value), linear + act."""
    make = ACTIVATIONS[name][0]
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), make(), nn.MaxPool2d(2), make(), nn.Flatten(), nn.Linear(72, 10),
                         make()).eval()


def _inputs():
    """(x, calibration batches, x among them: the cosines measure rounding, not ranges clipped)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, 8, 8, generator=g)
    return x, [(x,), *((torch.randn(1, 3, 8, 8, generator=g),) for _ in range(3))]


# --- the integer ops ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_nets_match_the_integer_reference_and_pytorch(name):
    model, (x, calibration) = _net(name), _inputs()
    program, graph = compile_both(model, (x,), calibration)
    steps = [s.func for n in graph.nodes for s in n.attr("epilogue") or n.attr("expr") or ()]
    integer = [n for n in graph.nodes if n.output.dtype == "int8" and "float32" not in {v.dtype for v in n.inputs}]
    assert len(integer) == 4   # conv (its table fused), pool, the lone table, reshape; the linear dequantizes
    # the activations run as requant bounds or tables: an int32 bias add, requant and lut, nothing in float
    assert {s.func for n in integer for s in n.attr("epilogue") or n.attr("expr") or ()} <= {"add", "requant", "lut"}
    assert steps.count("lut") == (1 if name in CLAMPS else 3)   # a clamp's epilogues fold it; each lone one a table
    y, _ = stagec.simulate(program, x)
    (ref,) = int8_reference.run(graph, [x.numpy()])
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(evaluate(graph, x.numpy())[0], ref)   # the graph IR's own reference agrees
    assert cosine(y, model(x).detach().numpy()) > 0.995


@pytest.mark.parametrize("name", CLAMPS)
def test_a_fused_clamp_is_the_requantization_bounds(name):
    model, (x, calibration) = _net(name), _inputs()
    _, graph = build_quantized(model, x, calibration)
    conv = next(n for n in graph.nodes if n.op == OpKind.CONV)
    assert [s.func for s in conv.attr("epilogue")] == ["requant"]   # the bias is the records' third word
    record = graph.constants[conv.inputs[-1].id]
    assert np.any(record[..., 2] != 0) and not np.any(record[..., 3])
    s_y = graph.scales[conv.output.id]
    lo, hi = _CLAMP_RANGE[name]
    expect = tuple(int(np.clip(np.round(b / s_y), -128, 127)) if math.isfinite(b) else d
                   for b, d in ((lo, -128), (hi, 127)))
    assert {tuple(int(v) for v in saturation_bounds(w)) for w in record[..., 1].reshape(-1)} == {expect}


_CLAMP_RANGE = {"relu6": (0, 6), "hardtanh": (-0.5, 1.5), "clamp_min": (-0.25, math.inf)}


class _Quantized:
    """The quantized graph before fuse_quantized: lone luts are ELEMENTWISE nodes, with their scales."""

    def __init__(self, c: Compilation):
        self.nodes, self.constants = c.graph.nodes, c.graph.constants
        self.scales = dict(c.quantization.scales)


def build_quantized(model, x, calibration) -> tuple[Compilation, _Quantized]:
    c = run(PIPELINE[:position("fuse_quantized")], Compilation(Request(model, (x,), quantize="int8",
                                                                       calibration=calibration)))
    return c, _Quantized(c)


def _round(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)   # ties away from zero, as QUANTIZE rounds


@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if n not in CLAMPS])
def test_tables_are_the_float_function_at_all_256_inputs(name):
    _, graph = build_quantized(_net(name), *_inputs())
    # the one after the max pool: an epilogue's may have absorbed constants (hardsigmoid's + 3 is in the bias)
    pooled = {n.output.id for n in graph.nodes if n.op == OpKind.POOL}
    luts = [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.attr("expr") == (Step("lut", (0, 1)),)
            and n.inputs[0].id in pooled]
    assert len(luts) == 1
    f = ACTIVATIONS[name][1]
    q = np.arange(-128, 128)
    for n in luts:
        table = graph.constants[n.inputs[1].id]
        assert table.dtype == np.int8 and table.shape == (256,)
        s_in, s_out = graph.scales[n.inputs[0].id], graph.scales[n.output.id]
        exact = f(torch.tensor(q * s_in, dtype=torch.float64)).numpy()
        ideal = exact / s_out
        tie = np.abs(np.abs(ideal - np.floor(ideal)) - 0.5) < 1e-4   # fp32 f may round a near-tie either way
        assert tie.mean() < 0.05
        expect = np.clip(_round(ideal), -128, 127)
        np.testing.assert_array_equal(table[~tie], expect[~tie])
        assert np.abs(table[tie] - expect[tie]).max(initial=0) <= 1
        inside = np.abs(ideal) <= 127.5   # unsaturated entries hold f within half an int8 step
        assert (np.abs(table * s_out - exact)[inside] <= s_out * (0.5 + 1e-4)).all()
        assert (table[ideal > 127.5] == 127).all() and (table[ideal < -128.5] == -128).all()


def test_a_lone_clamp_keeps_its_input_scale():
    _, graph = build_quantized(_net("relu6"), *_inputs())
    (lut,) = [n for n in graph.nodes if n.op == OpKind.ELEMENTWISE and n.attr("expr") == (Step("lut", (0, 1)),)]
    s = graph.scales[lut.inputs[0].id]
    assert graph.scales[lut.output.id] == s
    q = np.arange(-128, 128)
    np.testing.assert_array_equal(graph.constants[lut.inputs[1].id], np.clip(q, 0, min(127, round(6 / s))))


@pytest.mark.parametrize("name", ["relu6", "hardswish"])
def test_int8_activation_layers_have_no_fp32_vector_instruction(name):
    make = ACTIVATIONS[name][0]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), make(), nn.Conv2d(8, 8, 3, padding=1), make(),
                          nn.Conv2d(8, 4, 1)).eval()
    x, calibration = _inputs()
    program = stagec.compile(model, (x,), quantize="int8", calibration=calibration)
    is_vector = program.code["opcode"] == 3   # Opcode.VECTOR
    layers = [layer.name for layer in program.layers]
    assert len(layers) == 4   # the input's QUANTIZE, the three convs (the last one dequantizes its output)
    for k, layer in enumerate(layers[1:3], 1):
        rows = is_vector & (program.layer_ids == k)
        assert rows.any(), layer
        assert not ((program.code["dtype"][rows] == DType.F32) | (program.code["out_dtype"][rows] == DType.F32)).any()
    y, _ = stagec.simulate(program, x)
    assert cosine(y, model(x).detach().numpy()) > 0.995


@settings(max_examples=4, deadline=None)
@given(st.data())
def test_random_activation_nets_match_integer_reference(data):
    names = st.sampled_from(list(ACTIVATIONS))
    c, size = data.draw(st.integers(1, 4)), data.draw(st.integers(5, 8))
    hw, layers = size, []
    for _ in range(data.draw(st.integers(1, 2))):
        out = data.draw(st.integers(2, 8))
        layers.append(nn.Conv2d(c, out, 3, 1, data.draw(st.integers(0, 1)), bias=data.draw(st.booleans())))
        hw, c = hw + 2 * layers[-1].padding[0] - 2, out
        if data.draw(st.booleans()):
            layers.append(ACTIVATIONS[data.draw(names)][0]())
        if hw >= 4 and data.draw(st.booleans()):
            layers += [nn.MaxPool2d(2), ACTIVATIONS[data.draw(names)][0]()]
            hw //= 2
    hidden = data.draw(st.integers(4, 12))
    layers += [nn.Flatten(), nn.Linear(c * hw * hw, hidden), ACTIVATIONS[data.draw(names)][0](),
               nn.Linear(hidden, data.draw(st.integers(1, 6)))]
    model = nn.Sequential(*layers).eval()
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    x = torch.randn(1, layers[0].in_channels, size, size, generator=g)
    calibration = [(torch.randn(x.shape, generator=g),) for _ in range(4)]
    try:
        program, graph = compile_both(model, (x,), calibration)
    except QuantizationError as e:   # an activation constant on every calibration batch: its scale is 0
        assume("calibrated range 0.0" not in str(e))
        raise
    y, _ = stagec.simulate(program, x)
    (ref,) = int8_reference.run(graph, [x.numpy()])
    np.testing.assert_array_equal(y, ref)


# --- REQUANT's saturation bounds --------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=16), st.integers(2**30, 2**31 - 1),
       st.integers(-31, 4), st.integers(-20, 20), st.integers(-128, 127), st.integers(-128, 127))
def test_requant_bounds_agree_everywhere(xs, multiplier, shift, zero_point, a, b):
    lo, hi = min(a, b), max(a, b)
    x = np.array(xs, np.int64)
    rec = np.array([multiplier, control_word(shift, zero_point, (lo, hi)), 0, 0], np.int32)
    got = int8_reference.requantize(x, rec)
    whole = int8_reference.requantize(x, np.array([multiplier, control_word(shift, zero_point), 0, 0], np.int32))
    np.testing.assert_array_equal(got, np.clip(whole, lo, hi))   # the bounds clamp the int8 result, nothing else
    fields = [np.full(x.shape, v) for v in record_fields(rec)[:5]]   # the left shift is no argument
    np.testing.assert_array_equal(requantize(x, *fields), got)
    # padded to the longest list (its last element repeated), so that the jitted function compiles once
    padded = [np.pad(a, (0, 16 - a.size), mode="edge") for a in (x.astype(np.int32), *fields)]
    np.testing.assert_array_equal(np.asarray(batched_requantize(*padded))[:x.size], got)


def test_a_zero_bounds_word_is_the_whole_int8_range_and_records_encode_bounds():
    assert tuple(map(int, saturation_bounds(0))) == (-128, 127)
    rec = records(np.array([0.5, 0.25]), bounds=(0, 100))
    assert [tuple(map(int, saturation_bounds(w))) for w in rec[:, 1]] == [(0, 100)] * 2
    with pytest.raises(QuantizationError, match="not an int8 range"):
        bounds_word(5, 4)


@pytest.mark.parametrize("expr, expect", [
    ((Step("relu", (0,)), Step("min", (1, 3))), (0.0, 6.0)),                    # ReLU6
    ((Step("max", (0, 1)), Step("min", (3, 2))), (-1.0, 2.0)),                  # hardtanh
    ((Step("min", (2, 0)), Step("max", (1, 3))), (-1.0, 2.0)),                  # the other order
    ((Step("max", (0, 2)),), (2.0, math.inf)),                                  # one-sided
    ((Step("max", (0, 2)), Step("min", (3, 1))), None),                         # lo > hi: a constant
    ((Step("relu", (0,)), Step("mul", (3, 1))), None),                          # not a clamp
    ((Step("max", (0, 0)),), None),                                             # no constant
])
def test_clamp_bounds(expr, expect):
    consts = {1: -1.0, 2: 2.0}   # inputs: 0 the value, 1 and 2 scalars (relu6's 6 is input 1 there)
    scalar_of = (lambda a: {1: 6.0}.get(a)) if expr[0].func == "relu" else consts.get
    assert clamp_bounds(expr, 0, 3, scalar_of) == expect


# --- the LUT vector function ------------------------------------------------------------------

TILE, S = (1, 8, 8), (0, 8, 1)


def _lut_program(table_base=256, table_load=256, z_strides=(0, 0, 0), dtype=DType.I8):
    table = np.random.default_rng(0).integers(-128, 128, 256).astype(np.int8)
    ins = [
        load_ins(Operand(Space.DRAM, 512, S), Operand(Space.SPAD, 0, S), TILE, dtype=DType.I8),
        load_ins(Operand(Space.DRAM, 0, (0, 0, 1)), Operand(Space.SPAD, table_base, (0, 0, 1)), (1, 1, table_load),
                 dtype=DType.I8),
        vector(VectorFunc.LUT, Operand(Space.SPAD, 128, S), Operand(Space.SPAD, 0, S),
               Operand(Space.SPAD, table_base, z_strides), TILE, dtype=dtype, out_dtype=DType.I8),
        store(Operand(Space.DRAM, 1024, S), Operand(Space.SPAD, 128, S), TILE, dtype=DType.I8),
    ]
    return program(ins, [TensorRef("x", 512, DType.I8, (8, 8))], [TensorRef("y", 1024, DType.I8, (8, 8))],
                   table.tobytes()), table


def test_lut_is_a_table_lookup_in_both_simulators_and_round_trips_assembly():
    p, table = _lut_program()
    assert "vector.lut    i8>i8 n=1,8,8" in disassemble(p)
    assert assemble(disassemble(p)) == p
    x = np.random.default_rng(1).integers(-128, 128, (8, 8)).astype(np.int8)
    x[0, :2] = (-128, 127)
    expect = table[x.astype(np.int64) + 128]
    np.testing.assert_array_equal(reference(p, [x])[0], expect)
    np.testing.assert_array_equal(execute(p, [x])[0], expect)


def test_the_verifier_holds_a_lut_table_to_256_int8_bytes():
    end = 262144   # the default scratchpad
    with pytest.raises(VerificationError, match="reads scratchpad bytes"):
        verify(_lut_program(table_base=end - 128, table_load=128)[0])   # the table runs past the scratchpad
    with pytest.raises(VerificationError, match="which nothing wrote"):
        verify(_lut_program(table_load=128)[0])   # only 128 entries were loaded
    with pytest.raises(VerificationError, match="strides must be 0"):
        verify(_lut_program(z_strides=(0, 0, 1))[0])
    with pytest.raises(VerificationError, match="lut I32->I8 is not supported"):
        verify(_lut_program(dtype=DType.I32)[0])


def test_a_lut_table_that_is_not_256_int8_entries_is_rejected():
    x, y = Value(0, (4,), "int8"), Value(2, (4,), "int8")
    for table in (np.zeros(128, np.int8), np.zeros(256, np.int32)):
        t = Value(1, table.shape, str(table.dtype))
        graph = Graph((x,), (y,), (Node(OpKind.ELEMENTWISE, (x, t), y, (("expr", (Step("lut", (0, 1)),)),), "act"),),
                      {1: table})
        with pytest.raises(LoweringError, match=r"act: a lut table must be int8\[256\]"):
            lower_graph(graph, HardwareConfig())
        with pytest.raises(ValueError, match="256 int8 entries"):
            int8_reference.run(graph, [np.zeros(4, np.int8)])
