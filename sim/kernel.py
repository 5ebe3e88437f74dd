"""The batched executor's kernels: one per opcode (sim.dma, sim.compute), registered by opcode.

A kernel is a frozen record: the static signature of a group of instructions (its fields are the
jit cache key), whose methods say

- `describe(node)` (a classmethod, for the planner, sim.plan): the signature of one node (an
  instruction, or a chain accumulating into one region), the values it reads (`node.local`,
  `node.initial`, `node.dram`), its producer groups and its value's length;
- `read_dims(slot)`: how a read slot's elements are laid out, as the compute consumes them;
- `prepare(group)`: the rows and offsets each slot reads, extra static arguments, and the layout
  `build` specializes on (a DMA's grid of DRAM boxes, a matmul's blocks);
- `build(hows, layout)`: the jitted function (`compiled` caches it by signature);
- `run(step, args, values, data, executor)`: what one run does with it (compute a value, read or
  write DRAM).

Adding an opcode: its definition (isa.opcodes), a kernel class registered here with
`@register(opcode)`, and a test.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

DRAM_CONST, DRAM_DATA = -1, -2   # a DMA's DRAM side: the constant blob, or the data region

KERNELS: dict[int, type[Kernel]] = {}   # opcode -> its kernel


def register(opcode: int):
    def add(cls: type[Kernel]) -> type[Kernel]:
        KERNELS[int(opcode)] = cls
        return cls
    return add


@dataclass(frozen=True)
class Prepared:
    """A group's arguments before the run: per read slot the (rows, offs) it reads, static extras
    appended to the function's arguments, and what `build` specializes on."""

    reads: dict[str, tuple[np.ndarray, np.ndarray]]
    extra: tuple = ()
    layout: object = None


class Kernel:
    kind: ClassVar[str]                 # the group kind, as reports and tests name it
    slots: ClassVar[tuple[str, ...]]    # read slots, in the order the function takes them
    # Its value is a function of DRAM and its reads alone: members of one level that read the same
    # (the compiler reloads weights per tile) are computed once.
    reads_dram: ClassVar[bool] = False

    @classmethod
    def describe(cls, node) -> tuple[Kernel, tuple, int]:
        raise NotImplementedError

    def read_dims(self, slot: str) -> tuple[tuple[int, int], ...]:
        raise NotImplementedError

    def prepare(self, group) -> Prepared:
        return Prepared({s: (group.reads[s].rows, group.reads[s].offs) for s in self.slots if s in group.reads})

    def build(self, hows: tuple, layout):
        raise NotImplementedError

    def run(self, step, args: list, values: dict, data: dict, executor) -> None:
        """A compute kernel: the group's value from the values it reads."""
        values[step.group.id] = step.fn(*args, *step.extra)


@functools.cache
def compiled(sig: Kernel, hows: tuple, layout):
    """The function of a group of signature `sig`, built once per process (a shape met in an
    earlier program is not compiled again)."""
    return sig.build(hows, layout)
