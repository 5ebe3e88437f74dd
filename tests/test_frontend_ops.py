"""Every ATen rule against PyTorch eager, family by family, on random inputs with edge shapes
(size-1 dims, odd sizes, negative dims). A family is one model returning a dict of named results,
so one export covers many rules and a mismatch names the result that differs."""

import functools
import operator
import zlib

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import evaluate, rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.extend.core import jaxpr_as_fun

from stagec.frontend import trace_exported, trace_torch
from stagec.frontend.aten import ATEN_RULES
from stagec.frontend.registry import jax_dtype
from stagec.frontend.torch_export import aten_calls, export

gen = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(dtype)


def uniform(lo, hi, *shape):
    return lo + (hi - lo) * torch.rand(*shape, generator=gen)


def ints(lo, hi, *shape):
    return torch.randint(lo, hi, shape, generator=gen)


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def assert_matches(fn, *inputs, tol=1e-5, traced=None):
    """fn traced by stagec and evaluated by JAX equals PyTorch eager: values within `tol` relative
    error (exact for integers and booleans) and dtypes as JAX stands for torch's."""
    out = evaluate(traced or trace_torch(Fn(fn), inputs), inputs)
    ref = fn(*inputs)
    if isinstance(ref, torch.Tensor):
        out, ref = {"result": out}, {"result": ref}
    assert set(out) == set(ref)
    for name, expected in ref.items():
        got = np.asarray(out[name])
        assert got.dtype == jax_dtype(expected.dtype), name
        assert got.shape == tuple(expected.shape), name
        expected = expected.float().numpy() if expected.dtype == torch.bfloat16 else expected.numpy()
        if np.issubdtype(got.dtype, np.floating) or got.dtype == jax.numpy.bfloat16:
            got = got.astype(np.float32)
            assert np.array_equal(np.isnan(got), np.isnan(expected)), name
            ok = ~np.isnan(expected)
            assert (got[ok] == expected[ok]).all() or rel_err(got[ok], expected[ok]) < tol, \
                f"{name}: rel err {rel_err(got[ok], expected[ok]):.2e}"
        else:
            np.testing.assert_array_equal(got, expected, err_msg=name)


# --- one model per family: (function, inputs) ----------------------------------------------------

def unary_math(x, y):   # x in (0.1, 0.9): inside every function's domain; y: any sign
    fns = {"exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "log2": torch.log2,
           "log10": torch.log10, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
           "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
           "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh,
           "atanh": torch.atanh, "erf": torch.erf, "sigmoid": torch.sigmoid}
    out = {name: fn(x) for name, fn in fns.items()}
    out |= {"acosh": torch.acosh(1 + x), "abs": y.abs(), "neg": -y, "sign": y.sign(), "floor": y.floor(),
            "ceil": y.ceil(), "round": (y * 4).round(), "trunc": y.trunc()}
    return out


def unary_special(x, i):   # x holds nan and inf; i is an int tensor
    return {"isnan": x.isnan(), "isinf": x.isinf(), "not": ~(i > 0), "logical_not": torch.logical_not(x),
            "bitwise_not": ~i, "exp_of_int": torch.exp(i), "sqrt_of_int": i.abs().sqrt(), "abs_int": i.abs(),
            "neg_int": -i, "sign_int": i.sign(), "recip_int": torch.reciprocal(i + 10)}


def binary(a, b, i, j):   # a (3,1,4) and b (1,5,4) broadcast; i, j int tensors (j nonzero)
    return {"add": a + b, "add_alpha": torch.add(a, b, alpha=2), "sub_alpha": torch.sub(a, b, alpha=0.5),
            "rsub": 1 - a, "mul": a * b, "mul_scalar": a * 3, "div": a / b, "div_scalar": a / 4,
            "floordiv": torch.div(a, b, rounding_mode="floor"), "truncdiv": torch.div(a, b, rounding_mode="trunc"),
            "remainder": a % b, "remainder_scalar": a % 0.3, "fmod": torch.fmod(a, b),
            "fmod_scalar": torch.fmod(a, 0.3),
            "pow": a.abs() ** b, "square": a ** 2, "pow_float_int": a ** 3.0, "sqrt_pow": a.abs() ** 0.5,
            "rpow": 2 ** a, "maximum": torch.maximum(a, b), "minimum": torch.minimum(a, b), "atan2": torch.atan2(a, b),
            "int_floordiv": i // j, "int_truncdiv": torch.div(i, j, rounding_mode="trunc"), "int_truediv": i / j,
            "int_mod": i % j, "int_fmod": torch.fmod(i, j), "int_mul_float": i * 0.5, "int_pow": i ** 2,
            "and": i & j, "or": i | j, "xor": i ^ j, "and_scalar": i & 3,
            "or_scalar": i | 3, "xor_scalar": i ^ 3, "hypot": torch.hypot(a, b),
            "add_scalar": torch.ops.aten.add.Scalar(a, 2.5), "sub_scalar": torch.ops.aten.sub.Scalar(a, 2.5, alpha=2),
            "mul_scalar_op": torch.ops.aten.mul.Scalar(a, 3), "div_scalar_op": torch.ops.aten.div.Scalar(a, 4),
            "div_scalar_floor": torch.ops.aten.div.Scalar_mode(a, 0.3, rounding_mode="floor")}


