"""Integer attention: Q K^T and P V as int8 x int8 -> int32 at per-tensor scales (TFLite's int8
BatchMatMul), checked against the independent integer reference and PyTorch.

The simulator and `stagec.int8_reference` agree bit for bit on integer work; softmax (and a
LayerNorm) stay fp32 islands whose exp and sums may differ in the last bits, so an int8 value they
feed may round the other way where a float lies within a few ulps of a rounding tie.  Outputs are
compared as the fuzzer does: equal, except by what the reference itself moves when every quantized
float moves TIE_NUDGE away from zero and toward it.  The scores (Q K^T dequantized from the
accumulator, times constants) are integer work only, and are compared exactly.

Against fp32 PyTorch the outputs keep cosine >= 0.98: Q, K, V and P each carry int8 rounding
(a relative step of 1/127 of their range) and softmax turns a score's absolute error into a relative
error of its weight; these models measure 0.998-0.9999, random small shapes no lower than 0.99.
The scores are int8 by default (requantized in Q K^T's epilogue, one more rounding) and float with
int8_scores=False; both are checked."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils import _pytree as pytree

import stagec
from stagec import int8_reference, zoo
from stagec.frontend import flatten_inputs
from stagec.fuzz.campaign import TIE_NUDGE
from stagec.isa.semantics import NUMPY, widen
from stagec.lower.graph.activations import scalar_scale
from stagec.lower.graph.graph_ir import Graph, Node, OpKind, Step, Value
from stagec.pipeline import build_graph, lower_graph
from stagec.precision import calibration_batches

COSINE = 0.98


class SingleHead(nn.Module):
    """Attention written out: softmax(q k^T / sqrt(d)) v, then an output projection."""

    def __init__(self, d: int):
        super().__init__()
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        p = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.out(p @ v)


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def attention_matmuls(graph: Graph) -> list[Node]:
    return [n for n in graph.nodes if n.op == OpKind.MATMUL and n.inputs[1].id not in graph.constants]


def assert_matches_reference(graph: Graph, inputs, outputs, fp32_tolerance: float = 0.0) -> None:
    """`outputs` (the simulator's) equal the integer reference's, but for rounding ties (module doc) and,
    where an output is an fp32 island's, `fp32_tolerance` of its largest magnitude."""
    refs = int8_reference.run(graph, inputs)
    nudged = [int8_reference.run(graph, inputs, nudge=n) for n in (TIE_NUDGE, -TIE_NUDGE)]
    for k, (y, ref) in enumerate(zip(outputs, refs, strict=True)):
        spread = sum(np.abs(other[k].astype(np.float64) - ref) for other in nudged)
        excess = np.abs(np.asarray(y, np.float64) - ref) - spread - fp32_tolerance * np.abs(ref).max()
        assert excess.max() <= 0, f"output {k}: {int((excess > 0).sum())} elements beyond the rounding ties"


def check(model, args, calibration, int8_scores: bool | None = None) -> None:
    options = {"quantize": "int8", "calibration": calibration, "int8_scores": int8_scores}
    program = stagec.compile(model, args, **options)
    _, graph = build_graph(model, args, **options)
    attention = attention_matmuls(graph)
    assert len(attention) >= 2   # Q K^T, P V (a batched projection multiplies a broadcast weight)
    # no fp32 MATMUL left: Q K^T and P V multiply int8 by int8, like the projections
    assert all(v.dtype == "int8" for n in graph.nodes if n.op == OpKind.MATMUL for v in n.inputs[:2])
    y, _ = stagec.simulate(program, *args)
    inputs = [a.numpy() for a in args]
    assert_matches_reference(graph, inputs, [y])
    with torch.no_grad():
        expected = model(*args)
    assert cosine(y, expected.numpy()) >= COSINE
    scores_match_exactly(graph, inputs)


def scores_match_exactly(graph: Graph, inputs) -> None:
    """The program of `graph` with every Q K^T result (a product whose epilogue reads only constants:
    int8 scores, or float ones dequantized from the accumulator; P V's int8 result too) as an output
    too: the simulator's equal the reference's bit for bit."""
    scores = [n.output for n in attention_matmuls(graph) if all(v.id in graph.constants for v in n.inputs[2:])]
    assert scores
    extended = Graph(graph.inputs, graph.outputs + tuple(scores), graph.nodes, graph.constants)
    got, _ = stagec.simulate(lower_graph(extended, stagec.HardwareConfig()), *inputs)
    ref = int8_reference.run(extended, inputs)
    for y, r in zip(got[len(graph.outputs):], ref[len(graph.outputs):], strict=True):
        np.testing.assert_array_equal(widen(NUMPY, np.asarray(y)), r)   # bf16 islands' scores come back as bits


def _calibration(shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=g),) for _ in range(3)]


@pytest.mark.parametrize("int8_scores", [None, False])
def test_single_head_attention_multiplies_int8_by_int8(int8_scores):
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16)
    check(SingleHead(16).eval(), (x,), _calibration(x.shape), int8_scores)


