"""The alternative tracer: the torch2jax package runs the model's Python with JAX values standing in
for tensors. It covers fewer functions than the export path (on torch 2.13 not even `torch.relu`),
so export stays the default; it is here for the functions it does cover.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
import torch.utils._pytree as pytree
from jax import make_jaxpr
from jax.extend.core import ClosedJaxpr

from stagec.errors import UnsupportedOpError

from .registry import to_numpy
from .torch_export import inference_mode


class _Outputs:
    # NOTE: torch2jax hands back `result.value`, expecting the module to return one tensor; this
    # carries all output leaves' JAX values and the output structure through that attribute instead.
    def __init__(self, outputs):
        leaves, spec = pytree.tree_flatten(outputs)
        bad = [type(leaf).__name__ for leaf in leaves if not hasattr(leaf, "value")]
        if bad:
            raise UnsupportedOpError(f"the model returns non-tensor values ({', '.join(bad)})")
        self.value = ([leaf.value for leaf in leaves], spec)


class _ExampleInputs:
    """The example inputs' leaves and structure, shared (not copied) by torch2jax's deep copy."""

    def __init__(self, args: tuple, kwargs: dict):
        self.leaves, self.spec = pytree.tree_flatten((args, kwargs))

    def __deepcopy__(self, memo):
        return self


class _FlatModel(torch.nn.Module):
    """The model as a function of its flattened tensor inputs."""

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict):
        super().__init__()
        self.model = model
        self.inputs = _ExampleInputs(args, kwargs)

    def forward(self, *tensors):
        supplied = iter(tensors)
        leaves = [next(supplied) if isinstance(x, torch.Tensor) else x for x in self.inputs.leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self.inputs.spec)
        return _Outputs(self.model(*args, **kwargs))


def trace_torch2jax(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[ClosedJaxpr, pytree.TreeSpec]:
    """(ClosedJaxpr over the flattened input tensors, the outputs' tree structure), via torch2jax."""
    try:
        from torch2jax import t2j
    except ImportError as e:
        raise ImportError("tracer='torch2jax' needs the torch2jax package (pip install torch2jax==0.1.0)") from e
    flat = _FlatModel(model, args, kwargs)
    with inference_mode(model):
        fn = t2j(flat)    # torch2jax runs a deep copy, taken now, in inference mode
    weights = {name: jnp.asarray(to_numpy(t)) for name, t in flat.state_dict().items()}
    structure = []

    def run(*tensors):
        values, spec = fn(*tensors, state_dict=weights)
        structure.append(spec)
        return values

    try:
        closed = make_jaxpr(run)(*[to_numpy(x) for x in flat.inputs.leaves if isinstance(x, torch.Tensor)])
    except NotImplementedError as e:
        raise UnsupportedOpError(f"torch2jax cannot trace this model: {str(e).splitlines()[0]} "
                                 "(the default tracer='export' covers more of PyTorch)") from e
    return closed, structure[0]
