"""PyTorch and JAX -> ClosedJaxpr (DESIGN.md, stage 1)."""

from .torch_export import ExportError, UnsupportedOpError, from_jax, from_torch, supported_ops

__all__ = ["ExportError", "UnsupportedOpError", "from_jax", "from_torch", "supported_ops"]
