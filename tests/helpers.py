import numpy as np
import torch


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref|: error relative to the reference's scale."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


# Reference evaluation of traced models in tests: compiling is most of the cost of a one-off
# call, and XLA's backend optimizations (which do not change the arithmetic) dominate compiling.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def evaluate(traced, args, kwargs=None):
    """A TracedModel's jaxpr evaluated by JAX on the model's own inputs, in its own output structure."""
    import jax
    from jax.extend.core import jaxpr_as_fun

    from stagec.frontend import flatten_inputs, unflatten_outputs
    flat = flatten_inputs(traced, args, kwargs)
    outputs = jax.jit(jaxpr_as_fun(traced.closed)).lower(*flat).compile(compiler_options=FAST_COMPILE)(*flat)
    return unflatten_outputs(traced.out_tree, [np.asarray(o) for o in outputs])



def simulated(model, args, **options):
    """(program, output, report) of `model` compiled with `options` and simulated on `args` (a tensor
    or a tuple of them)."""
    import stagec
    args = args if isinstance(args, tuple) else (args,)
    program = stagec.compile(model, args, **options)
    y, report = stagec.simulate(program, *args)
    return program, np.asarray(y), report


def check_fused_against_unfused(model, x, hw):
    """A model fused (split where it must be) and layer by layer on `hw`: the outputs agree within 1e-5
    and with PyTorch, and every cascade fits the memories."""
    program, y, _ = simulated(model, x, hw=hw)
    _, y_alone, _ = simulated(model, x, hw=hw, fuse_layers=False)
    assert rel_err(y, y_alone) <= 1e-5 and rel_err(y, model(x).detach().numpy()) < 1e-5
    for cascade in program.metadata.get("cascades", ()):
        spad, acc = program.metadata["local_peak_bytes"][cascade["layers"][0]]
        assert spad <= hw.scratchpad_bytes and acc <= hw.accumulator_bytes


def check_cascade_cost(c, cascade, hw, cycles: float = 0.15):
    """A cascade's cost (lower.schedule.cascade.cascade_cost) against compilation `c`'s program, of that
    cascade alone: DRAM bytes, vector ops, MACs, instructions and the footprint exact, cycles within
    `cycles` of the timed simulation, energy within 2%."""
    import pytest

    from stagec.lower.schedule.cascade import cascade_cost
    from stagec.lower.schedule.nest import Exact, LayerShape
    from stagec.report import make_report
    from stagec.sim.energy import energy_pj
    shapes = [LayerShape.of(*c.schedule[name].nests[0]) for name in cascade.layers]
    cost = cascade_cost(shapes, list(cascade.mappings), hw, Exact, cascade.chunk is not None, cascade.line)
    report = make_report(c.program)
    for action in ("dram_read_bytes", "dram_write_bytes", "vector_ops", "macs_fp32"):
        assert getattr(cost.actions, action) == getattr(report.actions, action), action
    assert cost.instructions == len(c.program)
    assert cost.cycles == pytest.approx(report.cycles, rel=cycles)
    energy = sum(energy_pj(cost.actions, report.cycles, hw).values())
    assert energy == pytest.approx(sum(report.energy_pj.values()), rel=0.02)
    assert tuple(c.program.metadata["local_peak_bytes"][cascade.layers[0]]) == (cost.spad_bytes, cost.acc_bytes)


def linear_across_a_rounding_tie():
    """(int8 Linear model, its calibration, its quantized graph, x_below, x_above): x_below[0, 1] lies
    just below a rounding boundary of the QUANTIZE of the model's input, x_above one fp32 ulp above it --
    two inputs that an fp32 rounding apart quantize one int8 step apart."""
    import torch

    from stagec import int8_reference
    from stagec.pipeline import build_graph
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 3).eval(), torch.randn(2, 4)
    calibration = [(torch.randn(2, 4) * 2,)]
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration)
    (quantize,) = [n for n in graph.nodes if n.inputs[0] == graph.inputs[0] and n.output.dtype == "int8"]
    scale, record = (graph.constants[v.id] for v in quantize.inputs[1:])
    # where requantizing trunc(x * scale) steps up: the first boundary above x[0, 1]'s own
    start = int(x[0, 1] * scale)
    steps = int8_reference.requantize(np.arange(start, start + 2**16), record)
    boundary = start + int(np.flatnonzero(np.diff(steps))[0]) + 1
    below = np.float32(boundary / scale)
    while np.float32(below * scale) >= boundary:
        below = np.nextafter(below, np.float32(-np.inf))
    x_below, x_above = x.numpy().copy(), x.numpy().copy()
    x_below[0, 1], x_above[0, 1] = below, np.nextafter(below, np.float32(np.inf))
    return model, calibration, graph, x_below, x_above


class TwoConvs(torch.nn.Module):
    """A 3x3 conv, ReLU, a 1x1 conv: the tuner's and co-design's small model."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 24, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def seeded_graph(module, shape):
    """The graph of `module` (in eval mode) on a seeded random input of `shape`."""
    from stagec.layers import model_graph
    torch.manual_seed(0)
    return model_graph(module.eval(), (torch.randn(*shape),))


def vector_busy(program, layers, hw) -> float:
    """Cycles the timing simulator charges the vector unit for the VECTOR instructions of `layers` (names)."""
    from stagec.sim.costs import instruction_shapes, unit_cycles, unit_parameters

    ids = [i for i, layer in enumerate(program.layers) if layer.name in set(layers)]
    shapes = instruction_shapes(program.code)
    occupancy, _ = unit_cycles(shapes, unit_parameters(hw))
    return float(occupancy[np.isin(program.layer_ids, ids) & shapes.is_vector].sum())