def compare_and_select(a, b, i):
    out = {f"{name}_{kind}": getattr(operator, name)(a, other) for name in ("eq", "ne", "lt", "le", "gt", "ge")
           for kind, other in (("tensor", b), ("scalar", 0.1))}
    masks = (a > 0, b > 0)
    return out | {"logical_and": torch.logical_and(*masks), "logical_or": torch.logical_or(*masks),
                  "logical_xor": torch.logical_xor(*masks), "bool_and": masks[0] & masks[1],
                  "where": torch.where(a > b, a, b), "where_scalar": torch.where(a > 0, a, 0.0),
                  "masked_fill": a.masked_fill(b > 0, -1.0), "clamp": a.clamp(-0.5, 0.5), "clamp_min": a.clamp(min=0),
                  "clamp_tensor": torch.clamp(a, b - 1, b + 1), "clamp_int": i.clamp(-3, 3),
                  "eq_int": i == 2}


def casts(x, i):
    return {"bf16": x.to(torch.bfloat16), "f16": x.half(), "int": (x * 10).int(), "long": (x * 10).long(),
            "int8": (x * 10).to(torch.int8), "bool": x.bool(), "float_of_int": i.float(), "bool_of_int": i.bool(),
            "byte": i.abs().to(torch.uint8), "f64_to_f32": x.double().float(), "bf16_roundtrip": x.bfloat16().float()}


def activations(x):
    return {"relu": F.relu(x), "relu6": F.relu6(x), "hardtanh": F.hardtanh(x, -2.0, 2.0),
            "leaky_relu": F.leaky_relu(x, 0.1), "elu": F.elu(x, alpha=0.7), "selu": F.selu(x), "gelu": F.gelu(x),
            "gelu_tanh": F.gelu(x, approximate="tanh"), "silu": F.silu(x), "hardswish": F.hardswish(x),
            "hardsigmoid": F.hardsigmoid(x), "softplus": F.softplus(x), "softplus_beta": F.softplus(x, beta=2.0),
            "mish": F.mish(x), "sigmoid": torch.sigmoid(x), "tanh": torch.tanh(x)}


def reductions(x, mask):
    values, indices = x.max(dim=1)
    min_values, min_indices = x.min(dim=-1, keepdim=True)
    return {"sum": x.sum((0, 2)), "sum_all": x.sum(), "sum_keepdim": x.sum(-1, keepdim=True),
            "sum_bool": mask.sum(1), "sum_to_float": x.sum(1, dtype=torch.float32), "mean": x.mean(-2),
            "mean_all": x.mean(), "prod": x.prod(1), "prod_all": x.prod(), "amax": x.amax((1, 2)),
            "amin": x.amin(-1), "max_values": values, "max_indices": indices, "min_values": min_values,
            "min_indices": min_indices, "max_all": x.max(), "min_all": x.min(), "argmax": x.argmax(1),
            "argmax_all": x.argmax(), "argmin_keepdim": x.argmin(-1, keepdim=True), "var": x.var(1),
            "var_biased": x.var((0, 2), unbiased=False), "std": x.std(-1), "var_mean": torch.var_mean(x, 1)[0],
            "var_mean_mean": torch.var_mean(x, (0, 2), correction=0)[1], "any": mask.any(1), "any_all": mask.any(),
            "all": mask.all(-1), "all_all": mask.all(), "cumsum": x.cumsum(1), "cumsum_int": mask.cumsum(-1),
            "norm": torch.linalg.vector_norm(x, dim=-1), "norm_inf": torch.linalg.vector_norm(x, ord=float("inf")),
            "normalize": F.normalize(x, dim=1), "logsumexp": torch.logsumexp(x, 1)}


