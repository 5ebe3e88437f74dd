"""Legal tiling as an invariant: on any hardware config, every layer either compiles to a program
whose local buffers fit, byte for byte the footprint the mapper checked, and which computes what
PyTorch does (int8: the integer reference), or compile raises a TilingError that names the
layer, the memory, the bytes its smallest tiling needs and the memory's capacity."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import rel_err
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import stagec
from stagec import int8_reference
from stagec.errors import QuantizationError, TilingError
from stagec.isa.verify import verify
from stagec.lower.codegen.vector import LayoutViews, VectorNest
from stagec.lower.schedule.layout import assign_layout
from stagec.lower.schedule.mapper import layer_nests, make_schedule
from stagec.lower.schedule.nest import TileMapping
from stagec.lower.schedule.pack import pack_depthwise
from stagec.pipeline import build_graph, lower_graph
from stagec.sim import reference

ACTIVATIONS = {"relu": torch.relu, "relu6": nn.functional.relu6, "gelu": nn.functional.gelu,
               "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardswish": nn.functional.hardswish}


class Epilogued(nn.Module):
    """`layer` (taking the first `layer_inputs` inputs) followed by elementwise steps the compiler
    fuses into it where it can: activations, and adds or multiplies by a parameter (per channel, a
    scalar, or whole) or by a further input."""

    def __init__(self, layer, layer_inputs: int, steps, param_shapes):
        super().__init__()
        self.layer, self.layer_inputs, self.steps = layer, layer_inputs, steps
        self.params = nn.ParameterList([nn.Parameter(torch.randn(*s)) for s in param_shapes])

    def forward(self, *inputs):
        y = self.layer(*inputs[:self.layer_inputs])
        others = inputs[self.layer_inputs:]
        for op, arg in self.steps:
            if op == "act":
                y = ACTIVATIONS[arg](y)
            else:
                operand = self.params[arg] if op.endswith("param") else others[arg]
                y = y + operand if op.startswith("add") else y * operand
        return y


class BatchedMatmul(nn.Module):
    def forward(self, a, b):
        return a @ b


class Chain(nn.Module):
    FUNCS = {"exp": lambda t: torch.exp(0.1 * t), "neg": torch.neg, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
             "add": lambda t: t + 1.5, "scale": lambda t: t * 0.75, "square": lambda t: t * t}

    def __init__(self, funcs):
        super().__init__()
        self.funcs = funcs

    def forward(self, x):
        for f in self.funcs:
            x = self.FUNCS[f](x)
        return x


class Reduction(nn.Module):
    def __init__(self, func, dim):
        super().__init__()
        self.func, self.dim = func, dim

    def forward(self, x):
        if self.func == "softmax":
            return torch.softmax(x, self.dim)
        if self.func == "layer_norm":
            return nn.functional.layer_norm(x, x.shape[-1:])
        return getattr(x, self.func)(self.dim, keepdim=True)


@st.composite
def convs(draw):
    """Dense, grouped and depthwise convs with stride, dilation and padding: (module, input shapes)."""
    cin = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["dense", "grouped", "depthwise"]))
    groups = {"dense": 1, "depthwise": cin,
              "grouped": draw(st.sampled_from([g for g in range(1, cin + 1) if cin % g == 0]))}[kind]
    cout = cin * draw(st.sampled_from([1, 2])) if kind == "depthwise" else groups * draw(st.integers(1, 8 // groups))
    k, dilation, stride = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2])), draw(st.integers(1, 3))
    pad = draw(st.integers(0, dilation * (k // 2) + 1))
    least = max(1, dilation * (k - 1) + 1 - 2 * pad)
    shape = (draw(st.sampled_from([1, 2])), cin, draw(st.integers(least, 9)), draw(st.integers(least, 9)))
    return nn.Conv2d(cin, cout, k, stride, pad, dilation, groups, bias=draw(st.booleans())), [shape]


@st.composite
def matmuls(draw):
    """Linear layers over 2-D and 3-D inputs, and batched matmuls of two inputs."""
    m, k, n = draw(st.integers(1, 12)), draw(st.integers(1, 24)), draw(st.integers(1, 24))
    if draw(st.booleans()):
        return BatchedMatmul(), [(draw(st.integers(1, 3)), m, k), (None, k, n)]
    lead = draw(st.sampled_from([(), (2,)]))
    return nn.Linear(k, n, bias=draw(st.booleans())), [(*lead, m, k)]


@st.composite
def vector_ops(draw):
    """Pools, elementwise chains and reductions (softmax and layer norm among them)."""
    kind = draw(st.sampled_from(["pool", "chain", "reduce"]))
    if kind == "pool":
        k, stride = draw(st.integers(1, 3)), draw(st.integers(1, 3))
        pool = nn.MaxPool2d if draw(st.booleans()) else nn.AvgPool2d
        return pool(k, stride, draw(st.integers(0, k // 2))), [(1, draw(st.integers(1, 8)), draw(st.integers(k, 9)),
                                                                draw(st.integers(k, 9)))]
    shape = tuple(draw(st.lists(st.integers(1, 8), min_size=2, max_size=4)))
    if kind == "chain":
        return Chain(draw(st.lists(st.sampled_from(sorted(Chain.FUNCS)), min_size=1, max_size=3))), [shape]
    func = draw(st.sampled_from(["softmax", "layer_norm", "sum", "mean", "amax"]))
    return Reduction(func, draw(st.integers(-len(shape), len(shape) - 1))), [shape]


@st.composite
def epilogued(draw, layers):
    """A layer from `layers` with 0-3 epilogue steps: (module, input shapes)."""
    layer, shapes = draw(layers)
    if len(shapes) == 2:   # a batched matmul's second operand takes the first's batch
        shapes[1] = (shapes[0][0], *shapes[1][1:])
    with torch.no_grad():
        out = tuple(layer(*(torch.randn(*s) for s in shapes)).shape)
    axis = 1 if isinstance(layer, nn.Conv2d | nn.MaxPool2d | nn.AvgPool2d) else len(out) - 1
    per_channel = out[axis:axis + 1] + (1,) * (len(out) - axis - 1)
    steps, params, inputs = [], [], []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["act", "add_param", "mul_param", "add_input", "mul_input"]))
        if op == "act":
            steps.append((op, draw(st.sampled_from(sorted(ACTIVATIONS)))))
        elif op.endswith("param"):
            steps.append((op, len(params)))
            params.append(draw(st.sampled_from([per_channel, (1,), out])))
        else:
            steps.append((op, len(inputs)))
            inputs.append(out)
    return Epilogued(layer, len(shapes), steps, params).eval(), shapes + inputs


def sizes(lo: int, hi: int):
    """Memory sizes from 2**lo to 2**hi bytes: powers of two and 64-byte multiples between."""
    return st.one_of(st.sampled_from([1 << k for k in range(lo, hi + 1)]),
                     st.integers(1 << (lo - 6), 1 << (hi - 6)).map(lambda n: 64 * n))


hardware = st.builds(
    lambda rows, cols, spad, acc, spad_banks, acc_banks, lanes, dataflow: stagec.HardwareConfig(
        array_rows=rows, array_cols=cols, scratchpad_bytes=spad, accumulator_bytes=acc, scratchpad_banks=spad_banks,
        accumulator_banks=acc_banks, vector_lanes=lanes, dataflow=dataflow),
    st.sampled_from([1, 2, 3, 8, 16, 64]), st.sampled_from([1, 2, 5, 8, 16, 64]), sizes(6, 18), sizes(6, 16),
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 16, 64]),
    st.sampled_from(["weight_stationary", "output_stationary"]))

MAPPING = r"tile\([^)]*\)( [\w-]+)*"   # a TileMapping as printed
NOTHING_FITS = re.compile(rf"^(?P<layer>\S+) \((?P<op>\w+)\): no tiling fits the (?P<memory>scratchpad|accumulator): "
                          r"the smallest tiling( \(of those that fit the (scratchpad|accumulator)'s \d+ bytes\))?, "
                          rf"{MAPPING}, needs (?P<need>\d+) bytes of (?P=memory), which has (?P<capacity>\d+)$")


MAPPING_TOO_BIG = re.compile(rf"^\S+ \(\w+\): mapping {MAPPING} needs (?P<spad>\d+) bytes of scratchpad \(has \d+\) "
                             r"and (?P<acc>\d+) bytes of accumulator \(has \d+\)$")


def compiles_legally_or_says_why(model, shapes, hw, precision, choose=None):
    """The invariant, for one model: a program whose every nest's local buffers fit, as many bytes
    as the mapper's footprint of its mapping, and whose outputs are PyTorch's (int8: the integer
    reference's); or a TilingError that says where and why.  `choose(graph)` may give mappings
    of its own for its layers (checked to fit, else the error says by how much)."""
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=gen) for s in shapes]
    options = {"quantize": "int8", "calibration": [tuple(torch.randn(*s, generator=gen) for s in shapes)
                                                   for _ in range(2)]} if precision == "int8" else {}
    try:
        _, graph = build_graph(model, tuple(args), **options)
    except QuantizationError:   # a range int8 cannot hold (a dead ReLU): tested in test_int8
        assume(False)
    mappings = None
    try:   # compile's stages after the graph (stagec.compile)
        graph = pack_depthwise(graph, hw)
        mappings = choose(graph) if choose else None
        program = lower_graph(graph, hw, mappings)
    except TilingError as e:
        if mappings and (too_big := MAPPING_TOO_BIG.match(str(e))):
            assert int(too_big["spad"]) > hw.scratchpad_bytes or int(too_big["acc"]) > hw.accumulator_bytes
            return None
        found = NOTHING_FITS.match(str(e))
        assert found, str(e)
        assert found["layer"] in {n.name for n in graph.nodes}
        capacity = hw.scratchpad_bytes if found["memory"] == "scratchpad" else hw.accumulator_bytes
        assert int(found["capacity"]) == capacity < int(found["need"])
        return None
    schedule = make_schedule(graph, assign_layout(graph), hw, mappings)
    peaks = program.metadata["local_peak_bytes"]
    assert all(spad <= hw.scratchpad_bytes and acc <= hw.accumulator_bytes for spad, acc in peaks.values())
    assert [name for name, _ in schedule.tilings] == list(peaks)   # every layer of the program, vector ops too
    for name, tiling in schedule.tilings:   # each layer's high-water marks: its largest nest's
        footprints = [nest.footprint(m) for nest, m in zip(tiling.nests, tiling.mappings, strict=True)]
        assert tuple(peaks[name]) == tuple(max(int(f[i]) for f in footprints) for i in range(2)), name
    # the ISA's reference interpreter, after the verifier (addresses in bounds among its checks): the
    # definition the batched simulator is tested against, and a hundred times faster on programs this size
    verify(program)
    (output,) = reference.execute(program, [a.numpy() for a in args])
    if precision == "int8":   # integer steps bit for bit; float32 ones (after a dequantize) to rounding
        assert rel_err(output, int8_reference.run(graph, [a.numpy() for a in args])[0]) < 1e-5
    else:
        with torch.no_grad():
            assert rel_err(output, model(*args).numpy()) < 1e-4
    return program


def any_mapping(data, nest) -> TileMapping:
    """A mapping of a nest drawn from all it may be: tile sizes up to the dims, every switch it has
    (a vector-unit nest: double buffering)."""
    def size(dim):
        return data.draw(st.integers(1, dim))
    if isinstance(nest, VectorNest):
        return TileMapping(*(size(d) for d in nest.space), 1, data.draw(st.booleans()))
    kind, p, _ = nest
    th, tw, to, tc = size(p.oh), size(p.ow), size(p.o), size(p.c) if kind == "matrix" else 1
    db = data.draw(st.booleans())
    if kind != "matrix":
        return TileMapping(th, tw, to, tc, db)
    transposed = p.turns and data.draw(st.booleans())
    return TileMapping(th, tw, to, tc, db, data.draw(st.booleans()), db and data.draw(st.booleans()), transposed,
                       p.stacks and not transposed and data.draw(st.booleans()))


@given(epilogued(st.one_of(convs(), matmuls())), hardware, st.sampled_from(["fp32", "int8"]))
def test_matrix_unit_layers_fit_or_raise_a_tiling_error(net, hw, precision):
    compiles_legally_or_says_why(*net, hw, precision)


@given(epilogued(vector_ops()), hardware, st.sampled_from(["fp32", "int8"]))
def test_vector_unit_layers_fit_or_raise_a_tiling_error(net, hw, precision):
    compiles_legally_or_says_why(*net, hw, precision)


@settings(max_examples=6)   # each example compiles and simulates a program
@given(epilogued(st.one_of(convs(), matmuls(), vector_ops())), hardware, st.sampled_from(["fp32", "int8"]), st.data())
def test_every_mapping_runs_in_its_footprint_or_is_refused(net, hw, precision, data):
    """Mappings of every shape and switch (transposed, stacked, one accumulator tile, resident
    weights, single-buffered), not only those the default mapper picks, of every nest (vector
    ops' too: one mapping for a layer of one nest, one per nest for a pad or a concat): each one
    the schedule accepts allocates its footprint and computes the layer."""
    def choose(graph):
        layout, views = assign_layout(graph), LayoutViews(assign_layout(graph))
        chosen = {node.name: tuple(any_mapping(data, nest) for nest in layer_nests(node, views, hw))
                  for node in graph.nodes if layout.emits(node)}
        return {name: ms[0] if len(ms) == 1 else ms for name, ms in chosen.items()}
    compiles_legally_or_says_why(*net, hw, precision, choose)


class ConvResidualGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return nn.functional.gelu(self.conv(x) + x)


def test_a_fused_epilogue_counts_every_buffer_it_allocates():
    """A 1x1 conv with a residual add and GELU on 4 KiB memories: the mapper counted GELU's constants
    as writable tiles and left out the temporary they then need, so the emitter overflowed the
    scratchpad (needs 5504 bytes, has 4096)."""
    torch.manual_seed(0)
    hw = stagec.HardwareConfig(scratchpad_bytes=4096, accumulator_bytes=4096)
    model, x = ConvResidualGelu().eval(), torch.randn(1, 16, 32, 32)
    program = compiles_legally_or_says_why(model, [x.shape], hw, "fp32")
    with torch.no_grad():   # and in the batched simulator, as stagec runs it
        assert rel_err(stagec.simulate(program, x)[0], model(x).numpy()) < 1e-4


@pytest.mark.parametrize("model, shape, memories, op, need", [
    # one output pixel: its 5x5 halo, its weights, the 4-channel bias whole
    (nn.Conv2d(3, 4, 5), (1, 3, 9, 9), (64, 64), "conv", (25 + 25 + 4) * 4),
    # depthwise: on the vector unit, or packed onto the array (its bias as the conv's)
    (nn.Conv2d(2, 2, 5, groups=2), (1, 2, 9, 9), (64, 64), "conv", (25 + 25 + 2) * 4),
    (nn.MaxPool2d(5), (1, 2, 9, 9), (64, 64), "pool", 25 * 4),
    # one tile of all 64 pixels loads the bias a channel at a time: input, weight and bias of one channel
    (nn.Conv2d(1, 256, 1), (1, 1, 8, 8), (256, 4096), "conv", (64 + 1 + 1) * 4),
    # which the accumulator cannot hold: then the bias is whole, beside one pixel's input and weight
    (nn.Conv2d(1, 256, 1), (1, 1, 8, 8), (256, 64), "conv", (1 + 1 + 256) * 4),
])
def test_nothing_fits_names_the_layer_the_memory_the_bytes_and_the_capacity(model, shape, memories, op, need):
    hw = stagec.HardwareConfig(scratchpad_bytes=memories[0], accumulator_bytes=memories[1], scratchpad_banks=1,
                               accumulator_banks=1)
    with pytest.raises(TilingError) as e:
        stagec.compile(model.eval(), (torch.randn(*shape),), hw=hw)
    found = NOTHING_FITS.match(str(e.value))
    assert found, str(e.value)
    assert (found["op"], found["memory"], int(found["need"]), int(found["capacity"])) == (
        op, "scratchpad", need, hw.scratchpad_bytes)


@pytest.mark.parametrize("stacked", [False, True])
def test_resident_weights_with_the_channels_split_across_tiles(stacked):
    """Resident weights over several channel tiles: a MATMUL's k covers a kernel row's taps (or the
    whole kernel's, stacked) over one channel tile, so the weights are held tile after tile; held
    as [taps][all channels][O], the second tap of each row read another channel's weights."""
    from stagec.layers import layer_program, model_graph, model_layers
    torch.manual_seed(0)
    conv, x = nn.Conv2d(3, 6, 2, stride=2, bias=False).eval(), torch.randn(1, 3, 4, 5)
    graph = model_graph(conv, (x,))
    (layer,) = model_layers(graph)
    mapping = TileMapping(1, 2, 6, 2, weights_resident=True, stacked=stacked)
    (y,), _ = stagec.simulate(layer_program(graph, layer, mapping, stagec.HardwareConfig()), x.numpy())
    with torch.no_grad():
        assert rel_err(y, conv(x).numpy()) < 1e-5
