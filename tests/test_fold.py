"""Host constant folding (lower.graph.fold) against JAX's own evaluation of the same equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax import lax

from stagec.lower.graph.fold import FOLDS, fold

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
POS = np.abs(X) + 0.5
IDX = RNG.integers(-7, 7, (2, 3, 4)).astype(np.int32)
SUBNORMAL = np.array([1e-45, -1e-40, 1e-39, 2e-38, 0.0, 1.0], np.float32)   # all but the last three subnormal

CASES = {
    "elementwise": (lambda x, y: (x + y, x - y, x * y, jnp.maximum(x, y), jnp.minimum(x, y), -x, jnp.abs(x),
                                  jnp.exp(x), x < y, x <= y, x > y, x >= y, x == y, x != y), (X, X[::-1])),
    "float literal stays float32": (lambda x: (x * 1e-5 + 0.1, x / 3.0), (X,)),
    "sqrt, log, rsqrt": (lambda p: (jnp.sqrt(p), jnp.log(p), lax.rsqrt(p)), (POS,)),
    "integer": (lambda i, j: (i + j, i * 3, i // 3, (i > 0) & (j < 0), (i > 0) | ~(j < 0), i.astype(np.float32)),
                (IDX, IDX[::-1])),
    "float to int": (lambda x: (x * 4).astype(jnp.int32), (X,)),
    "layout": (lambda x: (x.reshape(6, 4), x.transpose(2, 0, 1), x[:, 1:3, ::2], x[None][0],
                          jnp.concatenate([x, x], 1), lax.broadcast_in_dim(x[0, 0], (3, 4), (1,))), (X,)),
    "subnormals are zeros in arithmetic": (lambda x: (x + 0, x * 1, x == 0, x > 0, jnp.maximum(x, 0), x / 2,
                                                      lax.rsqrt(x), x.astype(bool), -x, jnp.abs(x)), (SUBNORMAL,)),
    "iota and select": (lambda x: (jnp.arange(5), lax.broadcasted_iota(jnp.int32, (3, 4), 1),
                                   jnp.where(x > 0, x, 2 * x), lax.select_n(jnp.int32(1), x, -x)), (X,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fold_matches_jax(name):
    fn, args = CASES[name]
    closed = jax.make_jaxpr(fn)(*args)
    env = dict(zip(closed.jaxpr.invars, args, strict=True))
    folded = set()

    def read(v):
        return np.asarray(v.val) if hasattr(v, "val") else env[v]

    for eqn in closed.jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        got = fold(eqn, ins)
        want = eqn.primitive.bind(*ins, **eqn.params)
        want = want if eqn.primitive.multiple_results else [want]
        for v, g, w in zip(eqn.outvars, got, want, strict=True):
            assert g.dtype == v.aval.dtype and g.shape == v.aval.shape, eqn
            np.testing.assert_allclose(g, np.asarray(w), rtol=2e-7, atol=0, err_msg=str(eqn))
            env[v] = g
        folded.add(eqn.primitive.name)
    assert folded & set(FOLDS), "the case exercises no numpy rule"


# --- every numpy rule of FOLDS against JAX's own evaluation, over shapes, dtypes and values ------------
# A rule added to FOLDS fails test_every_fold_rule_has_a_case until FOLD_CASES says how to exercise it.

F32, I32, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


def _values(data, shape, dtype):
    if dtype == F32:   # any float32, nan, infinities and signed zeros included
        return data.draw(hnp.arrays(dtype, shape, elements=st.floats(width=32)))
    return data.draw(hnp.arrays(dtype, shape))


def _same_shape(arity):
    def make(data, shape, dtype):
        return [_values(data, shape, dtype) for _ in range(arity)]
    return make


def _permute(data, x):   # any permutation but the identity (which lax elides)
    return lax.transpose(x[None], tuple(data.draw(st.permutations(range(x.ndim + 1)).filter(
        lambda p: p != list(range(x.ndim + 1))))))


def _slice(data, x):
    starts = [data.draw(st.integers(0, n - 1)) for n in x.shape]
    limits = [data.draw(st.integers(s + 1, n)) for s, n in zip(starts, x.shape, strict=True)]
    return lax.slice(x, starts, limits, [data.draw(st.integers(1, 3)) for _ in x.shape])


def _broadcast(data, x):
    lead = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    return lax.broadcast_in_dim(x, (*lead, *x.shape), tuple(range(len(lead), len(lead) + x.ndim)))


def _select_n(data, shape, dtype):
    """select_n by a boolean (two cases) or an int32 (three cases) `which`."""
    n = data.draw(st.sampled_from([2, 3]))
    which = data.draw(hnp.arrays(BOOL if n == 2 else I32, shape, elements=st.booleans() if n == 2
                                 else st.integers(0, n - 1)))
    return [which] + _same_shape(n)(data, shape, dtype), lax.select_n


def _convert(data, x):
    targets = [t for t in map(np.dtype, [np.float32, np.int32, np.bool_, np.int8, jnp.bfloat16, np.float16])
               if t != x.dtype]
    return lax.convert_element_type(x, data.draw(st.sampled_from(targets)))


ELEMENTWISE_DTYPES = {
    **dict.fromkeys(["add", "sub", "mul", "max", "min"], (F32, I32)), **dict.fromkeys(["neg", "abs"], (F32, I32)),
    **dict.fromkeys(["sqrt", "exp", "log", "rsqrt"], (F32,)), "div": (F32, I32),
    **dict.fromkeys(["lt", "le", "gt", "ge", "eq", "ne"], (F32, I32, BOOL)),
    **dict.fromkeys(["and", "or", "not"], (I32, BOOL)),
}
LAX_FUNCS = {"add": lax.add, "sub": lax.sub, "mul": lax.mul, "max": lax.max, "min": lax.min, "neg": lax.neg,
             "sqrt": lax.sqrt, "abs": lax.abs, "exp": lax.exp, "log": lax.log, "lt": lax.lt, "le": lax.le,
             "gt": lax.gt, "ge": lax.ge, "eq": lax.eq, "ne": lax.ne, "and": lax.bitwise_and,
             "or": lax.bitwise_or, "not": lax.bitwise_not, "div": lax.div, "rsqrt": lax.rsqrt}
ANY = (F32, I32, BOOL)


def _one_input(op):
    """(function of the drawn data and one input array, dtypes): a structural primitive's case."""
    return lambda data, shape, dtype: ([_values(data, shape, dtype)], lambda x: op(data, x))


