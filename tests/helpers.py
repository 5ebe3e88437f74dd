import numpy as np


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref|: error relative to the reference's scale."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


# Reference evaluation of traced models in tests: compiling is most of the cost of a one-off
# call, and XLA's backend optimizations (which do not change the arithmetic) dominate compiling.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def evaluate(traced, args, kwargs=None):
    """A TracedModel's jaxpr evaluated by JAX on the model's own inputs, in its own output structure."""
    import jax
    from jax.extend.core import jaxpr_as_fun

    from stagec.frontend import flatten_inputs, unflatten_outputs
    flat = flatten_inputs(traced, args, kwargs)
    outputs = jax.jit(jaxpr_as_fun(traced.closed)).lower(*flat).compile(compiler_options=FAST_COMPILE)(*flat)
    return unflatten_outputs(traced.out_tree, [np.asarray(o) for o in outputs])