def matmuls(a, b, bias, batch_a, batch_b):
    return {"mm": a @ b, "addmm": torch.addmm(bias, a, b), "addmm_scaled": torch.addmm(bias, a, b, beta=0.5, alpha=2),
            "bmm": torch.bmm(batch_a, batch_b),
            "baddbmm": torch.baddbmm(batch_a @ batch_b, batch_a, batch_b, alpha=0.5),
            "linear": F.linear(batch_a, b.T, bias), "linear_nobias": F.linear(batch_a, b.T),
            "matmul_broadcast": batch_a @ b, "einsum": torch.einsum("bij,bjk->bik", batch_a, batch_b),
            "vector": a @ b[:, 0]}


def normalizations(x, weight, bias, mean, var, seq):
    return {"batch_norm": F.batch_norm(x, mean, var, weight, bias, training=False, eps=1e-3),
            "batch_norm_plain": F.batch_norm(x, mean, var, training=False),
            "group_norm": F.group_norm(x, 2, weight, bias), "group_norm_plain": F.group_norm(x, 4),
            "layer_norm": F.layer_norm(seq, (7,), eps=1e-6), "instance_norm": F.instance_norm(x, eps=1e-3),
            "instance_norm_affine": F.instance_norm(x, weight=weight, bias=bias),
            "batch_norm_batch_statistics": F.batch_norm(x, None, None, weight, bias, training=True),
            "layer_norm_2d": F.layer_norm(seq, (5, 7)), "softmax": F.softmax(seq, -1), "softmax_0": F.softmax(seq, 0),
            "log_softmax": F.log_softmax(seq, 1)}


def pooling(x, seq):
    return {"max": F.max_pool2d(x, 3, 2, 1), "max_ceil": F.max_pool2d(x, 2, ceil_mode=True),
            "max_dilated": F.max_pool2d(x, 2, 1, dilation=2), "max_rect": F.max_pool2d(x, (1, 3), (2, 1)),
            "avg": F.avg_pool2d(x, 2), "avg_pad": F.avg_pool2d(x, 3, 2, 1),
            "avg_pad_excluded": F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
            "avg_ceil": F.avg_pool2d(x, 2, ceil_mode=True), "avg_ceil_pad": F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
            "avg_divisor": F.avg_pool2d(x, 2, divisor_override=3),
            "avg_global_ceil": F.avg_pool2d(x, 64, ceil_mode=True),   # EfficientNet's pooler
            "adaptive": F.adaptive_avg_pool2d(x, 1), "adaptive_uneven": F.adaptive_avg_pool2d(x, (3, 2)),
            "adaptive_larger": F.adaptive_avg_pool2d(x, (9, 11)), "adaptive_keep": F.adaptive_avg_pool2d(x, (None, 4)),
            "adaptive_max": F.adaptive_max_pool2d(x, 1), "adaptive_max_uneven": F.adaptive_max_pool2d(x, (3, 4)),
            "adaptive_max_even": F.adaptive_max_pool2d(x, (7, 3)), "adaptive_max_larger": F.adaptive_max_pool2d(x, 10),
            "max_1d": F.max_pool1d(seq, 2), "avg_1d": F.avg_pool1d(seq, 3, 2),
            "adaptive_1d": F.adaptive_avg_pool1d(seq, 3), "adaptive_max_1d": F.adaptive_max_pool1d(seq, 4)}


def resizing(x, seq):
    return {"nearest_2x": F.interpolate(x, scale_factor=2), "nearest_size": F.interpolate(x, size=(4, 11)),
            "nearest_1_5x": F.interpolate(x, scale_factor=1.5),
            "bilinear": F.interpolate(x, size=(5, 11), mode="bilinear"),
            "bilinear_2x": F.interpolate(x, scale_factor=2, mode="bilinear"),
            "bilinear_down": F.interpolate(x, size=(2, 3), mode="bilinear"),
            "bilinear_corners": F.interpolate(x, size=(5, 11), mode="bilinear", align_corners=True),
            "nearest_1d": F.interpolate(seq, scale_factor=2), "linear_1d": F.interpolate(seq, size=9, mode="linear")}


