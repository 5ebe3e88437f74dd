"""DRAM views and memory planning."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from stagec.lower.codegen.memory import Interval, align, allocate_by_liveness
from stagec.lower.schedule.tensors import DramRegion, DramTensor, coalesce


def _elements(t: DramTensor) -> np.ndarray:
    return np.array([sum(i * s for i, s in zip(ix, t.strides, strict=True)) for ix in np.ndindex(*t.shape)],
                    np.int64) + t.offset // 4


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4), st.randoms(use_true_random=False), st.data())
def test_reshape_is_a_view_exactly_when_numpy_can(shape, rnd, data):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    t = DramTensor.dense(DramRegion.DATA, 0, tuple(shape)).transpose(perm)
    a = np.arange(int(np.prod(shape))).reshape(shape).transpose(perm)
    size = a.size
    factors = [d for d in range(1, size + 1) if size % d == 0]
    first = data.draw(st.sampled_from(factors))
    new = (first, size // first)
    view = t.reshape(new)
    expect = a.reshape(new)
    alias = a.view()
    try:
        alias.shape = new
        numpy_can = True
    except AttributeError:
        numpy_can = False
    assert (view is not None) == numpy_can
    if view is not None:
        assert np.array_equal(_elements(view), expect.reshape(-1))


@given(st.lists(st.integers(1, 5), min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_coalesce_keeps_the_iteration(shape, rnd):
    perm = list(range(len(shape)))
    rnd.shuffle(perm)
    a = DramTensor.dense(DramRegion.DATA, 0, tuple(shape))
    b = DramTensor.dense(DramRegion.DATA, 0, tuple(shape), perm)
    cshape, (sa, sb) = coalesce(a.shape, a.strides, b.strides)
    assert np.prod(cshape) == np.prod(shape)
    for t, s in ((a, sa), (b, sb)):
        merged = DramTensor(t.region, 0, cshape, s)
        assert np.array_equal(_elements(merged), _elements(t))


@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=30))
def test_liveness_allocation_never_overlaps_live_buffers(specs):
    ivs = [Interval(str(i), size, min(a, b), max(a, b)) for i, (size, a, b) in enumerate(specs)]
    offsets, peak = allocate_by_liveness(ivs)
    for x in ivs:
        assert offsets[x.name] % 64 == 0 and offsets[x.name] + x.size <= peak
        for y in ivs:
            if x.name < y.name and x.start <= y.end and y.start <= x.end:
                xo, yo = offsets[x.name], offsets[y.name]
                assert xo + align(x.size) <= yo or yo + align(y.size) <= xo
    assert peak <= sum(align(x.size) for x in ivs)
