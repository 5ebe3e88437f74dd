"""Memory planning: DRAM by tensor liveness, scratchpad and accumulator per op."""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Interval:
    """A buffer of `size` bytes live from step `start` to step `end` (inclusive)."""

    name: str
    size: int
    start: int
    end: int


def allocate_by_liveness(intervals: list[Interval]) -> tuple[dict[str, int], int]:
    """First-fit offsets that never overlap two buffers alive at the same step.

    Returns ({name: offset}, peak bytes).  Buffers are placed in order of their
    first step; a buffer's bytes are free again after its last step.
    """
    offsets: dict[str, int] = {}
    live: list[tuple[int, int, int]] = []   # (offset, size, end)
    peak = 0
    for iv in sorted(intervals, key=lambda iv: (iv.start, -iv.size)):
        live = [b for b in live if b[2] >= iv.start]
        size = align(iv.size)
        offset = 0
        for lo, sz, _ in sorted(live):
            if offset + size <= lo:
                break
            offset = max(offset, lo + sz)
        offsets[iv.name] = offset
        live.append((offset, size, iv.end))
        peak = max(peak, offset + size)
    return offsets, peak


class LocalAllocator:
    """Bump allocation of a scratchpad or accumulator for one nest (the nest owns the whole memory).

    The mapper has already checked that the nest's buffers fit (lower.schedule.buffers, one description for
    both), so running out here, or a gap between buffers the footprint does not count, is a bug in
    the compiler, not a tiling the user can change: an internal error that names the layer."""

    def __init__(self, capacity: int, what: str, layer: str):
        self.capacity, self.what, self.layer = capacity, what, layer
        self.top = 0

    def alloc(self, nbytes: int, align_to: int = 4) -> int:
        base = align(self.top, align_to)
        if base + nbytes > self.capacity:
            raise AssertionError(f"{self.layer}: internal error: {self.what} overflow: needs {base + nbytes} bytes, "
                                 f"has {self.capacity}, in a tiling the mapper accepted")
        self.top = base + nbytes
        return base

    def expect(self, nbytes: int) -> None:
        """Check the buffers took exactly the footprint the mapper computed for them."""
        if self.top != nbytes:
            raise AssertionError(f"{self.layer}: internal error: the {self.what} buffers take {self.top} bytes, "
                                 f"their footprint says {nbytes}")
