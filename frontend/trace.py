"""Models of any input and output structure: the ClosedJaxpr over flattened tensors, with the
input and output tree structures recorded beside it (as JSON strings, so a compiled program can
save them) and the helpers that flatten a call's inputs and rebuild the model's own outputs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax.extend.core import ClosedJaxpr, jaxpr_as_fun

from stagec.errors import InputError, ProgramFormatError, shown

from .registry import to_numpy
from .torch_export import check_rules, export, exported, in_training_mode, interpret

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

    def export(self) -> jax.export.Exported:
        """The traced model as a `jax.export.Exported` over its flattened inputs: `.mlir_module()` is its
        StableHLO text, `.serialize()` the portable artifact other JAX-based compilers load."""
        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in self.closed.jaxpr.invars]
        return jax.export.export(self._jitted)(*specs)


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


def flatten_inputs(traced_or_in_tree: TracedModel | str | None, args, kwargs=None,
                   expected: list[tuple[str, tuple]] | None = None) -> list[np.ndarray]:
    """The input tensors of a call, flattened in the traced order and converted as tracing did
    (int64 -> int32, float64 -> float32, bfloat16 kept).  Structure and non-tensor values must match
    what was traced, and each tensor the (dtype, shape) `expected` of it (a TracedModel knows its
    own): same shape, same kind of number (bool, integer or floating-point; integers must fit).
    `None` for the tree: positional tensors only, one per `expected`.  A mismatch is an InputError
    that says what was expected and what came, by name (`args[0]`, `kwargs['mask']`)."""
    if isinstance(traced_or_in_tree, TracedModel):
        expected = [(str(v.aval.dtype), tuple(v.aval.shape)) for v in traced_or_in_tree.closed.jaxpr.invars]
        traced_or_in_tree = traced_or_in_tree.in_tree
    if traced_or_in_tree is None:
        spec, constants = pytree.tree_structure((tuple(range(len(expected))), {})), {}
    else:
        spec, constants = read_in_tree(traced_or_in_tree)
    args, kwargs = _as_tuple(args), dict(kwargs or {})
    keys = spec.child(1).context
    if set(kwargs) == set(keys):
        kwargs = {k: kwargs[k] for k in keys}     # keyword order is not structure
    with_paths, got = pytree.tree_flatten_with_path((args, kwargs))
    if got != spec:
        raise InputError(_structure_mismatch(spec, constants, expected, got, [leaf for _, leaf in with_paths]))
    arrays = []
    for i, (path, leaf) in enumerate(with_paths):
        name = _leaf_name(path)
        if _is_array(leaf) == (i in constants) or (i in constants and _constant(leaf) != constants[i]):
            traced_with = repr(constants[i]) if i in constants else "a tensor"
            raise InputError(f"{name} is {'a tensor' if _is_array(leaf) else repr(leaf)}, but the model "
                             f"was traced with {traced_with} (non-tensor inputs are fixed at trace time)")
        if _is_array(leaf):
            arrays.append(_checked_tensor(leaf, name, expected[len(arrays)] if expected else None))
    return arrays


_KINDS = (("bool", jnp.bool_), ("integer", jnp.integer), ("floating-point", jnp.floating))


def _kind(dtype) -> str:
    return next((name for name, kind in _KINDS if jnp.issubdtype(dtype, kind)), f"non-numeric ({dtype})")


def _checked_tensor(leaf, name: str, expected: tuple[str, tuple] | None) -> np.ndarray:
    """`leaf` as a numpy array of the expected dtype, if it has the expected shape and kind of number."""
    try:
        array = to_numpy(leaf)
    except ValueError as e:        # an int64 beyond int32's range
        raise InputError(f"{name}: {e}") from None
    if expected is None:
        return array
    dtype, shape = expected
    got = _describe(array.dtype, array.shape)
    if array.shape != tuple(shape):
        raise InputError(f"{name} is {got}, but the model was traced with {_describe(dtype, shape)}")
    if _kind(array.dtype) != _kind(dtype):
        raise InputError(f"{name} is {got}, but the model was traced with {_describe(dtype, shape)}: "
                         f"{_kind(array.dtype)} values where it takes {_kind(dtype)} ones (convert them first)")
    if _kind(dtype) == "integer" and array.size:
        limits = np.iinfo(dtype)
        if array.min() < limits.min or array.max() > limits.max:
            raise InputError(f"{name} holds values in [{array.min()}, {array.max()}], beyond {dtype}'s range")
    return array.astype(dtype, copy=False)


def _describe(dtype, shape) -> str:
    return f"{str(dtype).removeprefix('torch.')} {tuple(shape)}"


def _structure_mismatch(spec, constants: dict, expected, got_spec, got_leaves: list) -> str:
    """What the model takes and what came, by name; the names missing and unexpected."""
    names, got_names = _leaf_names(spec), _leaf_names(got_spec)
    tensors = iter(expected or ())
    want = [f"{name} = {constants[i]!r}" if i in constants else
            f"{name} {_describe(*next(tensors))}" if expected else name for i, name in enumerate(names)]
    came = [f"{name} {_describe(leaf.dtype, leaf.shape)}" if _is_array(leaf) else f"{name} = {shown(leaf)}"
            for name, leaf in zip(got_names, got_leaves, strict=True)]
    text = (f"expected {len(want)} input{'s' * (len(want) != 1)}: {', '.join(want)}; "
            f"got {len(came)}: {', '.join(came) or 'none'}")
    missing = [n for n in names if n not in got_names]
    unexpected = [n for n in got_names if n not in names]
    if missing or unexpected:
        return text + "".join(f" ({what}: {', '.join(ns)})" for what, ns in (("missing", missing),
                                                                              ("unexpected", unexpected)) if ns)
    return f"{text} (in other containers: expected {_picture(spec)}, got {_picture(got_spec)})"


class _Slot:
    def __repr__(self) -> str:
        return "*"


def _leaf_names(spec: pytree.TreeSpec) -> list[str]:
    tree = pytree.tree_unflatten([_Slot()] * spec.num_leaves, spec)
    return [_leaf_name(path) for path, _ in pytree.tree_flatten_with_path(tree)[0]]


def _picture(spec: pytree.TreeSpec) -> str:
    """(args, kwargs) with a * for each leaf, e.g. `((*, [*, *]), {'mask': *})`."""
    return repr(pytree.tree_unflatten([_Slot()] * spec.num_leaves, spec))


def unflatten_inputs(in_tree: str, arrays) -> tuple[tuple, dict]:
    """(args, kwargs) of a call with these input tensors (in traced order) and the traced
    non-tensor inputs: what flatten_inputs takes apart."""
    spec, constants = read_in_tree(in_tree)
    arrays = iter(arrays)
    return pytree.tree_unflatten([constants[i] if i in constants else next(arrays)
                                  for i in range(spec.num_leaves)], spec)


def unflatten_outputs(out_tree: str, arrays) -> object:
    """The model's own output structure (tuple, dict, ModelOutput...) around flat output arrays."""
    spec = read_out_tree(out_tree)
    arrays = list(arrays)
    if len(arrays) != spec.num_leaves:
        raise InputError(f"{len(arrays)} output arrays for an output structure of {spec.num_leaves}")
    return pytree.tree_unflatten(arrays, spec)


