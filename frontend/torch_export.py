"""torch.export -> core ATen -> a JAX function: export with one-line errors, rule checks that name
the model's source line, and the interpreter over the exported graph.

The exported graph is walked by one interpreter loop (env, read, write, table lookup); tracing that
loop with `jax.make_jaxpr` (trace.py) gives a ClosedJaxpr whose inputs are the flattened user
tensors and whose consts are the model's parameters and buffers.
"""

from __future__ import annotations

import contextlib
import difflib
import operator
import re
import traceback
import warnings
from pathlib import Path

import jax
import torch
from jax import lax

from stagec.errors import ExportError, UnsupportedOpError

from .aten import ATEN_RULES
from .decompose import to_core_aten
from .registry import SCATTER_INDEX_ARGS, jax_dtype, to_numpy

_NOT_THE_MODEL = (Path(torch.__file__).parent, Path(__file__).parent)   # torch's frames and ours
SUPPORTED_OPS_HINT = "stagec.frontend.supported_ops() (or `stagec ops MODEL`) lists the supported ops"
# (what the exporter's message says, the hint for it); the last is the fallback
EXPORT_HINTS = [
    ("data-dependent", "the model branches on tensor values (if/while on a tensor, .item()): express that with "
                       "torch.where, or torch.cond for whole branches"),
    ("not a known type", "the model returns an object torch.export cannot flatten: transformers' key/value caches "
                         "go with use_cache=False (in the config or the call); register other containers with "
                         "torch.utils._pytree.register_pytree_node"),
    ("", "the model must run eagerly on these example inputs and give one graph for them"),
]


def supported_ops() -> list[str]:
    return sorted({str(op) for op in ATEN_RULES})


def _in_model_code(path: str) -> bool:
    """Whether a frame is in a file outside torch and stagec's frontend (compared folder by folder: a
    package named torchvision or torch_geometric is the model's, not torch's); generated code
    (<string>, <eval_with_key.3>) has no source line to show."""
    return not path.startswith("<") and not any(Path(path).is_relative_to(folder) for folder in _NOT_THE_MODEL)