def test_multihead_attention_multiplies_int8_by_int8():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    check(SelfAttention(16, 2).eval(), (x,), _calibration(x.shape))


def test_reduced_bert_layer_runs_int8_attention():
    model, args, kwargs = zoo.build("bert_base", reduced=True)
    calibration = calibration_batches(args, kwargs, 3)
    program = stagec.compile(model, args, kwargs=kwargs, quantize="int8", calibration=calibration)
    traced, graph = build_graph(model, args, kwargs=kwargs, quantize="int8", calibration=calibration)
    attention = attention_matmuls(graph)
    assert len(attention) >= 2 and all(v.dtype == "int8" for n in attention for v in n.inputs[:2])
    out, _ = stagec.simulate(program, *args, **kwargs)
    inputs = flatten_inputs(traced, args, kwargs)
    # the outputs are a LayerNorm's and a tanh's (fp32 islands): their last bits may differ (2e-7 measured)
    assert_matches_reference(graph, inputs, pytree.tree_leaves(out), fp32_tolerance=1e-5)
    with torch.no_grad():
        expected = model(*args, **kwargs)
    got = np.concatenate([np.ravel(y) for y in pytree.tree_leaves(out)])
    assert cosine(got, np.concatenate([t.numpy().ravel() for t in pytree.tree_leaves(expected)])) >= COSINE
    scores_match_exactly(graph, inputs)


@pytest.mark.parametrize("int8_scores, steps, dtype", [(None, ["requant"], "int8"),
                                                      (False, ["to_f32", "mul"], "bfloat16")])
def test_the_scores_scale_folds_into_the_requantization_or_dequantization(int8_scores, steps, dtype):
    """MultiheadAttention scales the scores by 1/sqrt(head dim): a scalar constant, part of the
    accumulator's multiplier (the requant records' or the dequantization's), not a step of its own."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, 16)
    _, graph = build_graph(SelfAttention(16, 2).eval(), (x,), quantize="int8", calibration=_calibration(x.shape),
                           int8_scores=int8_scores)
    qk = attention_matmuls(graph)[0]
    assert [s.func for s in qk.attr("epilogue")] == steps
    assert len(qk.inputs) == 3 and qk.output.dtype == dtype


def test_scalar_scale_drops_the_leading_multiply_and_renumbers():
    v = [Value(i, (4, 4)) for i in range(3)] + [Value(3, ()), Value(4, (4,)), Value(5, (4, 4))]
    consts = {3: np.float32(0.25), 4: np.ones(4, np.float32)}
    expr = (Step("mul", (0, 1)), Step("add", (3, 2)), Step("relu", (4,)))   # (acc * c + bias) relu
    node = Node(OpKind.MATMUL, (v[0], v[1], v[3], v[4]), v[5], (("epilogue", expr),), "mm")
    folded, c = scalar_scale(node, consts)
    assert c == 0.25 and folded.inputs == (v[0], v[1], v[4])
    assert folded.attr("epilogue") == (Step("add", (0, 1)), Step("relu", (2,)))
    negative = {**consts, 3: np.float32(-0.25)}   # a negative multiplier cannot requantize: it stays a step
    assert scalar_scale(node, negative) == (node, 1.0)


@settings(max_examples=3, deadline=None)
@given(st.integers(1, 3), st.integers(2, 12), st.integers(2, 8), st.integers(0, 2**16))
def test_random_attention_shapes_match_the_integer_reference(heads, seq, head_dim, seed):
    torch.manual_seed(seed)
    d = heads * head_dim
    model = SelfAttention(d, heads).eval()
    x = torch.randn(1, seq, d)
    check(model, (x,), _calibration(x.shape, seed))


@pytest.mark.parametrize("kind", ["scores", "weights"])
def test_an_attention_operand_without_a_range_is_a_clear_error(kind):
    from stagec.errors import QuantizationError
    from stagec.lower.graph.quantize import quantize
    a, b, out = Value(0, (4, 4)), Value(1, (4, 4)), Value(2, (4, 4))
    graph = Graph((a, b), (out,), (Node(OpKind.MATMUL, (a, b), out, (), "scores"),), {})
    amax = {0: 1.0, 1: 1.0, 2: 1.0}
    del amax[0 if kind == "scores" else 1]
    with pytest.raises(QuantizationError, match="no calibrated range"):
        quantize(graph, amax)


def test_int8_scores_needs_int8_and_a_bool():
    from stagec.errors import InputError
    x = torch.randn(1, 4, 8)
    with pytest.raises(InputError, match="int8_scores need quantize='int8'"):
        stagec.compile(SingleHead(8).eval(), (x,), int8_scores=False)
    with pytest.raises(InputError, match="int8_scores must be True or False"):
        stagec.compile(SingleHead(8).eval(), (x,), quantize="int8", int8_scores="yes")
