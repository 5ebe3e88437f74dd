"""The timing model's definition, as a plain event loop (slow; tests hold sim.timing to it).

Queues hold their instructions in program order.  Tokens travel in FIFO
channels (source queue, destination queue) and carry the end cycle of the
instruction that pushed them.  Repeatedly: among the queue heads whose tokens
have all been pushed, the one that can start earliest goes next (ties: the
lower queue number); a DMA then waits for the DRAM channel, first come, first
served.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from stagec.errors import TimingError
from stagec.isa.config import HardwareConfig
from stagec.isa.instructions import Queue

from .costs import instruction_shapes, unit_cycles, unit_parameters


def reference_times(code: np.ndarray, hw: HardwareConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, grant, end) of every instruction."""
    shapes = instruction_shapes(code)
    occupancy, transfer = unit_cycles(shapes, unit_parameters(hw))
    queues = [deque(np.flatnonzero(shapes.queue == q).tolist()) for q in range(len(Queue))]
    channels = {(s, d): deque() for s in range(len(Queue)) for d in range(len(Queue)) if s != d}
    queue_end = [0.0] * len(Queue)
    dram_free = 0.0
    start, grant, end = (np.zeros(len(code)) for _ in range(3))
    for _ in range(len(code)):
        best = None
        for q, pending in enumerate(queues):
            if not pending:
                continue
            sources = [s for s in range(len(Queue)) if s != q and code["pop"][pending[0]] >> s & 1]
            if all(channels[(s, q)] for s in sources):
                ready = max([queue_end[q]] + [channels[(s, q)][0] for s in sources])
                if best is None or ready < best[0]:
                    best = (ready, q, sources)
        if best is None:
            raise TimingError("no queue head can start: the tokens deadlock")
        ready, q, sources = best
        i = queues[q].popleft()
        for s in sources:
            channels[(s, q)].popleft()
        start[i] = ready
        if shapes.is_dma[i]:
            grant[i] = max(ready + occupancy[i], dram_free)
            end[i] = dram_free = grant[i] + transfer[i]
        else:
            grant[i], end[i] = ready, ready + occupancy[i]
        queue_end[q] = end[i]
        for d in range(len(Queue)):
            if d != q and code["push"][i] >> d & 1:
                channels[(q, d)].append(end[i])
    return start, grant, end
