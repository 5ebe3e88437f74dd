"""Scaled dot-product attention, kept whole for the later stages.

The frontend leaves `aten.scaled_dot_product_attention` out of the decomposition table, and this
rule is one `jax.jit` function, so each attention is ONE equation of the traced jaxpr: primitive
`jit` (`pjit` in older JAX), `params["name"] == "scaled_dot_product_attention"`, `params["jaxpr"]`
a ClosedJaxpr. For q (..., L, E), k (..., S, E), v (..., S, Ev), B the batch axes (all but the last
two; B = [0, 1] for (batch, heads, L, E)) and r = rank - 1, the equation and its body are exactly:

    o = jit[name=scaled_dot_product_attention, jaxpr={ lambda [causal]; q k v [mask]. let
          s = dot_general[dimension_numbers=(([r], [r]), (B, B)), precision=HIGHEST] q k   # q @ k^T
          s = mul s <scale literal>                                          # 1/sqrt(E) unless given
          # boolean keep-mask (True = attend), or is_causal with `causal`, a constant lower-
          # triangular bool[L, S] held in the call's ClosedJaxpr consts:
          m = broadcast_in_dim mask; f = broadcast_in_dim -inf; s = select_n m f s
          # or an additive float mask:
          s = add s mask
          mx = reduce_max[axes=(r,)] s; mx = broadcast_in_dim mx; d = sub s mx; e = exp d
          z = reduce_sum[axes=(r,)] e; z = broadcast_in_dim z; p = div e z         # softmax over keys
          o = dot_general[dimension_numbers=(([r], [r-1]), (B, B)), precision=HIGHEST] p v  # p @ v
        in (o,) }] q k v [mask]

There is no mask operand without a mask (nor with is_causal). 16-bit q, k, v are converted to
float32 before the call and the result back after it (PyTorch computes attention in float32);
grouped-query attention (enable_gqa) repeats k and v across heads before the call, and batch
axes that broadcast (one key head for all query heads) are broadcast before it.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stagec.errors import UnsupportedOpError

from .registry import aten, register, widen
from .rules_norm import softmax

HIGHEST = lax.Precision.HIGHEST


@partial(jax.jit, static_argnames=("scale", "is_causal"))
def scaled_dot_product_attention(q, k, v, mask, *, scale: float, is_causal: bool):
    # NOTE: the interpreter traces with jit disabled (so jnp's own jitted helpers inline); this body
    # does the same, keeping one flat call equation for the lowering to match.
    with jax.disable_jit():
        r = q.ndim - 1
        batch = tuple(range(r - 1))
        s = lax.dot_general(q, k, (((r,), (r,)), (batch, batch)), precision=HIGHEST) * scale
        if is_causal:
            mask = np.tril(np.ones(s.shape[-2:], bool))
        if mask is not None and mask.dtype == jnp.bool_:
            s = jnp.where(mask, s, -jnp.inf)
        elif mask is not None:
            s = s + mask
        return lax.dot_general(softmax(s, r), v, (((r,), (r - 1,)), (batch, batch)), precision=HIGHEST)


@register(aten.scaled_dot_product_attention.default)
def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    if dropout_p:
        raise UnsupportedOpError(f"attention dropout (dropout_p={dropout_p}) at inference")
    if enable_gqa:
        k, v = (jnp.repeat(t, q.shape[-3] // t.shape[-3], axis=-3) for t in (k, v))
    # the batch axes broadcast (multi-query attention: Falcon's k and v have one head, q several)
    batch = jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (jnp.broadcast_to(t, batch + t.shape[-2:]) for t in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    with jax.disable_jit(False):
        return scaled_dot_product_attention(widen(q), widen(k), widen(v), attn_mask, scale=scale, is_causal=is_causal)
