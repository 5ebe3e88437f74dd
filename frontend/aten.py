"""The ATen rule table, assembled: each family module registers its rules into `ATEN_RULES` on import.

Families: elementwise math, comparisons, logic, casts (rules_elementwise); activations
(rules_activation); reductions (rules_reduce); matmul and convolution (rules_linalg); normalization
and softmax (rules_norm); pooling (rules_pool); resizing (rules_resize); data movement
(rules_movement); views by strides (rules_strided); indexing (rules_index); indexed assignment
(rules_scatter); creation (rules_creation); attention (rules_attention).
"""

from . import (  # noqa: F401 - imported for their registrations
    rules_activation,
    rules_attention,
    rules_creation,
    rules_elementwise,
    rules_index,
    rules_linalg,
    rules_movement,
    rules_norm,
    rules_pool,
    rules_reduce,
    rules_resize,
    rules_scatter,
    rules_strided,
)
from .registry import ATEN_RULES

__all__ = ["ATEN_RULES"]
