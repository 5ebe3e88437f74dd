"""Models of any input and output structure: the ClosedJaxpr over flattened tensors, with the
input and output tree structures recorded beside it (as JSON strings, so a compiled program can
save them) and the helpers that flatten a call's inputs and rebuild the model's own outputs.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from stagec.errors import InputError

from .registry import to_numpy
from .torch_export import check_rules, export, in_training_mode, interpret

TRACERS = ("export", "torch2jax")


@dataclass(frozen=True)
class TracedModel:
    """A traced model: `closed` takes the flattened input tensors (in_tree order) and returns the
    flattened outputs (out_tree order).

    >>> import torch
    >>> traced = trace_torch(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> traced(torch.randn(3, 4)).shape
    (3, 2)
    """
    closed: ClosedJaxpr
    in_tree: str    # JSON: {"treespec": torch pytree treespec of (args, kwargs), "constants": {leaf index: value}}
    out_tree: str   # torch.utils._pytree.treespec_dumps of the outputs' structure
    note: str = ""  # what the user should know about how the model was traced (empty when nothing)

    def __call__(self, *args, **kwargs):
        """Evaluate the jaxpr with JAX on the model's own inputs; returns the model's own output structure."""
        outputs = self._jitted(*flatten_inputs(self, args, kwargs))
        return unflatten_outputs(self.out_tree, [np.asarray(o) for o in outputs])

    @functools.cached_property
    def _jitted(self):
        return jax.jit(jaxpr_as_fun(self.closed))


def _as_tuple(args) -> tuple:
    return tuple(args) if isinstance(args, (tuple, list)) else (args,)


def _is_array(leaf) -> bool:
    return isinstance(leaf, (torch.Tensor, np.ndarray, jax.Array))


def _leaf_name(path) -> str:
    """'args[0]' or "kwargs['attention_mask']" for a pytree key path into (args, kwargs)."""
    return ("args" if path[0].idx == 0 else "kwargs") + pytree.keystr(path[1:])


def _dumps(spec: pytree.TreeSpec, what: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception as e:  # noqa: BLE001 - torch raises several types for unserializable node types
        raise InputError(f"the model's {what} use a container torch cannot serialize ({e}); register it with "
                         "torch.utils._pytree.register_pytree_node(..., serialized_type_name=...)") from e


def _constant(value):
    """A non-tensor input as JSON can hold it (its repr otherwise), to check later calls against."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return repr(value)


def _record_inputs(spec: pytree.TreeSpec, leaves: list) -> str:
    constants = {str(i): _constant(leaf) for i, leaf in enumerate(leaves) if not _is_array(leaf)}
    return json.dumps({"treespec": _dumps(spec, "inputs"), "constants": constants})


def _check_not_empty(args: tuple, kwargs: dict) -> None:
    """A tensor with a dimension of 0 has no element to compute (and no tile to cut): name the input."""
    for path, leaf in pytree.tree_flatten_with_path((args, kwargs))[0]:
        if _is_array(leaf) and 0 in tuple(leaf.shape):
            raise InputError(f"{_leaf_name(path)} has shape {list(leaf.shape)}, a dimension of size 0: stagec compiles "
                             "tensors with at least one element (trace with an example of the size the model runs at)")


def _dtype_notes(leaves) -> list[str]:
    wide = sorted({str(leaf.dtype).removeprefix("torch.") for leaf in leaves
                   if isinstance(leaf, torch.Tensor) and leaf.dtype in (torch.int64, torch.float64)})
    return [f"{'/'.join(wide)} inputs run as their 32-bit types (JAX runs without x64)"] if wide else []


def flatten_inputs(traced_or_in_tree: TracedModel | str, args, kwargs=None) -> list[np.ndarray]:
    """The input tensors of a call, flattened in the traced order and converted as tracing did
    (int64 -> int32, float64 -> float32, bfloat16 kept). Structure, non-tensor values and (given a
    TracedModel) shapes and dtypes must match what was traced; a mismatch names the input."""
    traced = traced_or_in_tree if isinstance(traced_or_in_tree, TracedModel) else None
    record = json.loads(traced.in_tree if traced else traced_or_in_tree)
    expected = pytree.treespec_loads(record["treespec"])
    args, kwargs = _as_tuple(args), dict(kwargs or {})
    keys = expected.child(1).context
    if set(kwargs) == set(keys):
        kwargs = {k: kwargs[k] for k in keys}     # keyword order is not structure
    with_paths, spec = pytree.tree_flatten_with_path((args, kwargs))
    if spec != expected:
        raise InputError(f"inputs have structure {spec}, but the model was traced with {expected}")
    arrays = []
    for i, (path, leaf) in enumerate(with_paths):
        constants = record["constants"]
        if _is_array(leaf) == (str(i) in constants) or (str(i) in constants and _constant(leaf) != constants[str(i)]):
            traced_with = repr(constants[str(i)]) if str(i) in constants else "a tensor"
            raise InputError(f"{_leaf_name(path)} is {'a tensor' if _is_array(leaf) else repr(leaf)}, but the model "
                             f"was traced with {traced_with} (non-tensor inputs are fixed at trace time)")
        if not _is_array(leaf):
            continue
        array = to_numpy(leaf)
        if traced is not None:
            aval = traced.closed.jaxpr.invars[len(arrays)].aval
            if array.shape != aval.shape or array.dtype != aval.dtype:
                raise InputError(f"{_leaf_name(path)} is {array.dtype}{list(array.shape)}, but the model was "
                                 f"traced with {aval.dtype}{list(aval.shape)}")
        arrays.append(array)
    return arrays


def unflatten_outputs(out_tree: str, arrays) -> object:
    """The model's own output structure (tuple, dict, ModelOutput...) around flat output arrays."""
    spec = pytree.treespec_loads(out_tree)
    arrays = list(arrays)
    if len(arrays) != spec.num_leaves:
        raise InputError(f"{len(arrays)} output arrays for an output structure of {spec.num_leaves}")
    return pytree.tree_unflatten(arrays, spec)


def _traced(closed: ClosedJaxpr, out_spec: pytree.TreeSpec, args: tuple, kwargs: dict, notes=()) -> TracedModel:
    leaves, in_spec = pytree.tree_flatten((args, kwargs))
    note = "; ".join([*notes, *_dtype_notes(leaves)])
    return TracedModel(closed, _record_inputs(in_spec, leaves), _dumps(out_spec, "outputs"), note)


def trace_exported(ep: torch.export.ExportedProgram, args, kwargs=None) -> TracedModel:
    """A TracedModel from a program already exported by `export` (core ATen, inference mode) with
    these example inputs: what trace_torch does after exporting."""
    args, kwargs = _as_tuple(args), dict(kwargs or {})
    _check_not_empty(args, kwargs)
    check_rules(ep)
    tensors = [to_numpy(x) for x in pytree.tree_leaves((args, kwargs)) if _is_array(x)]
    # NOTE: jnp's helpers are jitted functions; tracing with jit disabled inlines them, so the only
    # call equations left are those a rule makes on purpose (attention, rules_attention.py).
    with jax.disable_jit():
        closed = jax.make_jaxpr(interpret(ep))(*tensors)
    return _traced(closed, ep.call_spec.out_spec, args, kwargs)


def trace_torch(model: torch.nn.Module, args, kwargs=None, *, tracer: str = "export") -> TracedModel:
    """Trace a PyTorch model, with inference semantics, into a TracedModel.

    tracer="export" (the default): torch.export, core-ATen decompositions and stagec's ATen rules.
    tracer="torch2jax": the torch2jax package, for the functions it covers.

    >>> import torch
    >>> traced = trace_torch(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> [v.aval.shape for v in traced.closed.jaxpr.invars]
    [(3, 4)]
    """
    if tracer not in TRACERS:
        raise InputError(f"unknown tracer {tracer!r}; tracers are {TRACERS}")
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"trace_torch takes a torch.nn.Module, not {type(model).__name__}")
    args, kwargs = _as_tuple(args), dict(kwargs or {})
    _check_not_empty(args, kwargs)
    if tracer == "export":
        traced = trace_exported(export(model, args, kwargs), args, kwargs)
    else:
        from .torch2jax_tracer import trace_torch2jax
        traced = _traced(*trace_torch2jax(model, args, kwargs), args, kwargs)
    if in_training_mode(model):
        note = "; ".join(["traced in inference mode; the model was in training mode (and is left so)", traced.note])
        traced = replace(traced, note=note.removesuffix("; "))
    return traced