def movement(x, y):   # x (2, 3, 5, 1), y (4, 6)
    first, second = torch.split(x, [1, 2], 1)
    return {"view": x.view(6, -1), "flatten": x.flatten(1), "permute": x.permute(0, -1, 2, 1),
            "transpose": y.t(), "movedim": x.movedim(1, -1), "expand": x.expand(4, 2, 3, 5, 7),
            "expand_keep": x.expand(-1, -1, -1, 3), "slice": x[:, 1:, ::2], "slice_negative": x[:, :, -3:-1],
            "select": x[:, -1], "select_last": x[..., 0], "squeeze": x.squeeze(-1), "squeeze_all": x[:1].squeeze(),
            "unsqueeze": y.unsqueeze(-1), "cat": torch.cat([y, y * 2], -1), "stack": torch.stack([y, -y], 1),
            "split_first": first, "split_second": second, "chunk": y.chunk(3, 1)[2],
            "unbind": y.unbind(0)[3], "flip": x.flip(1, 2), "roll": y.roll(2, 1), "roll_2d": y.roll((1, -2), (0, 1)),
            "pad": F.pad(x, (1, 2, 0, 1), value=0.5), "crop": F.pad(y, (-1, -2)),
            "pad_reflect": F.pad(y[None], (2, 1), "reflect"),
            "unfold_patches": y.unfold(1, 2, 2), "unfold_overlapping": y.unfold(0, 3, 1), "repeat": y.repeat(2, 1, 3),
            "narrow": y.narrow(1, 2, 3), "narrow_copy": y.narrow_copy(1, 1, 4),
            "pixel_shuffle": F.pixel_shuffle(y.reshape(1, 4, 2, 3), 2),
            "tril": torch.tril(y), "clone": y.clone(), "contiguous": y.t().contiguous(), "im2col": F.unfold(x, (2, 1))}


def indexing(x, table, idx, ids):   # x (3, 5, 4); idx int64 values in [-2, 3); ids in [0, 10)
    return {"index": x[:, idx.abs()], "index_negative": x[idx], "index_2d": x[idx.abs()[:, None], idx.abs()],
            "index_separated": x[idx, :, idx.abs()], "index_select": torch.index_select(x, 1, idx.abs()),
            "gather": torch.gather(x, 2, ids[:3, :4, None] % 4),
            "gather_smaller": torch.gather(x, 1, ids[:2, :3, None] % 5),
            "take_along": torch.take_along_dim(x, x.argmax(1, keepdim=True), 1),
            "embedding": F.embedding(ids, table), "embedding_padding": F.embedding(ids, table, padding_idx=0)}


def indexed_assignment(x, t, src):   # x (2, 3, 7, 9), t (2, 3, 8), src (3, 9); indices are constants
    rows, idx = torch.tensor([0, 2]), torch.tensor([[0, 1, 2], [2, 0, 1]])
    reduce_idx = torch.tensor([[0, 1, 1], [2, 2, 2], [0, 0, 5]])   # repeated targets, one element untouched

    def assigned(base, where, value):
        y = base.clone()
        y[where] = value
        return y
    out = {"index_put": assigned(x, (slice(None), rows), 0.0), "index_put_rows": assigned(src, rows, x[0, 0, :2]),
           "index_put_2d": assigned(x[0], (rows, torch.tensor([1, -1])), src[0, :2, None]),
           "index_put_accumulate": src.index_put((torch.tensor([1, 1, 2, 1]),), x[0, 0, :4], accumulate=True),
           "mask_fill": assigned(x, x < 0, 0.5), "mask_fill_rows": assigned(x, (slice(None), x[0, :, 0, 0] > 0), -1.0),
           "slice_assign": assigned(t, (slice(None), slice(None), slice(1, 3)), 5.0),
           "strided_slice_assign": assigned(t, (slice(None), slice(None), slice(1, 6, 2)), t[:, :, :3] * 2),
           "select_assign": assigned(t, (slice(None), 1), t[:, 0]),
           "select_scatter": torch.select_scatter(t, t[:, 0] * 2, 1, -1),
           "slice_scatter": torch.slice_scatter(t, t[:, :, :2], 2, -2),
           "scatter": torch.zeros(3, 9).scatter(0, idx, src[:2, :3]), "scatter_value": src.scatter(1, idx, 2.5),
           "scatter_add": src.scatter_add(1, idx, x[0, 0, :2, :3]),
           "index_add": src.index_add(0, torch.tensor([0, 2, 0]), x[0, 1, :3], alpha=2),
           "index_copy": src.index_copy(1, torch.tensor([0, 4]), x[0, 1, :3, :2]),
           "index_fill": x.index_fill(1, rows, -1.0),
           "put": src.put(torch.tensor([0, 5, -1]), t[0, 0, :3]),
           "put_accumulate": src.put(torch.tensor([0, 5, 5]), t[0, 0, :3], accumulate=True),
           "masked_scatter": src.masked_scatter(src > 0, x[0, 2] * 3),
           "masked_scatter_broadcast": x[0].masked_scatter(src[0] > 0, x[1])}
    out |= {f"index_reduce_{reduce}": src.index_reduce(0, torch.tensor([0, 2, 0]), x[0, 1, :3], reduce,
                                                        include_self=reduce != "amin")
            for reduce in ("prod", "mean", "amax", "amin")}
    return out | {f"scatter_reduce_{reduce}{'' if include_self else '_excluding_self'}":
                  src.scatter_reduce(1, reduce_idx, x[0, 1, :3], reduce, include_self=include_self)
                  for reduce in ("sum", "prod", "mean", "amax", "amin") for include_self in (True, False)}


