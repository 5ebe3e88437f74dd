"""The ATen rule table and what its rules share: dtype and axis conventions.

A rule takes the op's arguments as the exported graph holds them (tensors as JAX arrays, everything
else as Python values) and returns a JAX array, or a tuple for multi-output ops with None for an
output stagec does not compute. The interpreter casts each result to the dtype torch.export
recorded for it, so rules need not re-implement PyTorch's type promotion.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
import torch

from stagec.rule_tables import registrar

aten = torch.ops.aten
ATEN_RULES: dict[object, Callable] = {}
# Scatter ops -> the position of their index argument, whose integer tensors must not depend on the
# model's inputs: the lowering runs a scatter as gathers with a constant index map (rules_scatter.py).
SCATTER_INDEX_ARGS: dict[object, int] = {}

# JAX runs with x64 off (as on an accelerator): 64-bit torch types become their 32-bit JAX types.
_JAX_DTYPES = {
    torch.float32: jnp.float32, torch.float64: jnp.float32, torch.bfloat16: jnp.bfloat16,
    torch.float16: jnp.float16, torch.int64: jnp.int32, torch.int32: jnp.int32, torch.int16: jnp.int16,
    torch.int8: jnp.int8, torch.uint8: jnp.uint8, torch.bool: jnp.bool_,
}


def to_numpy(x) -> np.ndarray:
    """A tensor or array as the numpy array JAX takes: 64-bit types narrowed to 32 bits (an int64
    beyond int32's range is an error, not a wrap), bfloat16 kept bit-exact (ml_dtypes)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous()
        x = x.view(torch.int16).numpy().view(jnp.bfloat16) if x.dtype == torch.bfloat16 else x.numpy()
    array = np.asarray(x)
    narrow = {np.dtype(np.int64): np.int32, np.dtype(np.float64): np.float32}.get(array.dtype)
    if narrow is None:
        return array
    limits = np.iinfo(np.int32)
    if narrow is np.int32 and array.size and (array.min() < limits.min or array.max() > limits.max):
        raise ValueError(f"an int64 tensor of shape {array.shape} holds values beyond int32's range "
                         "(JAX runs without x64)")
    return array.astype(narrow)


register = registrar(ATEN_RULES)


def takes_layout(rule: Callable) -> Callable:
    """Mark a rule that reads its first argument's memory layout (as_strided indexes storage): the
    interpreter passes layout=(strides, storage offset), as torch.export recorded them."""
    rule.takes_layout = True
    return rule


def register_table(table: dict) -> None:
    """Register a family of ops whose rules are plain JAX functions ({op: fn})."""
    ATEN_RULES.update(table)


def jax_dtype(dtype: torch.dtype | None):
    """The JAX dtype that stands for a torch dtype (None stays None: 'keep the input's')."""
    if dtype is None:
        return None
    if dtype not in _JAX_DTYPES:
        raise NotImplementedError(f"dtype {dtype} is not supported (supported: {sorted(map(str, _JAX_DTYPES))})")
    return np.dtype(_JAX_DTYPES[dtype])


def axis(dim: int, rank: int) -> int:
    """A torch dim (possibly negative) as a non-negative axis; a 0-d tensor's dim 0/-1 is axis 0."""
    return dim % rank if rank else 0


def axes(dims, rank: int) -> tuple[int, ...]:
    """Torch's reduction dims (None or [] meaning all) as a tuple of non-negative axes."""
    if dims is None or (not isinstance(dims, int) and len(dims) == 0):
        return tuple(range(rank))
    return tuple(sorted({axis(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}))


def widen(x):
    """16-bit floats as float32: PyTorch computes norms, softmax and attention of 16-bit tensors in
    float32 internally (its accumulation type), and the interpreter rounds the result back."""
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
