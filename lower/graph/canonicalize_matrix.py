"""canonicalize's rules for the matrix unit: dot_general as a (batched) MATMUL, 1-D and 2-D
convolutions as a CONV over NCHW x OIHW."""

from __future__ import annotations

import math

import numpy as np

from stagec.errors import LoweringError

from .builder import out_shape, reshape_value, rule, transpose_value
from .graph_ir import OpKind


@rule("dot_general")
def dot_general(b, eqn, lhs, rhs):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    ls, rs = np.shape(lhs), np.shape(rhs)
    lfree = [d for d in range(len(ls)) if d not in lc and d not in lb]
    rfree = [d for d in range(len(rs)) if d not in rc and d not in rb]
    batch = [ls[d] for d in lb]
    m, k, n = (math.prod(ls[d] for d in lfree), math.prod(ls[d] for d in lc), math.prod(rs[d] for d in rfree))
    bsz = (math.prod(batch),) if batch else ()
    a = reshape_value(b, transpose_value(b, lhs, list(lb) + lfree + list(lc)), bsz + (m, k))
    w = reshape_value(b, transpose_value(b, rhs, list(rb) + list(rc) + rfree), bsz + (k, n))
    y = b.emit(OpKind.MATMUL, [a, w], bsz + (m, n))
    return reshape_value(b, y, out_shape(eqn))


@rule("conv_general_dilated")
def conv(b, eqn, x, w):
    p = eqn.params
    dn = p["dimension_numbers"]
    nsp = len(p["window_strides"])
    if nsp not in (1, 2):
        raise LoweringError(f"{nsp}-D convolution (equation `{eqn}`)")
    if any(d != 1 for d in p["lhs_dilation"]) or p["batch_group_count"] != 1:
        raise LoweringError(f"transposed or batch-grouped convolution (equation `{eqn}`)")
    x = transpose_value(b, x, dn.lhs_spec)
    w = transpose_value(b, w, dn.rhs_spec)
    stride, dilation, padding = tuple(p["window_strides"]), tuple(p["rhs_dilation"]), tuple(map(tuple, p["padding"]))
    if nsp == 1:   # 1-D convolution is 2-D with a unit height
        x = reshape_value(b, x, (*np.shape(x)[:2], 1, np.shape(x)[2]))
        w = reshape_value(b, w, (*np.shape(w)[:2], 1, np.shape(w)[2]))
        stride, dilation, padding = (1, *stride), (1, *dilation), ((0, 0), *padding)
    if np.shape(w)[2:] == (1, 1) and any(st > 1 for st in stride) and not any(map(any, padding)):
        # A strided 1x1 conv reads every s-th pixel: as a strided view of its input (free), its
        # loads fetch only those pixels instead of whole rows (ResNet's downsampling shortcuts).
        shape = np.shape(x)
        x = b.emit(OpKind.SLICE, [x], (*shape[:2], *(-(-d // st) for d, st in zip(shape[2:], stride, strict=True))),
                   start=(0,) * 4, limit=tuple(shape), step=(1, 1, *stride))
        stride = (1, 1)
    out_spec_shape = out_shape(eqn)
    canon = [out_spec_shape[d] for d in dn.out_spec]
    if nsp == 1:
        canon = [canon[0], canon[1], 1, canon[2]]
    y = b.emit(OpKind.CONV, [x, w], canon, stride=stride, padding=padding, dilation=dilation,
               groups=int(p["feature_group_count"]))
    if nsp == 1:
        y = reshape_value(b, y, [canon[0], canon[1], canon[3]])
    return transpose_value(b, y, tuple(int(i) for i in np.argsort(dn.out_spec)))