def strided_views(x, square):   # x (2, 3, 7, 9), square (4, 5, 5)
    return {"alias": x[..., 0:9], "as_strided": x.as_strided((2, 3), (1, 2)),
            "as_strided_offset": x[0].as_strided((3, 4, 4), (63, 9, 1), 2),
            "as_strided_overlapping": x.as_strided((5, 4), (2, 1)),
            "as_strided_broadcast": x.as_strided((3, 4), (0, 9), 5),
            "as_strided_of_transposed": x[0, 0].t().as_strided((3, 4), (1, 7)),
            "diagonal": torch.diagonal(square, 0, -2, -1), "diagonal_above": torch.diagonal(square, 2, 1, 2),
            "diagonal_below": torch.diagonal(square, -1, 2, 1), "diagonal_outer": torch.diagonal(x, 1, 0, 3),
            "adaptive_pool_1d": F.adaptive_avg_pool1d(x[0, 0].t(), 1)}   # mean, then restrided (Swin's pooler)


def creation(x):
    return {"arange": torch.arange(5) + x.shape[0], "arange_float": torch.arange(0.5, 3, 0.25) * x[0, 0],
            "arange_negative": torch.arange(4, -3, -2), "full": torch.full((2, 3), 1.5) + x,
            "zeros": torch.zeros(2, 3) + x, "ones_like": torch.ones_like(x),
            "zeros_int": torch.zeros(3, dtype=torch.int32),
            "full_bool": torch.full((2,), True), "new_full": x.new_full((4,), 7.0), "scalar": x * torch.tensor(3.0),
            "constant": x * torch.tensor([1.0, 2.0, 3.0]), "empty_filled": torch.empty(3).fill_(2.0) + x[0],
            "eye": torch.eye(3) + x[0], "empty_like_transposed": torch.empty_like(x.t()).fill_(2.0) * x.t(),
            "new_empty_strided": x.new_empty_strided((3, 2), (1, 3)).fill_(1.0) + x.t(),
            "one_hot": F.one_hot(torch.tensor([0, 2, 1]), 3) * x[0, 0]}


def convolutions(x, w, image):   # x (2, 4, 9), w (6, 4, 3), image (1, 4, 6, 7)
    w2d = w[..., None] * w[:, :, None]
    return {"conv1d": F.conv1d(x, w),
            "conv1d_grouped": F.conv1d(x, w[:, :2], stride=2, padding=2, dilation=2, groups=2),
            "conv_transpose1d": F.conv_transpose1d(x, w.transpose(0, 1), stride=3, padding=1, output_padding=2),
            "conv2d": F.conv2d(image, w2d, w[:, 0, 0], stride=(2, 1), padding=(1, 0)),
            "conv2d_same": F.conv2d(image, w2d, padding="same"), "depthwise": F.conv2d(image, w2d[:4, :1], groups=4),
            "conv_transpose2d": F.conv_transpose2d(image, w2d.transpose(0, 1), stride=2, output_padding=1, groups=1),
            "conv_transpose2d_grouped": F.conv_transpose2d(image, w2d[:4], w.flatten()[:8], stride=2, groups=2,
                                                           dilation=2)}


def attention(q, k, v, mask, bias, q8, kv2):
    return {"plain": F.scaled_dot_product_attention(q, k, v),
            "bool_mask": F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "float_mask": F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
            "causal": F.scaled_dot_product_attention(q, q, v[:, :, :5], is_causal=True),
            "scale": F.scaled_dot_product_attention(q, k, v, scale=0.3),
            "gqa": F.scaled_dot_product_attention(q8, kv2, kv2, enable_gqa=True),
            "multi_query": F.scaled_dot_product_attention(q8, kv2[:, :1], kv2[:, 1:]),   # heads broadcast
            "three_d": F.scaled_dot_product_attention(q[0], k[0], v[0])}