FOLD_CASES = {   # primitive -> (dtypes, make(data, shape, dtype) -> (inputs, function))
    **{name: (dtypes, lambda data, shape, dtype, name=name: (
        _same_shape(1 if name in ("neg", "abs", "sqrt", "exp", "log", "rsqrt", "not") else 2)(data, shape, dtype),
        LAX_FUNCS[name])) for name, dtypes in ELEMENTWISE_DTYPES.items()},
    "reshape": (ANY, _one_input(lambda data, x: lax.reshape(x, (x.size,) if x.ndim != 1 else (1, x.size)))),
    "transpose": (ANY, _one_input(_permute)),
    "squeeze": (ANY, _one_input(lambda data, x: lax.squeeze(x[None], (0,)))),
    "broadcast_in_dim": (ANY, _one_input(_broadcast)),
    "convert_element_type": (ANY, _one_input(_convert)),
    "slice": (ANY, _one_input(_slice)),
    "concatenate": (ANY, lambda data, shape, dtype: (_same_shape(2)(data, shape or (1,), dtype),
                                                     lambda x, y: lax.concatenate([x, y], x.ndim - 1))),
    "select_n": (ANY, lambda data, shape, dtype: _select_n(data, shape, dtype)),
    "iota": ((I32, F32), lambda data, shape, dtype: ([], lambda: lax.broadcasted_iota(
        dtype, shape or (1,), data.draw(st.integers(0, max(len(shape), 1) - 1))))),
}
# exp, log and rsqrt: XLA's are within a unit in the last place of the exact result, not correctly
# rounded, so numpy's (or the rounded exact result) may differ from them in the last place
MAX_ULP = {"exp": 1, "log": 1, "rsqrt": 1}


def test_every_fold_rule_has_a_case():
    assert not set(FOLDS) - set(FOLD_CASES), f"fold rules with no case in FOLD_CASES: {set(FOLDS) - set(FOLD_CASES)}"


@pytest.mark.parametrize("name", sorted(FOLDS))
@given(data=st.data())
def test_every_fold_rule_matches_jax(name, data):
    dtypes, make = FOLD_CASES[name]
    dtype = data.draw(st.sampled_from(dtypes))
    inputs, fn = make(data, data.draw(shapes), dtype)
    closed = jax.make_jaxpr(fn)(*inputs)
    env = dict(zip(closed.jaxpr.invars, inputs, strict=True))
    checked = 0
    for eqn in closed.jaxpr.eqns:
        ins = [np.asarray(v.val) if hasattr(v, "val") else env[v] for v in eqn.invars]
        (want,) = [np.asarray(eqn.primitive.bind(*ins, **eqn.params))]
        if eqn.primitive.name == name:
            (got,) = fold(eqn, ins)
            assert got.dtype == want.dtype and got.shape == want.shape, eqn
            finite = np.isfinite(want) if name in MAX_ULP else np.zeros(want.shape, bool)
            np.testing.assert_array_equal(got[~finite], want[~finite], err_msg=str(eqn))
            if finite.any():
                np.testing.assert_array_max_ulp(got[finite], want[finite], MAX_ULP[name])
            checked += 1
        env[eqn.outvars[0]] = want
    assert checked, f"the case for {name} made no {name} equation"


def test_an_equation_over_a_broadcast_constant_folds():
    """DeBERTa-v2's relative position buckets: iota, a scalar that jnp.where broadcasts (a BROADCAST node,
    kept as a view of the scalar), then ceil, which has no lowering rule.  The broadcast's consumers
    fold all the same: the program computes none of it."""
    import stagec
    from stagec.sim.reference import execute

    def buckets(x):
        pos = jnp.arange(12)[:, None] - jnp.arange(12)[None, :]
        far = jnp.where(jnp.abs(pos) < 4, 3, jnp.abs(pos))
        return x + jnp.ceil(jnp.log(far.astype(jnp.float32) / 4.0) * 3.0)

    x = RNG.standard_normal((12, 12)).astype(np.float32)
    assert "broadcast_in_dim" in str(jax.make_jaxpr(buckets)(x))
    program = stagec.compile(buckets, (x,))
    np.testing.assert_allclose(execute(program, [x])[0], buckets(x), rtol=1e-6)
