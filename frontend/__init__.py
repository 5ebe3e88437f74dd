"""PyTorch and JAX -> ClosedJaxpr (docs/architecture.md, the frontend stage).

torch.export and core-ATen decompositions, then one small JAX rule per ATen op (aten.py lists the
families); scaled-dot-product attention stays one call. The result keeps the model's input and
output structure beside the jaxpr:

    >>> import torch
    >>> from stagec.frontend import coverage, trace_torch
    >>> model, x = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.GELU()).eval(), torch.randn(3, 4)
    >>> traced = trace_torch(model, (x,))      # .closed is the ClosedJaxpr over the flattened tensors
    >>> traced(x).shape                         # evaluated by JAX, in the model's own output structure
    (3, 2)
    >>> [row.op for row in coverage(model, (x,))]
    ['aten.addmm.default', 'aten.gelu.default', 'aten.permute.default']
"""

from .coverage import OpCount, coverage, format_coverage
from .torch_export import ExportError, UnsupportedOpError, supported_ops
from .trace import (
    TracedModel,
    flatten_inputs,
    from_jax,
    from_torch,
    trace_exported,
    trace_jax,
    trace_model,
    trace_torch,
    unflatten_outputs,
)

__all__ = ["ExportError", "OpCount", "TracedModel", "UnsupportedOpError", "coverage", "flatten_inputs",
           "format_coverage", "from_jax", "from_torch", "supported_ops", "trace_exported", "trace_jax",
           "trace_model", "trace_torch", "unflatten_outputs"]