def user_frame(trace: str) -> str | None:
    """The innermost frame of a Python stack trace in the model's code ('file.py:12: code')."""
    # a frame's code line is absent where Python has no source (<string>, <frozen ...>)
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+(?:\n(?!\s*File ")\s*(.*))?', trace)
    user = [f for f in frames if _in_model_code(f[0])]
    if not (user or frames):
        return None
    path, line, code = (user or frames)[-1]
    return f"{path}:{line}: {code.strip()}".rstrip(": ")


def source_line(node: torch.fx.Node) -> str:
    """The model's own source line for an exported node ('file.py:12: code')."""
    return user_frame(node.meta.get("stack_trace") or "") or "<unknown source line>"


def in_training_mode(model: torch.nn.Module) -> bool:
    return any(m.training for m in model.modules())


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


def exported(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """A program someone exported (torch.export.load: `stagec compile model.pt2`) as `export` gives one:
    core ATen, static shapes.  It keeps the mode it was exported in."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ep = to_core_aten(ep)
    _check_static_shapes(ep)
    return ep


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> torch.export.ExportedProgram:
    """torch.export + core-ATen decompositions, in inference mode, with a one-line reason on failure."""
    with inference_mode(model), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # torch.export's own deprecation noise
        try:
            ep = torch.export.export(model, tuple(args), kwargs=kwargs or {})
        except Exception as e:  # noqa: BLE001 - the exporter raises many types; keep its reason
            raise ExportError(_export_failure(str(e), "".join(traceback.format_tb(e.__traceback__)))) from e
        ep = to_core_aten(ep)
    _check_static_shapes(ep)
    return ep


def _export_failure(message: str, stack: str) -> str:
    """The exporter's reason in one line, where in the model it failed, and a hint."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    reason = lines[0] if lines else "no reason given"
    where = user_frame(message) or user_frame(stack)   # torch quotes the model's line for guards it cannot decide
    hint = next(h for pattern, h in EXPORT_HINTS if pattern in message)
    return f"torch.export failed: {reason}{f' (at {where})' if where else ''}; hint: {hint}"


def _check_static_shapes(ep: torch.export.ExportedProgram) -> None:
    for node in ep.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and not all(isinstance(n, int) for n in value.shape):
            raise ExportError(f"the shape of {node.target}'s result depends on tensor values {tuple(value.shape)}, "
                              f"at {source_line(node)}; stagec compiles static shapes (hint: keep every element "
                              "and mask it, e.g. torch.where(mask, x, 0), instead of x[mask] or nonzero)")


def aten_calls(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The graph's ATen op calls (not the getitems that unpack multi-output ops)."""
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def nearest_supported(op) -> list[str]:
    """The supported ops whose names are closest to `op`'s (aten.cumprod -> aten.prod), by difflib."""
    if not isinstance(op, torch._ops.OpOverload):
        return []
    names = {o._opname: str(o) for o in ATEN_RULES}
    near = difflib.get_close_matches(op._opname, list(names), n=3, cutoff=0.6)
    return sorted({names[n] for n in near})


def check_rules(ep: torch.export.ExportedProgram) -> None:
    """Every ATen op of the graph has a rule, or one error lists each missing op once, where it is used;
    then every scatter's indices are constants (_check_scatter_indices)."""
    missing = {}
    for node in aten_calls(ep):
        if node.target not in ATEN_RULES:
            missing.setdefault(node.target, node)
    if missing:
        lines = []
        for op, node in missing.items():
            near = nearest_supported(op)
            lines.append(f"ATen op {op} has no stagec rule, at {source_line(node)}"
                         + (f"; nearest supported: {', '.join(near)}" if near else ""))
        raise UnsupportedOpError("\n".join(lines + [SUPPORTED_OPS_HINT]))
    _check_scatter_indices(ep)


def _input_dependent(ep: torch.export.ExportedProgram) -> set[torch.fx.Node]:
    """The nodes whose values depend on the model's (user) inputs, not only on its weights and constants."""
    user_inputs = {spec.arg.name for spec in ep.graph_signature.input_specs
                   if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT}
    dependent = set()
    for node in ep.graph.nodes:
        if node.name in user_inputs or any(n in dependent for n in node.all_input_nodes):
            dependent.add(node)
    return dependent


def _check_scatter_indices(ep: torch.export.ExportedProgram) -> None:
    """A scatter's integer indices are constants of the model (the lowering gathers with a constant
    index map); indices computed from its inputs are an error that names the op and the line."""
    dependent = None
    for node in aten_calls(ep):
        if node.target not in SCATTER_INDEX_ARGS:
            continue
        dependent = _input_dependent(ep) if dependent is None else dependent
        arg = node.args[SCATTER_INDEX_ARGS[node.target]]
        indices = [i for i in (arg if isinstance(arg, (list, tuple)) else [arg])
                   if isinstance(i, torch.fx.Node) and i.meta["val"].dtype != torch.bool]
        if any(i in dependent for i in indices):
            raise UnsupportedOpError(
                f"ATen op {node.target} at {source_line(node)}: its indices are computed from the model's inputs; "
                "stagec compiles indexed assignment (index_put, scatter) with constant indices only (hint: "
                "express a data-dependent update as a select, e.g. torch.where(positions == index, value, x))")


def scope_name(node: torch.fx.Node) -> str:
    """The module path a node comes from ('layer1.0.conv1'), or the node's name at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return path.replace("L['self'].", "") or node.name


def _conform(node: torch.fx.Node, value, recorded):
    """A rule's result in the dtype torch.export recorded (torch's type promotion is the reference);
    a shape that differs from the record is a bug in the rule."""
    if value is None or not isinstance(recorded, torch.Tensor):
        return value
    if tuple(value.shape) != tuple(recorded.shape):
        raise RuntimeError(f"stagec bug: the rule for {node.target} gave shape {tuple(value.shape)}, "
                           f"torch.export recorded {tuple(recorded.shape)}, at {source_line(node)}")
    dtype = jax_dtype(recorded.dtype)
    return value if value.dtype == dtype else lax.convert_element_type(value, dtype)


def _call_rule(node: torch.fx.Node, args, kwargs):
    rule = ATEN_RULES[node.target]
    if getattr(rule, "takes_layout", False):
        base = node.args[0].meta["val"]
        kwargs = {**kwargs, "layout": (tuple(base.stride()), base.storage_offset())}
    try:
        with jax.named_scope(scope_name(node)):
            result = rule(*args, **kwargs)
            recorded = node.meta.get("val")
            if isinstance(result, tuple):
                return tuple(_conform(node, v, r) for v, r in zip(result, recorded, strict=True))
            return _conform(node, result, recorded)
    except (NotImplementedError, TypeError, ValueError, IndexError) as e:
        raise UnsupportedOpError(f"ATen op {node.target} at {source_line(node)}: {e}") from e


def _unpack(node: torch.fx.Node, results, index: int):
    """getitem on a multi-output op; an output stagec does not compute may be unpacked but not read."""
    if results[index] is None and node.users:
        producer = node.args[0]
        raise UnsupportedOpError(f"output {index} of ATen op {producer.target} (e.g. max-pool indices) is not "
                                 f"computed by stagec, at {source_line(producer)}")
    return results[index]


def interpret(ep: torch.export.ExportedProgram):
    """The exported graph as a function of the flattened user tensors (for jax tracing)."""
    state = {**ep.state_dict, **ep.constants}
    inputs = {}    # placeholder name -> lifted weight / constant user input; tensor user inputs come in order
    for spec in ep.graph_signature.input_specs:
        if spec.target is not None and spec.target in state:
            inputs[spec.arg.name] = to_numpy(state[spec.target])
        elif isinstance(spec.arg, torch.export.graph_signature.ConstantArgument):
            inputs[spec.arg.name] = spec.arg.value
    nodes = list(ep.graph.nodes)

    def fn(*user_tensors):
        env = {}
        tensors = iter(user_tensors)
        for node in nodes:
            if node.op == "placeholder":
                env[node.name] = inputs[node.name] if node.name in inputs else next(tensors)
            elif node.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: env[n.name])
                if node.target is operator.getitem:
                    env[node.name] = _unpack(node, *args)
                else:
                    env[node.name] = _call_rule(node, args, kwargs)
            elif node.op == "output":
                outputs = node.args[0]
                constants = [o for o in outputs if not isinstance(o, torch.fx.Node)]
                if constants:
                    raise UnsupportedOpError(f"the model returns non-tensor values {constants}; return tensors only")
                return [env[o.name] for o in outputs]
        raise AssertionError("exported graph has no output node")
    return fn
