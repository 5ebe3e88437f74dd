"""Host constant folding (lower.fold) against JAX's own evaluation of the same equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from stagec.lower.fold import FOLDS, fold

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
POS = np.abs(X) + 0.5
IDX = RNG.integers(-7, 7, (2, 3, 4)).astype(np.int32)

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