FAMILIES = {
    "unary_math": (unary_math, lambda: (uniform(0.1, 0.9, 2, 1, 5), randn(3, 7))),
    "unary_special": (unary_special, lambda: (torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0]),
                                              ints(-5, 5, 2, 3))),
    "binary": (binary, lambda: (randn(3, 1, 4), randn(1, 5, 4), ints(-9, 9, 2, 5),
                                ints(1, 5, 2, 5) * (-1) ** ints(0, 2, 2, 5))),
    "compare_and_select": (compare_and_select, lambda: (randn(2, 1, 5), randn(3, 5), ints(-5, 5, 7))),
    "casts": (casts, lambda: (randn(2, 5) * 3, ints(-5, 5, 3))),
    "activations": (activations, lambda: (randn(2, 3, 5) * 3,)),
    "reductions": (reductions, lambda: (randn(2, 3, 5), randn(2, 3, 5) > 0)),
    "matmuls": (matmuls, lambda: (randn(3, 7), randn(7, 5), randn(5), randn(2, 3, 7), randn(2, 7, 5))),
    "normalizations": (normalizations, lambda: (randn(2, 4, 5, 3), uniform(0.5, 1.5, 4), randn(4), randn(4),
                                                uniform(0.5, 2.0, 4), randn(2, 5, 7) * 3)),
    "pooling": (pooling, lambda: (randn(2, 3, 7, 9), randn(2, 3, 7))),
    "resizing": (resizing, lambda: (randn(1, 2, 3, 5), randn(2, 3, 5))),
    "movement": (movement, lambda: (randn(2, 3, 5, 1), randn(4, 6))),
    "indexing": (indexing, lambda: (randn(3, 5, 4), randn(10, 6), ints(-2, 3, 4), ints(0, 10, 3, 5))),
    "indexed_assignment": (indexed_assignment, lambda: (randn(2, 3, 7, 9), randn(2, 3, 8), randn(3, 9))),
    "strided_views": (strided_views, lambda: (randn(2, 3, 7, 9), randn(4, 5, 5))),
    "creation": (creation, lambda: (randn(2, 3),)),
    "convolutions": (convolutions, lambda: (randn(2, 4, 9), randn(6, 4, 3), randn(1, 4, 6, 7))),
    "attention": (attention, lambda: (randn(2, 3, 5, 8), randn(2, 3, 6, 8), randn(2, 3, 6, 4), randn(5, 6) > -0.5,
                                      randn(2, 1, 5, 6), randn(1, 4, 5, 8), randn(1, 2, 6, 8))),
}


@functools.cache
def exported_family(family):
    fn, inputs = FAMILIES[family]
    gen.manual_seed(zlib.crc32(family.encode()))   # the same inputs whatever order the tests run in
    inputs = inputs()
    return fn, inputs, export(Fn(fn), inputs)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_pytorch(family):
    fn, inputs, ep = exported_family(family)
    assert_matches(fn, *inputs, tol=1e-5, traced=trace_exported(ep, inputs))


class Held(torch.nn.Module):
    """fn of tensors the module holds as buffers: they reach the rules as numpy arrays, as weights do."""

    def __init__(self, fn, tensors):
        super().__init__()
        self.fn = fn
        for i, t in enumerate(tensors):
            self.register_buffer(f"t{i}", t)

    def forward(self, scale):
        return self.fn(*self.buffers())


