"""Graph IR: canonicalization and every pass preserve the reference semantics."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import rel_err
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.extend.core import jaxpr_as_fun
from test_frontend import Everything

import stagec
from stagec.errors import LoweringError
from stagec.frontend import from_torch
from stagec.lower.graph.canonicalize import canonicalize
from stagec.lower.graph.evaluate import evaluate
from stagec.lower.graph.graph_ir import MOVEMENT_OPS, Graph, Node, OpKind, Step, Value, check_graph
from stagec.models import hand_keypoint_net
from stagec.pipeline import PIPELINE, GraphPass, position
from stagec.sim.reference import execute

# the fp32 graph passes, as compile runs them
GRAPH_PASSES = [(s.name, s.run.fn) for s in PIPELINE[:position("calibrate")] if isinstance(s.run, GraphPass)]


def _graphs(model, x):
    cj = from_torch(model, (x,))
    ref = np.asarray(jaxpr_as_fun(cj)(x.numpy())[0])
    g = canonicalize(cj)
    out = [("canonicalize", g)]
    for name, run in GRAPH_PASSES:
        g = run(g)
        out.append((name, g))
    return ref, out


def test_passes_preserve_semantics():
    for model, x in (hand_keypoint_net(), (Everything().eval(), (torch.randn(2, 3, 20, 20),))):
        ref, graphs = _graphs(model, x[0])
        for name, g in graphs:
            assert rel_err(evaluate(g, x[0].numpy())[0], ref) < 1e-5, name


def test_batch_norm_folds_into_the_convolution():
    model, (x,) = hand_keypoint_net()
    _, graphs = _graphs(model, x)
    final = graphs[-1][1]
    convs = [n for n in final.nodes if n.op == OpKind.CONV]
    assert len(convs) == 6
    for n in convs:   # conv + BN + ReLU: one bias add and the ReLU are all that is left
        assert [s.func for s in n.attr("epilogue")] == ["add", "relu"], n
    assert not any(n.op == OpKind.ELEMENTWISE and "mul" in n.name for n in final.nodes if "features.7" not in n.name)


def test_elementwise_chains_fuse():
    class Chain(torch.nn.Module):
        def forward(self, x, y):
            return torch.relu(x * 2.0 + y) - y
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    g = canonicalize(from_torch(Chain(), (x, y)))
    for _, run in GRAPH_PASSES:
        g = run(g)
    assert len(g.nodes) == 1 and g.nodes[0].op == OpKind.ELEMENTWISE
    assert [s.func for s in g.nodes[0].attr("expr")] == ["mul", "add", "relu", "sub"]
    np.testing.assert_allclose(evaluate(g, x.numpy(), y.numpy())[0], Chain()(x, y).numpy(), rtol=1e-6)



class ReadsTwice(torch.nn.Module):
    """Values that one node reads twice: an elementwise square and a conv result's square."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, r):
        y = -x
        c = self.conv(torch.sigmoid(x))
        return y * y * r, c * c


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_a_value_read_twice_by_one_node_fuses_whole(quantize):
    model = ReadsTwice().eval()
    x, r = torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5)
    program = stagec.compile(model, (x, r), quantize=quantize)
    (square, conv_square), _ = stagec.simulate(program, x, r)
    with torch.no_grad():
        ref_square, ref_conv_square = model(x, r)
    assert rel_err(square, ref_square) < 1e-6
    assert rel_err(conv_square, ref_conv_square) < (1e-5 if quantize is None else 0.1)
    matrix = [layer for layer in program.layers if layer.op == "conv"]
    assert len(matrix) == 1 and "mul" in matrix[0].name    # the square runs in the conv's epilogue

def test_graph_prints():
    model, (x,) = hand_keypoint_net()
    _, graphs = _graphs(model, x)
    text = str(graphs[-1][1])
    assert "conv(" in text and "epilogue={t0=add(i0,i1); t1=relu(t0)}" in text and "return" in text