def from_torch(model: torch.nn.Module, args, kwargs=None, *, tracer: str = "export") -> ClosedJaxpr:
    """Trace a PyTorch model into a ClosedJaxpr over its flattened input tensors (trace_torch(...).closed).

    >>> import torch
    >>> cj = from_torch(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> [v.aval.shape for v in cj.jaxpr.invars]
    [(3, 4)]
    """
    return trace_torch(model, args, kwargs, tracer=tracer).closed


def trace_jax(fn, example_args) -> TracedModel:
    """Trace a plain JAX function of positional arrays (the compiler is JAX-hosted); its output
    structure (JAX containers are torch pytree nodes too) is recorded like a model's."""
    arrays = tuple(np.asarray(a) for a in _as_tuple(example_args))
    _check_not_empty(arrays, {})
    closed = jax.make_jaxpr(lambda *xs: jax.tree_util.tree_leaves(fn(*xs)))(*arrays)
    out_spec = pytree.tree_structure(jax.tree_util.tree_map(lambda _: 0, jax.eval_shape(fn, *arrays)))
    return _traced(closed, out_spec, arrays, {})


def from_jax(fn, example_args) -> ClosedJaxpr:
    """Trace a plain JAX function (the compiler is JAX-hosted) into a ClosedJaxpr."""
    return trace_jax(fn, example_args).closed
