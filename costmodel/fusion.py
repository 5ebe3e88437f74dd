"""Fusion in the differentiable cost model: a model's cascades (lower.schedule.cascade) as relaxed choices.

A chain (lower.schedule.cascade_map.chains: the compiler's rule of which consecutive layers may run as
one cascade) has an edge between each pair of members, each edge a relaxed choice, fused with
probability sigmoid(logit), cut otherwise, as the mapping's switches are relaxed (costmodel.space).
The edges draw a segmentation of the chain; a segment of one layer costs what the layer costs alone
(its row of the workload, costmodel.model), a longer one (up to MAX_MEMBERS, as the compiler) what
lower.schedule.cascade.cascade_cost gives it over costmodel.smooth.Relaxed at the descent's
temperature, its spatial tile and its members' output-channel tiles and weight residency being its
own relaxed parameters (in logs, and a logit), as its halo strategy (a logit: a line buffer or
recompute, lower.schedule.halo; cascade_cost prices the blend), plus its relative overshoot of the
scratchpad and accumulator as a violation.  The chain's cost is its expectation over the segmentations the edges
draw (those with no segment over MAX_MEMBERS, renormalized), one forward pass over the chain's
prefixes (`expected`): smooth in the edges and the hardware fields, so the descent sees what a larger
scratchpad saves in DRAM traffic.  The discrete choice is the compiler's (cascade_map.choose_cascades:
every segment that fits at its best tiling, the cheapest cut of each chain), never an illegal one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np

from stagec.isa.instructions import MAX_COUNT
from stagec.lower.schedule.cascade import MAX_MEMBERS, cascade_cost
from stagec.lower.schedule.cascade_map import _mappings, map_cascade
from stagec.lower.schedule.halo import LINE, depthwise_at, line_buffers
from stagec.lower.schedule.nest import MATRIX, LayerShape, dots, stacks
from stagec.sim.energy import energy_pj

from .smooth import Relaxed


@dataclass(frozen=True)
class Chain:
    """Layers that may run as cascades: their names and nests (lower.schedule.mapper.ConvNest), the
    workload's rows that price each alone, the workload (model) it belongs to, and which edges the
    compiler fused where the chain was found (the descent's start)."""

    names: tuple[str, ...]
    nests: tuple
    rows: tuple[int, ...]
    workload: int
    fused: tuple[bool, ...]

    @property
    def shapes(self) -> list[LayerShape]:
        return [LayerShape.of(n.kind, n.problem, n.extras) for n in self.nests]

    def segments(self) -> list[tuple[int, int]]:
        """The fusable segments [i, j) of two members or more."""
        n = len(self.nests)
        return [(i, j) for j in range(2, n + 1) for i in range(max(0, j - MAX_MEMBERS), j - 1)]


def start_params(chains, hw, objective: str) -> dict:
    """Relaxed parameters from the compiler's choice on `hw` (a HardwareConfig): each edge's logit +-3
    as it fused it or not, each segment's tiles its best legal tiling's for `objective` (map_cascade),
    or one row and column and the array's columns per member where none fits."""
    # strongly typed: a weak-typed leaf turns strong after adam's first update, and each change of type
    # is one more compilation of the descent's step (a minute each)
    return {"edges": tuple(jnp.asarray(np.where(c.fused, 3.0, -3.0), jnp.float32) for c in chains),
            "segments": tuple(jnp.stack([_segment_start(c.nests[i:j], hw, objective) for i, j in c.segments()])
                              for c in chains)}


def _segment_start(nests, hw, objective: str):
    mapped = map_cascade(nests, hw, objective)
    # spatial tile, per member its output-channel tile and weight residency, then the last member's
    # single accumulator tile and whether the cascade is chunked (cascade_map._mappings's axes), and
    # whether it keeps a line buffer
    theta = np.full(5 + 2 * MAX_MEMBERS, -3.0, np.float32)
    if mapped is None:
        theta[2:2 + 2 * MAX_MEMBERS:2] = np.log(hw.array_cols)
        return jnp.asarray(theta)
    (th, tw), ms, chunk, halo, *_ = mapped
    theta[:2] = np.log([th, tw])
    for i, m in enumerate(ms):
        theta[2 + 2 * i] = np.log(max(m.tile_o, 1))
        theta[3 + 2 * i] = 3.0 if m.weights_resident or m.dot else -3.0
    theta[-3:] = [3.0 if ms[-1].single_acc else -3.0, -3.0 if chunk is None else 3.0, 3.0 if halo == LINE else -3.0]
    return jnp.asarray(theta)


def segment_cost(Ls, theta, hw, smooth):
    """(cycles, energy pJ, violation) of members `Ls` run as one cascade, tiled as `theta` says."""
    d = depthwise_at(Ls)

    def tile(log, most):
        # exact (smooth 0): the integer tile, not float32 exp(log(n)) a hair off it (whose vanishing
        # remainder tile the relaxed count would charge a whole tile's fixed cycles)
        t = jnp.clip(jnp.exp(log), 1.0, most)
        return jnp.where(smooth == 0, jnp.round(t), t)
    axes = [tile(theta[0], Ls[d].oh), tile(theta[1], Ls[d].ow)]
    for i, L in enumerate(Ls):
        axes += [tile(theta[2 + 2 * i], L.o), jax.nn.sigmoid(theta[3 + 2 * i]) * ((L.kind == MATRIX) | dots(L))]
    single, chunked, line = jax.nn.sigmoid(theta[-3:])
    chunked = chunked * (Ls[-1].o <= MAX_COUNT)
    axes += [single * (Ls[-1].kind == MATRIX), chunked]
    # a line buffer where the compiler may take one (halo.line_buffers), not chunked (as map_cascade), a
    # k x k first member's with its kernel rows stacked (its recompute unstacked: the grid's other pick
    # of the two, the relaxed choice being one weight)
    line = line * line_buffers(Ls, 1) * (1 - chunked)
    cost = cascade_cost(Ls, _mappings(Ls, axes, 1.0, line * stacks(Ls[0])), hw, Relaxed(smooth), chunked, line)
    energy = sum(energy_pj(cost.actions, cost.cycles, hw, jnp).values())
    violation = (jnp.maximum(cost.spad_bytes / hw.scratchpad_bytes - 1.0, 0.0)
                 + jnp.maximum(cost.acc_bytes / hw.accumulator_bytes - 1.0, 0.0))
    return jnp.stack([cost.cycles, energy, violation])


def expected(n: int, segments, alone, fused, p):
    """The expectation of a chain of `n` members' (cycles, energy, violation) over the segmentations its
    edges (fused with probabilities `p`, (n - 1,)) draw: `alone[k]` a member's alone, `fused[s]`
    segment `segments[s]`'s.  z[j] weighs run[:j]'s segmentations ending with a cut at j, c[j] sums
    their costs so weighted."""
    cost = {(k, k + 1): alone[k] for k in range(n)} | {s: fused[k] for k, s in enumerate(segments)}
    z, c = [jnp.float32(1.0)], [jnp.zeros(3)]
    for j in range(1, n + 1):
        zj, cj = 0.0, 0.0
        for i in range(max(0, j - MAX_MEMBERS), j):
            g = jnp.prod(p[i:j - 1]) * (1.0 - p[j - 1] if j < n else 1.0)
            zj, cj = zj + z[i] * g, cj + g * (c[i] + z[i] * cost[(i, j)])
        z.append(zj)
        c.append(cj)
    return c[n] / z[n]


def _segment_costs(chains, params, hw, smooth) -> list[list]:
    """Every chain's segments' (cycles, energy, violation), those whose members are of one kind each
    evaluated together (one vmapped cascade_cost: the kinds steer its Python, the rest are traced)."""
    groups = {}
    for k, chain in enumerate(chains):
        shapes = chain.shapes
        for s, (i, j) in enumerate(chain.segments()):
            groups.setdefault(tuple(int(L.kind) for L in shapes[i:j]), []).append((shapes[i:j], k, s))
    out = [[None] * len(chain.segments()) for chain in chains]
    for kinds, found in groups.items():
        members = [jax.tree.map(lambda *v: np.array(v, np.float32), *(f[0][q] for f in found))
                   for q in range(len(kinds))]
        thetas = jnp.stack([params["segments"][k][s] for _, k, s in found])

        def cost(Ls, theta, kinds=kinds):
            return segment_cost([replace(L, kind=kind) for L, kind in zip(Ls, kinds, strict=True)], theta, hw, smooth)
        costs = jax.vmap(cost)(members, thetas)
        for r, (_, k, s) in enumerate(found):
            out[k][s] = costs[r]
    return out


def chain_terms(chains, params, cycles, energy, hw, smooth, n_workloads: int):
    """(cycles, energy) per workload that fusion adds to the layers' own sums (negative: what it saves),
    and the violation of the segments, weighted by how likely each is; `cycles`, `energy`: each row's
    cost alone."""
    add = jnp.zeros((2, n_workloads))
    violation = jnp.float32(0.0)
    fused = _segment_costs(chains, params, hw, smooth)
    for chain, logits, costs in zip(chains, params["edges"], fused, strict=True):
        rows = jnp.asarray(chain.rows)
        alone = jnp.stack([cycles[rows], energy[rows], jnp.zeros(len(chain.rows))], -1)
        total = expected(len(chain.rows), chain.segments(), alone, costs, jax.nn.sigmoid(logits))
        add = add.at[:, chain.workload].add(total[:2] - alone[:, :2].sum(0))
        violation = violation + total[2]
    return add[0], add[1], violation