class PrescaledAttention(torch.nn.Module):
    """Whisper's attention in small: q scaled after its projection (then split into heads by a
    reshape), attention with scale 1, softmax normalization before P @ V."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, x):
        b, n, d = x.shape

        def split(t):
            return t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
        q = split(self.q(x) * (d // self.heads) ** -0.5)
        o = torch.nn.functional.scaled_dot_product_attention(q, split(self.k(x)), split(self.v(x)), scale=1.0)
        return o.transpose(1, 2).reshape(b, n, d)


def test_attention_scales_fold_and_softmax_normalizes_after_p_at_v():
    torch.manual_seed(0)
    model, x = PrescaledAttention().eval(), torch.randn(1, 12, 16)
    ref, graphs = _graphs(model, x)
    for name, g in graphs:
        assert rel_err(evaluate(g, x.numpy())[0], ref) < 1e-5, name
    final = graphs[-1][1]
    scores = (1, 2, 12, 12)
    # no multiply by attention's scale 1, and q's scale folded into its projection's weights
    assert not any(n.op == OpKind.ELEMENTWISE and "mul" in {s.func for s in n.attr("expr")} for n in final.nodes)
    # one reciprocal per row of the scores, not per score
    recips = [n for n in final.nodes if n.op == OpKind.ELEMENTWISE and n.attr("expr")[0].func == "recip"]
    assert [n.output.shape for n in recips] == [scores[:-1] + (1,)]
    # the normalization runs on P @ V's output tile: N values per row instead of K
    pv = [n for n in final.nodes if n.op == OpKind.MATMUL and "mul" in {s.func for s in n.attr("epilogue") or ()}]
    assert len(pv) == 1 and [s.func for s in pv[0].attr("epilogue")] == ["mul"]
    assert pv[0].inputs[2].shape == pv[0].output.shape[:-1] + (1,)
    assert not any(n.op == OpKind.ELEMENTWISE and n.output.shape == scores and n.inputs[0].shape == scores
                   and "mul" in {s.func for s in n.attr("expr")} for n in final.nodes)


# --- scatters with constant indices: gathers of rows; running sums: a matmul ------------------------

SCATTER_METHODS = ("set", "add", "mul", "min", "max")


@st.composite
def scatters(draw):
    """x.at[where].method(updates) with constant indices: rows or elements, repeated, negative or out of
    range (dropped), over one or two indexed axes among full slices."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    axes = sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=2)))
    count = draw(st.integers(1, 5))
    where = tuple(np.array(draw(st.lists(st.integers(-shape[a], shape[a]), min_size=count, max_size=count)))
                  if a in axes else slice(None) for a in range(len(shape)))
    return shape, where, draw(st.sampled_from(SCATTER_METHODS))


@given(scatters(), st.integers(0, 2**16))
def test_scatter_with_constant_indices_lowers_to_gathers(case, seed):
    shape, where, method = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    updates = rng.standard_normal(jax.eval_shape(lambda: jnp.zeros(shape)[where]).shape).astype(np.float32)

    def fn(x, u):
        return getattr(jnp.asarray(x).at[where], method)(u, mode="drop")
    closed = jax.make_jaxpr(fn)(x, updates)
    graph = canonicalize(closed)
    assert {n.op for n in graph.nodes} <= {OpKind.GATHER, OpKind.CONCAT, OpKind.ELEMENTWISE, OpKind.RESHAPE}
    np.testing.assert_array_equal(evaluate(graph, x, updates)[0], np.asarray(fn(x, updates)))


def test_row_scatters_gather_whole_rows():
    """x[rows] = u is one GATHER of whole rows; an accumulation runs one GATHER per update a row receives."""
    x, u = np.ones((6, 3, 4), np.float32), np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    rows = np.array([4, 1])
    graph = canonicalize(jax.make_jaxpr(lambda x, u: x.at[rows].set(u))(x, u))
    (gather,) = [n for n in graph.nodes if n.op == OpKind.GATHER]
    assert gather.inputs[0].shape == (6 + 2, 12) and gather.output.shape == (6, 12)
    graph = canonicalize(jax.make_jaxpr(lambda x, u: x.at[np.array([1, 4, 1, 1])].add(u[np.array([0, 1, 0, 1])]))(x, u))
    layers = [n for n in graph.nodes if n.op == OpKind.GATHER and n.output.shape == (6, 12)]
    assert len(layers) == 3   # row 1 receives three updates


def test_scatter_with_indices_from_the_inputs_is_a_lowering_error():
    closed = jax.make_jaxpr(lambda x, i: x.at[i].set(0.0))(np.ones((4, 3), np.float32), np.array([1], np.int32))
    with pytest.raises(LoweringError, match="scatter with indices computed from the model's inputs"):
        canonicalize(closed)


