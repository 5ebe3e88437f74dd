"""Dependency tokens: the fewest VTA-style push/pop pairs that order every conflict.

Walking the stream in program order, an instruction that conflicts with an
earlier instruction `w` of another queue (on any memory: read-after-write,
write-after-read, write-after-write) gets a pop from that queue unless what
its own queue already knows (the vector clock of the tokens it has taken)
covers `w`; `w` gets the matching push.  Pushes on each channel come out in
queue order, so FIFO matching pairs them with the right pops.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stagec.isa.program import Program
from stagec.isa.verify import DataflowWalk, check_static


def insert_tokens(program: Program) -> Program:
    """The program with tokens; its walk checked every rule the tokens do not satisfy by
    construction, so the result comes verified (its dataflow facts cached)."""
    code = program.code.copy()
    walk = DataflowWalk(program, check_static(program))
    n = len(code)
    push = np.zeros(n, np.uint8)
    pop = np.zeros(n, np.uint8)
    done = [None] * n                          # done[i]: what i's queue knew when i finished
    known = [[-1] * 4 for _ in range(4)]       # known[q]: latest index per queue that queue q has seen finish
    queue = walk.queue.tolist()
    for i in range(n):
        q = queue[i]
        kq = known[q]
        for r, w in enumerate(walk.step(i)):
            if w <= kq[r]:   # known already, maybe by a token taken a moment ago (knowledge is transitive)
                continue
            push[w] |= 1 << q
            pop[i] |= 1 << r
            kq[:] = map(max, kq, done[w])
        kq[q] = i
        done[i] = tuple(kq)
    code["push"] = push
    code["pop"] = pop
    return dataclasses.replace(program, code=code, cache={"dataflow": walk.result()})
