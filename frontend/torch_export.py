"""PyTorch -> ClosedJaxpr: torch.export, core-ATen decompositions, then the ATen rule table.

The exported graph is walked by one interpreter loop (env, read, write, table
lookup); tracing that loop with `jax.make_jaxpr` gives a ClosedJaxpr whose
inputs are the flattened user tensors and whose consts are the model's
parameters and buffers.
"""

from __future__ import annotations

import contextlib
import difflib
import operator
import os
import re
import warnings

import jax
import numpy as np
import torch
from jax.extend.core import ClosedJaxpr

from .aten import ATEN_RULES

_TORCH_DIR = os.path.dirname(torch.__file__)
SUPPORTED_OPS_HINT = "stagec.frontend.supported_ops() (or `stagec ops`) lists the supported ops"


class UnsupportedOpError(NotImplementedError):
    """An ATen op of the model has no stagec rule (or a rule that rejects its arguments)."""


class ExportError(RuntimeError):
    """torch.export could not capture the model."""


def supported_ops() -> list[str]:
    return sorted({str(op) for op in ATEN_RULES})


def source_line(node: torch.fx.Node) -> str:
    """The model's own source line for an exported node ('file.py:12: code'), or '<unknown>'."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    if not (user or frames):
        return "<unknown source line>"
    path, line, code = (user or frames)[-1]
    return f"{path}:{line}: {code.strip()}"


@contextlib.contextmanager
def inference_mode(model: torch.nn.Module):
    """Trace with inference semantics (eval) and give the user's module back as it was."""
    flags = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in flags:
            m.train(training)


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> torch.export.ExportedProgram:
    """torch.export + run_decompositions(), in inference mode, with a one-line reason on failure."""
    with inference_mode(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # torch.export's own deprecation noise
        try:
            ep = torch.export.export(model, tuple(args), kwargs=kwargs or {})
        except Exception as e:  # noqa: BLE001 - the exporter raises many types; keep its reason
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ExportError(f"torch.export failed: {first} (hint: models with data-dependent control flow "
                              "or dynamic shapes need torch.cond / fixed shapes to export)") from e
        return ep.run_decompositions()


def _check_rules(ep: torch.export.ExportedProgram) -> None:
    names = supported_ops()
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem and node.target not in ATEN_RULES:
            near = difflib.get_close_matches(str(node.target), names, n=3, cutoff=0.5)
            hint = f"; nearest supported: {', '.join(near)}" if near else ""
            raise UnsupportedOpError(f"ATen op {node.target} has no stagec rule, at {source_line(node)}{hint}. "
                                     f"{SUPPORTED_OPS_HINT}")


def scope_name(node: torch.fx.Node) -> str:
    """The module path a node comes from ('layer1.0.conv1'), or the node's name at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return path.replace("L['self'].", "") or node.name


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


def interpret(ep: torch.export.ExportedProgram):
    """The exported graph as a function of the flattened user inputs (for jax tracing)."""
    sig = ep.graph_signature
    state = {**ep.state_dict, **ep.constants}
    lifted = {}
    for spec in sig.input_specs:
        if spec.target is not None and spec.target in state:
            lifted[spec.arg.name] = _to_numpy(state[spec.target])
    nodes = list(ep.graph.nodes)

    def fn(*user_inputs):
        env = {}
        users = iter(user_inputs)
        for node in nodes:
            if node.op == "placeholder":
                env[node.name] = lifted[node.name] if node.name in lifted else next(users)
            elif node.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
                if node.target is operator.getitem:
                    env[node.name] = args[0][args[1]]
                    continue
                try:
                    with jax.named_scope(scope_name(node)):
                        env[node.name] = ATEN_RULES[node.target](*args, **kwargs)
                except (NotImplementedError, TypeError, ValueError) as e:
                    raise UnsupportedOpError(f"ATen op {node.target} at {source_line(node)}: {e}") from e
            elif node.op == "output":
                return [env[a.name] for a in node.args[0]]
        raise AssertionError("exported graph has no output node")
    return fn


def from_torch(model: torch.nn.Module, example_args, example_kwargs=None) -> ClosedJaxpr:
    """Trace a PyTorch model into a ClosedJaxpr over its flattened input tensors.

    >>> import torch
    >>> cj = from_torch(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> [v.aval.shape for v in cj.jaxpr.invars]
    [(3, 4)]
    """
    args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
    ep = export(model, args, example_kwargs)
    _check_rules(ep)
    flat, _ = torch.utils._pytree.tree_flatten((args, example_kwargs or {}))
    tensors = [_to_numpy(t) for t in flat if isinstance(t, torch.Tensor)]
    return jax.make_jaxpr(interpret(ep))(*tensors)


def from_jax(fn, example_args) -> ClosedJaxpr:
    """Trace a plain JAX function (the compiler is JAX-hosted) into a ClosedJaxpr."""
    args = tuple(example_args) if isinstance(example_args, (tuple, list)) else (example_args,)
    return jax.make_jaxpr(lambda *xs: jax.tree_util.tree_leaves(fn(*xs)))(*[np.asarray(a) for a in args])