def test_running_sum_is_a_matmul_by_a_triangle():
    x = np.random.default_rng(0).standard_normal((3, 5, 7)).astype(np.float32)
    mask = x > 0
    for fn, args in ((lambda x: jnp.cumsum(x, 1), (x,)), (lambda x: lax.cumsum(x, 2, reverse=True), (x,)),
                     (lambda m: jnp.cumsum(m.astype(jnp.int32), -1), (mask,))):
        graph = canonicalize(jax.make_jaxpr(fn)(*args))
        assert [n.op for n in graph.nodes if n.op not in MOVEMENT_OPS | {OpKind.ELEMENTWISE}] == [OpKind.MATMUL]
        np.testing.assert_allclose(evaluate(graph, *args)[0], np.asarray(fn(*args)), rtol=1e-6, atol=1e-6)


def test_take_along_axis_gathers_rows_by_batch_position():
    """torch.gather (jnp.take_along_axis) of a computed tensor, by constant and by computed indices:
    XLA's batching dims become part of the row number."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    index, last = rng.integers(0, 5, (3, 2, 4)).astype(np.int32), rng.integers(0, 4, (3, 5, 2)).astype(np.int32)
    for fn, args in ((lambda x: jnp.take_along_axis(x * 2, index, 1), (x,)),
                     (lambda x, i: jnp.take_along_axis(x * 2, i, 1), (x, index)),
                     (lambda x, i: jnp.take_along_axis(x * 2, i, 2), (x, last))):
        graph = canonicalize(jax.make_jaxpr(fn)(*args))
        assert OpKind.GATHER in {n.op for n in graph.nodes}
        np.testing.assert_array_equal(evaluate(graph, *args)[0], np.asarray(fn(*args)))


def test_a_zero_pad_of_a_convs_rows_and_columns_becomes_its_padding():
    """TF-style "same" padding (asymmetric before a stride-2 conv) folds into the conv; a pad of
    nothing is no node at all; a pad of the channels, or of a value other than zero, stays."""
    class Padded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Conv2d(3, 8, 3, 2), torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(9, 4, 3)

        def forward(self, x):
            h = self.a(torch.nn.functional.pad(x, (0, 1, 0, 1)))
            h = self.b(torch.nn.functional.pad(h, (0, 0, 0, 0)))
            h = torch.nn.functional.pad(h, (1, 1, 1, 1), value=0.5)
            return self.c(torch.nn.functional.pad(h, (0, 0, 0, 0, 0, 1)))

    model, x = Padded().eval(), torch.randn(1, 3, 9, 9)
    ref, graphs = _graphs(model, x)
    _, g = graphs[-1]
    convs = [n for n in g.nodes if n.op == OpKind.CONV]
    assert convs[0].attr("padding") == ((0, 1), (0, 1)) and convs[1].attr("padding") == ((0, 0), (0, 0))
    assert [n.attr("value") for n in g.nodes if n.op == OpKind.PAD] == [0.5, 0.0]
    assert rel_err(evaluate(g, x.numpy())[0], model(x).detach().numpy()) < 1e-5
    assert rel_err(evaluate(g, x.numpy())[0], ref) < 1e-5


def test_check_graph_names_the_pass_that_broke_the_graph():
    a, b, c = Value(0, (2,)), Value(1, (2,)), Value(2, (2,))
    relu = (Step("relu", (0,)),)
    good = Graph((a,), (c,), (Node(OpKind.ELEMENTWISE, (a,), b, (("expr", relu),), "f"),
                             Node(OpKind.ELEMENTWISE, (b,), c, (("expr", relu),), "g")))
    check_graph(good, "pass")
    undefined = Graph((a,), (c,), good.nodes[1:])
    with pytest.raises(AssertionError, match="after fold, g reads %1, which nothing before it defines"):
        check_graph(undefined, "fold")
    twins = Graph((a,), (c,), (good.nodes[0], dataclasses.replace(good.nodes[1], name="f")))
    with pytest.raises(AssertionError, match="after quantize, two nodes are named f"):
        check_graph(twins, "quantize")
    redefined = Graph((a,), (b,), (good.nodes[0], dataclasses.replace(good.nodes[1], output=b)))
    with pytest.raises(AssertionError, match="g defines %1 a second time"):
        check_graph(redefined, "dce")
    lost = Graph((a,), (Value(9, (2,)),), good.nodes)
    with pytest.raises(AssertionError, match="returns %9, which nothing defines"):
        check_graph(lost, "dce")


def test_an_empty_slice_adds_nothing_to_a_concat():
    """Phi-3's rotary embedding over the whole head: cat((rotated, q[..., d:])) with the second part empty,
    which became a COPY nest of no channels (ValueError: range() arg 3 must not be zero, at lowering)."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)

    def rotated(x):
        return jnp.concatenate([x * 2, x[..., 4:]], -1)

    graph = canonicalize(jax.make_jaxpr(rotated)(x))
    assert [n.op for n in graph.nodes] == [OpKind.ELEMENTWISE]
    np.testing.assert_array_equal(execute(stagec.compile(rotated, (x,)), [x])[0], rotated(x))
    with pytest.raises(LoweringError, match=r"output 1 has shape \[2, 0\], an empty tensor"):
        canonicalize(jax.make_jaxpr(lambda x: (x * 2, x[..., 4:]))(x))


