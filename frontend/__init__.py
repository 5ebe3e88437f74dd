"""PyTorch and JAX -> ClosedJaxpr (DESIGN.md, stage 1)."""

from .coverage import OpCount, coverage, format_coverage
from .torch_export import ExportError, UnsupportedOpError, supported_ops
from .trace import TracedModel, flatten_inputs, from_jax, from_torch, trace_exported, trace_torch, unflatten_outputs

__all__ = ["ExportError", "OpCount", "TracedModel", "UnsupportedOpError", "coverage", "flatten_inputs",
           "format_coverage", "from_jax", "from_torch", "supported_ops", "trace_exported", "trace_torch",
           "unflatten_outputs"]