# --- the trees as a program file records them (metadata in_tree, out_tree) ---

@functools.lru_cache(maxsize=64)
def read_in_tree(in_tree: str) -> tuple[pytree.TreeSpec, dict[int, object]]:
    """(treespec of (args, kwargs), {leaf index: the value of each non-tensor input}) from a recorded in_tree."""
    record = json.loads(in_tree)
    spec = _treespec("in_tree", record["treespec"])
    return spec, {int(i): v for i, v in record["constants"].items()}


@functools.lru_cache(maxsize=64)
def read_out_tree(out_tree: str) -> pytree.TreeSpec:
    return _treespec("out_tree", out_tree)


def _treespec(key: str, text: str) -> pytree.TreeSpec:
    """The treespec, rebuilt and checked: a tree built on it flattens back to it (treespec_loads
    leaves a context that does not fit its container type to fail later).  A container type that no
    module imported so far registered (transformers' ModelOutputs, for `stagec run` of a zoo model) has
    its defining module imported, if installed, and the rebuild tried once more."""
    try:
        spec = _loads_importing(text)
        if pytree.tree_structure(pytree.tree_unflatten([0] * spec.num_leaves, spec)) != spec:
            raise ValueError("a tree built on it flattens to another structure")
        return spec
    except Exception as e:  # noqa: BLE001 - torch raises several types for a treespec it cannot rebuild
        hint = (" (a container type this process has not registered with torch.utils._pytree: import the module "
                "that defines it, e.g. transformers, first)") if "not registered" in str(e) else ""
        raise ProgramFormatError(f"header.metadata.{key}: {type(e).__name__}: {e}{hint}") from None


def _loads_importing(text: str) -> pytree.TreeSpec:
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError as e:
        found = re.search(r"Deserializing ([\w.]+)\.\w+ in pytree is not registered", str(e))
        if found is None or importlib.util.find_spec(found.group(1).split(".")[0]) is None:
            raise
        importlib.import_module(found.group(1))   # registering its container types is what importing it does
        return pytree.treespec_loads(text)


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


def trace_model(model, args, kwargs=None) -> TracedModel:
    """A torch.nn.Module through torch.export, a JAX function through make_jaxpr, an ExportedProgram
    (torch.export.load of a saved .pt2) as it is, core ATen decompositions applied."""
    if isinstance(model, torch.export.ExportedProgram):
        return trace_exported(exported(model), args, kwargs)
    if isinstance(model, torch.nn.Module):
        return trace_torch(model, args, kwargs)
    if callable(model):
        if kwargs:
            raise InputError("a JAX function is compiled with positional arrays only")
        return trace_jax(model, args)
    raise InputError(f"compile takes a torch.nn.Module or a JAX function, not {type(model).__name__}")


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