@pytest.mark.parametrize("shape, reps", [((1, 1, 8), (1, 64, 1)), ((1, 3, 4), (2, 1, 3))])
def test_tile_lowers_as_a_broadcast(shape, reps):
    """jnp.tile (torch's repeat; SwiftFormer's attention repeats its query weights per token) had no rule."""
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def tiled(x):
        return jnp.tile(x * 2, reps) + 1

    assert "tile" in str(jax.make_jaxpr(tiled)(x))
    np.testing.assert_array_equal(execute(stagec.compile(tiled, (x,)), [x])[0], tiled(x))


def _away_from_zero(x):
    return np.copysign(np.floor(np.abs(x.astype(np.float64)) + 0.5), x).astype(np.float32)


ROUNDINGS = {"floor": (jnp.floor, np.floor), "ceil": (jnp.ceil, np.ceil), "round": (jnp.round, np.round),
             "round_away": (lambda v: lax.round(v, lax.RoundingMethod.AWAY_FROM_ZERO), _away_from_zero),
             "sign": (jnp.sign, np.sign)}


@pytest.mark.parametrize("name", ROUNDINGS)
def test_floor_ceil_round_and_sign_of_activations(name):
    """floor, ceil, round and sign had no rule (only constants folded): the first three are expressions
    over float32 -> int32 truncation, exact below 2**23 and x itself above; ties, -0.5 < x < 0, the last
    fractional float32s, huge values, infinities and NaN against numpy, in both simulators."""
    special = [0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, -0.49999997, -0.4999999851, 1e-8, -1e-8, 2**22 + 0.5,
               -(2**22 + 0.5), 2**23 - 0.5, -(2**23 - 0.5), 2**23, 2**24 + 2, 1e30, -1e30, np.inf, -np.inf, np.nan]
    x = np.concatenate([np.array(special, np.float32), np.arange(-40, 41, dtype=np.float32) / 4,
                        np.random.default_rng(0).standard_normal(64).astype(np.float32) * 10])
    fn, want = ROUNDINGS[name]
    program = stagec.compile(lambda v: fn(v * 3.0) - 1.0, (x,))
    expected = want(x * np.float32(3.0)) - np.float32(1.0)
    np.testing.assert_array_equal(execute(program, [x])[0], expected)
    np.testing.assert_array_equal(stagec.simulate(program, x)[0], expected)


@pytest.mark.parametrize("name, fn", [("div", lax.div), ("rem", lax.rem), ("floor_divide", jnp.floor_divide),
                                      ("remainder", jnp.remainder), ("div_by_constant", lambda x, y: lax.div(x, 3)),
                                      ("remainder_of_constant", lambda x, y: x % 5)])
def test_integer_division_of_activations(name, fn):
    """int32 division truncates toward zero (lax.div; XLA's x / 0 = -1) and rem keeps x's sign (x % 0 = x):
    built from the vector unit's floor division.  A constant divisor was multiplied by its float32
    reciprocal (garbage: 1230329171 for -7 / 3), and rem had no rule (CANINE's character hashing)."""
    x = np.array([-7, -3, 0, 5, 7, 100, -2**31, -2**31, 9, -9, 6, -6, 2**31 - 1, 12345678], np.int32)
    y = np.array([3, 5, 4, -3, -7, 0, -1, 2, 3, -3, -4, 4, 1, -1000], np.int32)

    def model(x, y):
        return fn(x * 1, y)

    program = stagec.compile(model, (x, y))
    want = np.asarray(jax.jit(model)(x, y))
    np.testing.assert_array_equal(execute(program, [x, y])[0], want)
    np.testing.assert_array_equal(stagec.simulate(program, x, y)[0], want)


