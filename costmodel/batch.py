"""Batched exact evaluation, sharded over every local device with jax.sharding.

A batch of (layer, mapping) pairs is split along its one axis across a 1-D device mesh
(padded to a multiple of the device count); the constants are replicated, and so is the
hardware when it is one point.  A batch of hardware points (a HardwarePoint whose fields have
the batch's shape, `stack`ed: configs x layers flattened into one axis, as a sweep evaluates
them) is split with the pairs.  On one device it is a plain vmapped jit; on a host with many
(GPUs, or CPU devices from XLA_FLAGS=--xla_force_host_platform_device_count=N) each evaluates
its share.

    >>> import numpy as np
    >>> from stagec.costmodel.batch import evaluate
    >>> from stagec.costmodel.hardware import hardware_point
    >>> from stagec.costmodel.problem import layer_shape, mapping_arrays, stack
    >>> from stagec.isa import HardwareConfig
    >>> from stagec.lower.schedule.nest import ConvProblem, TileMapping
    >>> layers = stack([layer_shape("matrix", ConvProblem(1, 16, 8, 8, 32))] * 3)
    >>> maps = stack([mapping_arrays(TileMapping(8, 8, t, 16)) for t in (8, 16, 32)])
    >>> evaluate(layers, maps, hardware_point(HardwareConfig())).cycles.shape
    (3,)
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stagec.lower.schedule.nest import LayerShape, TileMapping

from .hardware import HardwarePoint
from .model import DEFAULT_CONSTANTS, CostConstants, LayerCost, layer_cost


@partial(jax.jit, static_argnames=("smooth", "hw_batched"))
def exact_cost(layers, mappings, hw, constants=DEFAULT_CONSTANTS, smooth: float = 0.0, *,
               hw_batched: bool = False) -> LayerCost:
    """The cost of each of a batch of pairs on the default device (smooth > 0: the relaxed model),
    on one hardware point or (hw_batched) on each pair's own."""
    return jax.vmap(lambda L, m, h: layer_cost(L, m, h, constants, smooth),
                    in_axes=(0, 0, 0 if hw_batched else None))(layers, mappings, hw)


def evaluate(layers: LayerShape, mappings: TileMapping, hw: HardwarePoint,
             constants: CostConstants = DEFAULT_CONSTANTS, devices=None, smooth: float = 0.0) -> LayerCost:
    """The cost of each of a batch of pairs (fields of shape (n,)), as numpy arrays, evaluated on
    `devices` (default: all local devices) in equal shares; `hw` one point, or one per pair
    (fields of shape (n,))."""
    devices = jax.local_devices() if devices is None else list(devices)
    n = int(np.shape(mappings.tile_oh)[0])
    pad = -n % len(devices)
    mesh = Mesh(np.array(devices), ("batch",))
    split, whole = NamedSharding(mesh, PartitionSpec("batch")), NamedSharding(mesh, PartitionSpec())

    def shard(tree):
        return jax.tree.map(lambda a: jax.device_put(np.pad(np.asarray(a, np.float32), (0, pad), mode="edge"), split),
                            tree)

    hw_batched = np.ndim(hw.array_rows) == 1
    out = exact_cost(shard(layers), shard(mappings), shard(hw) if hw_batched else jax.device_put(hw, whole),
                     jax.device_put(constants, whole), smooth, hw_batched=hw_batched)
    return jax.tree.map(lambda a: np.asarray(a)[:n], out)
