"""Constant folding on the host: a jaxpr equation whose inputs are all constants, evaluated.

The primitives that fold in real models (batch-norm scales, weight transposes and
reshapes, masks built from iota) run in numpy, one rule per primitive; any other
primitive binds through JAX.  Binding compiles an XLA kernel per primitive and
shape, which cost a model's first compile seconds; numpy costs nothing to start.
Results take the equation's output dtype (numpy would widen float32 by a float64
literal, JAX keeps float32).  Arithmetic flushes float32 subnormals to zero, in its
inputs and its results, as XLA's CPU arithmetic does (what the simulator and a traced
model's evaluation compute); data movement, neg and abs keep them, as XLA's do.
"""

from __future__ import annotations

import numpy as np

from stagec.rule_tables import registrar

FOLDS = {}


fold_rule = registrar(FOLDS)


_ELEMENTWISE = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
                "neg": np.negative, "sqrt": np.sqrt, "abs": np.abs, "exp": np.exp, "log": np.log,
                "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
                "ne": np.not_equal, "and": np.bitwise_and, "or": np.bitwise_or, "not": np.invert}


_SIGN_ONLY = frozenset({"neg", "abs"})   # sign-bit operations: subnormals pass through


def flush_subnormals(x):
    """float32 subnormals as zeros of their sign (XLA's CPU arithmetic: denormals-are-zero, flush-to-zero)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        return x
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), x), x)


def _arithmetic(fn):
    """fn on flushed inputs, with its result flushed."""
    return lambda eqn, *xs: flush_subnormals(fn(eqn, *map(flush_subnormals, xs)))


@fold_rule(*_ELEMENTWISE)
def fold_elementwise(eqn, *xs):
    fn = _ELEMENTWISE[eqn.primitive.name]
    return fn(*xs) if eqn.primitive.name in _SIGN_ONLY else _arithmetic(lambda _, *a: fn(*a))(eqn, *xs)


@fold_rule("div")
@_arithmetic
def fold_div(eqn, x, y):
    if np.issubdtype(eqn.outvars[0].aval.dtype, np.integer):
        raise NotImplementedError   # lax.div truncates toward zero, numpy floors: let JAX do it
    return np.divide(x, y)


@fold_rule("rsqrt")
@_arithmetic
def fold_rsqrt(eqn, x):
    return 1.0 / np.sqrt(np.asarray(x, np.float64))   # rounded once: within XLA's last place


@fold_rule("reshape")
def fold_reshape(eqn, x):
    return np.reshape(x, eqn.params["new_sizes"])


@fold_rule("transpose")
def fold_transpose(eqn, x):
    return np.transpose(x, eqn.params["permutation"])


@fold_rule("squeeze")
def fold_squeeze(eqn, x):
    return np.squeeze(x, tuple(eqn.params["dimensions"]))


@fold_rule("broadcast_in_dim")
def fold_broadcast_in_dim(eqn, x):
    shape, dims = eqn.params["shape"], eqn.params["broadcast_dimensions"]
    expanded = [1] * len(shape)
    for d, n in zip(dims, np.shape(x), strict=True):
        expanded[d] = n
    return np.broadcast_to(np.reshape(x, expanded), shape)


@fold_rule("convert_element_type")
def fold_convert(eqn, x):
    if np.issubdtype(np.asarray(x).dtype, np.floating) and np.issubdtype(eqn.params["new_dtype"], np.integer):
        raise NotImplementedError   # float -> int saturation rules are XLA's: let JAX do it
    return flush_subnormals(x) if eqn.params["new_dtype"] == np.bool_ else x   # x != 0, as XLA compares


@fold_rule("iota")
def fold_iota(eqn):
    shape, dim = eqn.params["shape"], eqn.params["dimension"]
    idx = np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return np.broadcast_to(idx, shape)


@fold_rule("select_n")
def fold_select_n(eqn, which, *cases):
    return np.choose(np.asarray(which, np.int64), cases) if len(cases) > 2 else np.where(which, cases[1], cases[0])


@fold_rule("slice")
def fold_slice(eqn, x):
    strides = eqn.params["strides"] or (1,) * np.ndim(x)
    return x[tuple(slice(a, b, s) for a, b, s in
                   zip(eqn.params["start_indices"], eqn.params["limit_indices"], strides, strict=True))]


@fold_rule("concatenate")
def fold_concatenate(eqn, *xs):
    return np.concatenate(xs, axis=eqn.params["dimension"])


def fold(eqn, ins) -> list[np.ndarray]:
    """The outputs of `eqn` on the constant inputs `ins`, as numpy arrays of the equation's dtypes."""
    rule = FOLDS.get(eqn.primitive.name)
    if rule is not None and not eqn.primitive.multiple_results:
        try:
            with np.errstate(all="ignore"):   # inf and nan fold as XLA computes them, without warnings
                out = rule(eqn, *ins)
        except NotImplementedError:
            pass
        else:
            aval = eqn.outvars[0].aval
            # A view where numpy gives one (a folded weight transpose): the constant pool copies each
            # constant once, in the order its lowering streams, so copying here would only add a pass.
            return [np.asarray(out, aval.dtype).reshape(aval.shape)]
    outs = eqn.primitive.bind(*ins, **eqn.params)
    return [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else [outs])]