@pytest.mark.parametrize("fn, axis, dtype", [(jnp.argmax, -1, np.float32), (jnp.argmin, 1, np.float32),
                                             (jnp.argmax, 0, np.float32), (jnp.argmax, -1, np.int32)])
def test_argmax_and_argmin_of_activations(fn, axis, dtype):
    """argmax had no rule (CLIP's text pooling takes the hidden state at the input ids' argmax): the first
    index of the extreme, ties to the first, the first NaN where there is one, as jit-compiled JAX, in
    both simulators."""
    rng = np.random.default_rng(0)
    if dtype == np.int32:
        x = rng.integers(0, 4, (4, 6)).astype(np.int32)   # many ties
    else:
        x = rng.standard_normal((3, 5, 7)).astype(np.float32)
        x[0, 1, 2] = x[0, 1, 5] = x[0, 3, 2] = 9.0
        x[1, 2, 3] = x[1, 2, 5] = np.nan

    def model(x):
        return fn(x * 1, axis=axis)

    program = stagec.compile(model, (x,))
    want = np.asarray(jax.jit(model)(x))
    np.testing.assert_array_equal(execute(program, [x])[0], want)
    np.testing.assert_array_equal(stagec.simulate(program, x)[0], want)


POWERS = {"isfinite": lambda v: jnp.isfinite(v).astype(np.float32), "exp2": jnp.exp2,
          "pow_2.5": lambda v: v ** np.float32(2.5), "pow_-1.3": lambda v: v ** np.float32(-1.3),
          "sqrt_as_pow": lambda v: v ** np.float32(0.5), "rsqrt_as_pow": lambda v: v ** np.float32(-0.5),
          "pow_3": lambda v: v ** np.float32(3.0), "pow_0": lambda v: v ** np.float32(0.0) + v}


@pytest.mark.parametrize("name", POWERS)
def test_powers_and_finiteness_of_activations(name):
    """is_finite, exp2 and pow by a constant had no rule.  pow(x, c) for a non-integer c is exp(c log x):
    within 2e-6 of XLA's pow on values up to 100 (the exponent's rounding, c log x times an ulp), and
    pow's special values (0, -1.5, +-inf, NaN) exactly as XLA's."""
    x = np.array([0.0, 0.5, 1.0, 2.0, 3.7, 1e-3, 100.0, -1.5, np.inf, -np.inf, np.nan], np.float32)

    def model(v):
        return POWERS[name](v * np.float32(1.0))

    program = stagec.compile(model, (x,))
    want = np.asarray(jax.jit(model)(x))
    for got in (execute(program, [x])[0], stagec.simulate(program, x)[0]):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("fn, exact", [(jnp.sin, np.sin), (jnp.cos, np.cos)])
def test_sin_and_cos_of_activations(fn, exact):
    """sin and cos had no rule (a timestep embedding, rotary positions passed in): Cephes' reduction and
    polynomials, within 2e-7 of float64 for |x| up to 8192 (XLA's own: 3e-8) in both simulators; NaN
    for inf and NaN, and from 2**17 on, where the reduction would lose the result's digits."""
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-10, 10, 401), rng.uniform(-8192, 8192, 400),
                        [0.0, np.pi / 4, np.pi / 2, np.pi, 3 * np.pi / 2, 1e-20]]).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 2.0**17, -1e10], np.float32)
    program = stagec.compile(lambda v: fn(v * np.float32(1.0)), (x,))
    for got in (execute(program, [x])[0], stagec.simulate(program, x)[0]):
        np.testing.assert_allclose(got, exact(x.astype(np.float64)), rtol=0, atol=2e-7)
    program = stagec.compile(lambda v: fn(v * np.float32(1.0)), (special,))
    assert np.isnan(execute(program, [special])[0]).all() and np.isnan(stagec.simulate(program, special)[0]).all()