@pytest.mark.parametrize("family", FAMILIES)
def test_family_on_weights_matches_pytorch(family):
    """Every rule on operands that are the model's weights (numpy arrays, which lack JAX's methods
    such as .at) rather than its inputs (JAX tracers)."""
    fn, inputs, _ = exported_family(family)
    model = Held(fn, inputs)
    out = evaluate(trace_torch(model, (torch.ones(1),)), (torch.ones(1),))
    ref = model(torch.ones(1))
    for name, expected in (ref.items() if isinstance(ref, dict) else [("result", ref)]):
        got = np.asarray(out[name] if isinstance(ref, dict) else out, np.float32)
        np.testing.assert_allclose(got, expected.float().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_every_rule_has_an_op_test():
    exercised = {node.target for family in FAMILIES for node in aten_calls(exported_family(family)[2])}
    untested = {str(op) for op in set(ATEN_RULES) - exercised}
    assert not untested, f"rules no op-level test reaches: {sorted(untested)}"


# The jaxpr primitives the ATen rules emit: what the lowering must handle (or reject by name). A rule
# that starts emitting another primitive fails here, so the change is seen and the lowering told.
EMITTED_PRIMITIVES = {
    # elementwise math
    "abs", "neg", "sign", "floor", "ceil", "round", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "logistic",
    "tanh", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "atan2",
    "add", "sub", "mul", "div", "rem", "pow", "integer_pow", "square", "max", "min",
    # comparisons, logic, select, casts
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "select_n", "convert_element_type",
    # reductions
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_or", "argmax", "argmin", "cumsum",
    # contractions and windows
    "dot_general", "conv_general_dilated", "reduce_window_max", "reduce_window_sum",
    # data movement, indexing, creation
    "reshape", "transpose", "broadcast_in_dim", "squeeze", "slice", "concatenate", "pad", "rev", "tile", "gather",
    "iota",
    # indexed assignment (constant indices: gathers in the lowering)
    "scatter", "scatter-add", "scatter-mul", "scatter-min", "scatter-max",
    # attention, one call (rules_attention.py)
    "jit",
}


def primitives(jaxpr) -> set[str]:
    return {eqn.primitive.name for eqn in jaxpr.eqns} | {
        name for eqn in jaxpr.eqns for p in eqn.params.values() if hasattr(p, "jaxpr") for name in primitives(p.jaxpr)}


def test_rules_emit_only_the_documented_primitives():
    used = set()
    for family in FAMILIES:
        fn, inputs, ep = exported_family(family)
        used |= primitives(trace_exported(ep, inputs).closed.jaxpr)
    assert used <= EMITTED_PRIMITIVES, f"undocumented primitives: {sorted(used - EMITTED_PRIMITIVES)}"


def test_bfloat16_model_matches_pytorch_in_bfloat16():
    def block(x, w, ln_w):
        h = F.layer_norm(x @ w, (8,), ln_w)
        return {"out": F.softmax(F.gelu(h), -1) + torch.sigmoid(h), "conv": F.conv1d(x.transpose(1, 2), w[:, :, None]),
                "mean": h.mean(-1), "attn": F.scaled_dot_product_attention(x, x, x)}
    inputs = (randn(2, 5, 8, dtype=torch.bfloat16), randn(8, 8, dtype=torch.bfloat16), randn(8, dtype=torch.bfloat16))
    assert_matches(block, *inputs, tol=2e-2)   # bf16 rounding of intermediate results


# --- the attention call the lowering pattern-matches -----------------------------------------------

def test_attention_is_one_call_named_scaled_dot_product_attention():
    q, k, v, mask = randn(1, 2, 5, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(5, 6) > 0
    closed = trace_torch(Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2),
                         (q, k, v, mask)).closed
    calls = [e for e in closed.jaxpr.eqns if "jaxpr" in e.params]
    assert len(calls) == 1 and calls[0].primitive.name in ("jit", "pjit")
    assert calls[0].params["name"] == "scaled_dot_product_attention"
    body = [e.primitive.name for e in calls[0].params["jaxpr"].jaxpr.eqns]
    assert body[0] == "dot_general" and body[-1] == "dot_general"
    assert {"select_n", "reduce_max", "exp", "reduce_sum", "div"} <= set(body)
    assert not [e for e in calls[0].params["jaxpr"].jaxpr.eqns if "jaxpr" in e.params]   # flat body
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2
    assert rel_err(jaxpr_as_fun(closed)(q.numpy(), k.numpy(), v.numpy(), mask.numpy())[0], ref.numpy()) < 1e-6


def test_pooling_window_larger_than_its_input_is_the_input():
    """EfficientNet's pooler, AvgPool2d(1280, ceil_mode=True) on 7x7, is one 7x7 window, not 1280x1280."""
    x = randn(1, 2, 7, 7)
    closed = trace_torch(Fn(lambda x: F.avg_pool2d(x, 1280, ceil_mode=True)), (x,)).closed
    (pool,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "reduce_window_sum"]
    assert pool.params["window_dimensions"] == (1, 1, 7, 7) and pool.params["padding"][2:] == ((0, 0), (0, 0))


def test_plain_strided_views_are_slices_and_reshapes():
    """A view whose rows do not overlap (every 2nd element of every 2nd row, a transpose, a broadcast,
    a diagonal) is data movement; overlapping windows are a gather with a constant map."""
    x = randn(4, 6, 6)
    for view in (lambda x: x.as_strided((3, 4), (12, 2), 1), lambda x: x.as_strided((3, 2, 5), (1, 36, 0)),
                 lambda x: torch.diagonal(x, 1, 1, 2)):
        assert "gather" not in primitives(trace_torch(Fn(view), (x,)).closed.jaxpr)
    assert "gather" in primitives(trace_torch(Fn(lambda x: x.as_strided((5, 4), (2, 1))), (x,)).closed.jaxpr)


def test_traced_jaxpr_has_no_call_but_attention():
    """jnp's own jitted helpers (where, clip, take...) are inlined: only attention stays a call."""
    fn, inputs = FAMILIES["compare_and_select"]
    closed = trace_torch(Fn(fn), inputs()).closed
    assert not [e for e in closed.jaxpr.eqns if "jaxpr" in e.params]


# --- properties over shapes and parameters ---------------------------------------------------------
# Each example checks a batch of drawn cases in one model: one export and one compile per example.

cases = functools.partial(st.lists, min_size=4, max_size=4)
few = settings(max_examples=4)


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast: the second drops leading dims and sets some to 1, as NumPy allows."""
    shape = draw(st.lists(st.integers(1, 4), max_size=3))
    other = [draw(st.sampled_from([n, 1])) for n in shape[draw(st.integers(0, len(shape))):]]
    return randn(*shape), randn(*other)


@few
@given(cases(broadcast_pair()))
def test_broadcasting_binary_ops(pairs):
    def fn(*xs):
        out = {}
        for i, (a, b) in enumerate(zip(xs[::2], xs[1::2], strict=True)):
            out |= {f"add{i}": a + b, f"mul{i}": a * b, f"max{i}": torch.maximum(a, b), f"ge{i}": a >= b,
                    f"where{i}": torch.where(a > 0, a, b)}
        return out
    assert_matches(fn, *[x for pair in pairs for x in pair])


conv_case = st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(1, 2), st.sampled_from([1, 2]),
                      st.booleans(), st.sampled_from([1, 2]), st.integers(5, 8))


@few
@given(cases(conv_case))
def test_convolution_parameters(convs):
    """Forward and transposed 2-D convolutions over kernel, padding, stride, dilation, groups, size."""
    inputs, calls = [], []
    for kernel, padding, stride, dilation, transposed, groups, size in convs:
        cin, cout = 2 * groups, 3 * groups
        w = randn(cin, cout // groups, kernel, kernel) if transposed else randn(cout, cin // groups, kernel, kernel)
        inputs += [randn(1, cin, size, size + 1), w, randn(cout)]
        # torch requires output_padding < stride or dilation
        calls.append(functools.partial(F.conv_transpose2d, stride=stride, padding=padding, groups=groups,
                                       output_padding=min(stride, dilation) - 1, dilation=dilation) if transposed
                     else functools.partial(F.conv2d, stride=stride, padding=padding, dilation=dilation, groups=groups))
    assert_matches(lambda *xs: {f"conv{i}": call(*xs[3 * i:3 * i + 3]) for i, call in enumerate(calls)}, *inputs)


pool_case = st.tuples(st.integers(1, 3), st.integers(1, 3), st.booleans(), st.integers(4, 9), st.integers(4, 9))


@few
@given(cases(pool_case))
def test_pooling_parameters(pools):
    def fn(*xs):
        out = {}
        for i, (x, (kernel, stride, ceil_mode, _, _)) in enumerate(zip(xs, pools, strict=True)):
            args = dict(kernel_size=kernel, stride=stride, padding=kernel // 2, ceil_mode=ceil_mode)
            out |= {f"max{i}": F.max_pool2d(x, **args), f"avg{i}": F.avg_pool2d(x, **args),
                    f"avg_excluded{i}": F.avg_pool2d(x, **args, count_include_pad=False)}
        return out
    assert_matches(fn, *[randn(1, 2, h, w) for *_, h, w in pools])


resize_case = st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 12), st.integers(1, 12))


@few
@given(cases(resize_case))
def test_output_sizes_of_resizing_and_adaptive_pooling(resizes):
    """Ops that take an output size: any input and output sizes, dividing or not, smaller or larger."""
    def fn(*xs):
        out = {}
        for i, (x, (_, _, out_h, out_w)) in enumerate(zip(xs, resizes, strict=True)):
            size = (out_h, out_w)
            out |= {f"nearest{i}": F.interpolate(x, size=size), f"bilinear{i}": F.interpolate(x, size, mode="bilinear"),
                    f"corners{i}": F.interpolate(x, size, mode="bilinear", align_corners=True),
                    f"adaptive_avg{i}": F.adaptive_avg_pool2d(x, size),
                    f"adaptive_max{i}": F.adaptive_max_pool2d(x, size)}
        return out
    assert_matches(fn, *[randn(1, 2, h, w) for h, w, _, _ in resizes])
