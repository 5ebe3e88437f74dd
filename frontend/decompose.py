"""Core-ATen decomposition of an exported program in one trace: what
`ExportedProgram.run_decompositions(decompositions())` gives, at a third of its cost.

run_decompositions re-exports the program through AOTAutograd, which runs the whole graph twice
(once to collect aliasing metadata, once to trace) and recomputes the split of the decomposition
table on every call. Here the table is split once, and the graph is traced once by make_fx under
the same three things AOTAutograd's export applies: the table's CompositeImplicitAutograd
overrides, its Python decompositions, and export's functionalization. The result has the same ops,
node metadata (stack traces, module paths) and placeholder names. Where that single trace is not
known to be exact -- control flow, symbolic shapes, an input mutated in place -- the program goes
through run_decompositions.

Every private torch import of the frontend is here.
"""

from __future__ import annotations

import functools

import torch
import torch.utils._pytree as pytree
from torch._functorch._aot_autograd.functional_utils import has_data_mutation, has_metadata_mutation
from torch._guards import detect_fake_mode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.export._trace import _ignore_backend_decomps
from torch.export.exported_program import (
    _get_updated_module_call_graph,
    _override_composite_implicit_decomp,
    _split_decomp_table_to_cia_and_python_decomp,
)
from torch.export.graph_signature import ConstantArgument, ExportGraphSignature, OutputSpec, TensorArgument
from torch.fx.experimental.proxy_tensor import make_fx


@functools.cache
def decompositions() -> dict:
    """Core-ATen decompositions, except scaled_dot_product_attention: later stages see attention whole."""
    table = torch.export.default_decompositions()
    del table[torch.ops.aten.scaled_dot_product_attention.default]
    return table


@functools.cache
def _split_table() -> tuple[dict, dict]:
    """(CompositeImplicitAutograd op -> its override, Python decomposition table), as run_decompositions
    splits decompositions() -- once per process instead of once per call."""
    return _split_decomp_table_to_cia_and_python_decomp(dict(decompositions()))


class _InputMutated(Exception):
    """The graph mutates one of its inputs in place: the one-pass trace would drop that."""


def to_core_aten(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep` decomposed to core ATen (scaled_dot_product_attention kept whole)."""
    if not _one_pass_applies(ep):
        return ep.run_decompositions(decompositions())
    try:
        traced = _trace_decomposed(ep.graph_module)
    except _InputMutated:
        return ep.run_decompositions(decompositions())
    gm = _with_placeholders_of(ep.graph_module, traced)
    signature = _with_outputs_of(ep.graph_signature, gm)
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature, state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=_get_updated_module_call_graph(ep.graph_module, ep.graph_signature, gm, signature,
                                                         ep.module_call_graph),
        example_inputs=ep.example_inputs, constants=ep.constants)


def _one_pass_applies(ep: torch.export.ExportedProgram) -> bool:
    """Static shapes, no submodules (control flow), and inputs and outputs that are tensors or constants."""
    nodes = ep.graph.nodes
    return (not ep.range_constraints
            and all(n.op in ("placeholder", "call_function", "output") for n in nodes)
            and not any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in nodes)
            and all(isinstance(s.arg, (TensorArgument, ConstantArgument)) for s in ep.graph_signature.input_specs)
            and all(isinstance(s.arg, TensorArgument) for s in ep.graph_signature.output_specs))


def _tensor_placeholders(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]


def _trace_decomposed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The graph run once, op by op, under export's decompositions and functionalization; its
    placeholders are gm's tensor placeholders, in order (constant inputs are baked in)."""
    tensor_inputs = _tensor_placeholders(gm)
    constants = {n.name: n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder" and n not in tensor_inputs}

    def run(*tensors):
        values = iter(tensors)
        args = [constants[n.name] if n.name in constants else next(values)
                for n in gm.graph.nodes if n.op == "placeholder"]
        return torch.fx.Interpreter(gm).run(*args)

    cia_overrides, python_table = _split_table()
    fakes = [n.meta["val"] for n in tensor_inputs]
    # NOTE: preserve_node_meta makes each new node inherit the stack trace and module path of the
    # node it decomposes, as run_decompositions' nodes do (error messages and scope names use them).
    with (_override_composite_implicit_decomp(cia_overrides), torch._dispatch.python.enable_python_dispatcher(),
          _ignore_backend_decomps(), torch.fx.traceback.preserve_node_meta(), torch.no_grad(),
          detect_fake_mode(fakes)):
        traced = make_fx(_functionalized(run), decomposition_table=python_table)(*fakes)
    traced.graph.eliminate_dead_code()   # e.g. the unused statistics outputs of batch norm
    return traced


def _functionalized(fn):
    """fn with in-place ops and views replayed functionally (export's FunctionalTensorMode); raises
    _InputMutated where fn writes into an input, which needs run_decompositions' copy back."""
    def functional(*tensors):
        with FunctionalTensorMode(export=True):
            wrapped = [FunctionalTensor.to_functional(t) for t in tensors]
            outputs = fn(*wrapped)
            if any(has_data_mutation(w) or has_metadata_mutation(w, t, check_only_storage_mutation=False)
                   for w, t in zip(wrapped, tensors, strict=True)):
                raise _InputMutated
            return pytree.tree_map_only(FunctionalTensor, _unwrapped, outputs)
    return functional


def _unwrapped(t: FunctionalTensor) -> torch.Tensor:
    torch._sync(t)
    return torch._from_functional_tensor(t.elem)


def _with_placeholders_of(original: torch.fx.GraphModule, traced: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """traced's body behind original's placeholders (their names are what the graph signature names)."""
    graph = torch.fx.Graph()
    placeholders = {}
    for node in original.graph.nodes:
        if node.op == "placeholder":
            placeholder = placeholders[node] = graph.placeholder(node.name)
            # NOTE: fx renames a builtin's name ('input' -> 'input_1'); export names it as the forward's
            # argument and sets it directly, as here (torch._export.utils._assign_new_node_names)
            placeholder.name = placeholder.target = node.name
            placeholder.meta = dict(node.meta)
    traced_inputs = [n for n in traced.graph.nodes if n.op == "placeholder"]
    val_map = dict(zip(traced_inputs, [placeholders[n] for n in _tensor_placeholders(original)], strict=True))
    graph.output(graph.graph_copy(traced.graph, val_map))
    gm = torch.fx.GraphModule(traced, graph)
    gm.meta.update(original.meta)
    return gm


def _with_outputs_of(signature: ExportGraphSignature, gm: torch.fx.GraphModule) -> ExportGraphSignature:
    """signature with its outputs renamed to gm's output nodes."""
    outputs = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    specs = [OutputSpec(kind=s.kind, arg=TensorArgument(name=node.name), target=s.target)
             for s, node in zip(signature.output_specs, outputs, strict=True)]
    return ExportGraphSignature(input_specs=signature.input_specs, output_specs=specs)
