"""Lowering by property: any conv shape on any valid hardware compiles to a correct program;
fusion and liveness are checked in bytes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from helpers import rel_err
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import stagec
from stagec.errors import TilingError
from stagec.sim.plan import build_plan


def run(model, x, hw=None, fuse=True):
    program = stagec.compile(model, (x,), hw=hw, fuse=fuse)
    out, report = stagec.simulate(program, x)
    with torch.no_grad():
        ref = model(x).numpy()
    assert rel_err(out, ref) < 1e-4
    return program, report


hardware = st.builds(
    lambda rows, cols, spad_kib, acc_kib, lanes, dataflow: stagec.HardwareConfig(
        array_rows=rows, array_cols=cols, scratchpad_bytes=spad_kib * 1024, accumulator_bytes=acc_kib * 1024,
        vector_lanes=lanes, dataflow=dataflow, scratchpad_banks=1, accumulator_banks=1),
    st.sampled_from([2, 4, 8, 16, 32]), st.sampled_from([2, 4, 8, 16, 32]), st.sampled_from([8, 16, 64, 256]),
    st.sampled_from([2, 4, 16, 64]), st.sampled_from([1, 4, 16]), st.sampled_from(["weight_stationary",
                                                                                     "output_stationary"]))


@st.composite
def convs(draw):
    groups = draw(st.sampled_from([1, 2, 3]))
    cin = groups * draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["dense", "depthwise", "depthwise_x2"]))
    if kind != "dense":
        groups, cout = cin, cin * (2 if kind == "depthwise_x2" else 1)
    else:
        cout = groups * draw(st.integers(1, 5))
    k = draw(st.sampled_from([1, 2, 3, 5]))
    dilation = draw(st.integers(1, 2))
    pad = draw(st.integers(0, k // 2 + 1))
    size = draw(st.integers(dilation * (k - 1) + 1 - 2 * pad if dilation * (k - 1) + 1 > 2 * pad else 1, 14))
    size = max(size, dilation * (k - 1) + 1 - 2 * pad, 1)
    conv = nn.Conv2d(cin, cout, k, stride=draw(st.integers(1, 3)), padding=pad, dilation=dilation, groups=groups,
                     bias=draw(st.booleans()))
    return conv, (draw(st.integers(1, 2)), cin, size, size + draw(st.integers(0, 3)))


@settings(max_examples=6)   # each example compiles and simulates a program
@given(convs(), hardware)
def test_any_conv_on_any_hardware(conv_and_shape, hw):
    conv, shape = conv_and_shape
    model = nn.Sequential(conv, nn.ReLU()).eval()
    try:
        run(model, torch.randn(*shape), hw)
    except TilingError as e:   # only when not even a minimal tile fits, and then it says so
        assert "no tiling fits" in str(e) and "bytes of scratchpad" in str(e)
        assert hw.scratchpad_bytes <= 16 * 1024 or hw.accumulator_bytes <= 4 * 1024


def test_strided_pointwise_conv_loads_only_the_pixels_it_uses():
    torch.manual_seed(0)
    x = torch.randn(1, 16, 32, 30)
    program, report = run(nn.Conv2d(16, 32, 1, stride=(2, 3)).eval(), x)
    used = 16 * 16 * 10 * 4
    weights = 32 * 16 * 4 + 32 * 4
    assert report.actions.dram_read_bytes <= used + weights < x.numel() * 4 / 2


def test_nothing_fits_names_layer_and_bytes():
    hw = stagec.HardwareConfig(scratchpad_bytes=64, accumulator_bytes=64, scratchpad_banks=1, accumulator_banks=1)
    with pytest.raises(TilingError, match=r"conv.* \(conv\): no tiling fits the scratchpad: the smallest tiling, "
                                          r"tile\(.*\), needs \d+ bytes of scratchpad, which has 64"):
        stagec.compile(nn.Conv2d(3, 4, 5), (torch.randn(1, 3, 9, 9),), hw=hw)


def test_a_model_larger_than_dram_is_a_tiling_error_naming_the_bytes():
    # 64 KiB of DRAM, 128 KiB of weights: an error of the compile, not a program the verifier refuses
    with pytest.raises(TilingError, match=r"does not fit DRAM: it needs \d+ bytes \(131072 of weights.*the hardware "
                                          r"has 65536 \(HardwareConfig.dram_bytes\)"):
        stagec.compile(nn.Linear(256, 128, bias=False), (torch.randn(1, 256),),
                       hw=stagec.HardwareConfig(dram_bytes=2**16))


class Residual(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.b(torch.relu(self.a(x)))) + x)


def test_fusion_saves_the_round_trips_it_should():
    torch.manual_seed(0)
    model = Residual().eval()
    x = torch.randn(1, 16, 20, 20)
    fused, rf = run(model, x)
    unfused, ru = run(model, x, fuse=False)
    tensor = x.numel() * 4
    # Unfused, every elementwise op (bias a, relu, bias b, BN mul, BN add, residual add, relu) writes
    # its result and the next op reads it back: at least 2 tensors of traffic per op removed.
    saved = (ru.actions.dram_read_bytes + ru.actions.dram_write_bytes
             - rf.actions.dram_read_bytes - rf.actions.dram_write_bytes)
    assert saved >= 2 * 5 * tensor
    ops = [layer.op for layer in fused.layers]
    assert ops == ["conv", "conv"]   # bias, BN, ReLU and the residual add ride on the two convs


def test_liveness_reuses_dram():
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1)]
    program, _ = run(nn.Sequential(*layers).eval(), torch.randn(1, 8, 16, 16))
    tensor = 8 * 16 * 16 * 4
    assert program.metadata["activation_bytes"] == 11 * tensor          # every intermediate
    assert program.metadata["peak_activation_bytes"] <= 2 * tensor + 128  # two alive at a time


def test_transformer_block_in_jax():
    rng = np.random.default_rng(0)
    s, d, h = 8, 32, 2
    w = {k: (rng.standard_normal(shape) * 0.2).astype(np.float32)
         for k, shape in dict(q=(d, d), k=(d, d), v=(d, d), o=(d, d), up=(d, 2 * d), down=(2 * d, d)).items()}

    def layer_norm(x):
        m = x.mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)

    def block(x):
        y = layer_norm(x)
        q, k, v = ((y @ w[n]).reshape(s, h, d // h).transpose(1, 0, 2) for n in "qkv")
        a = jax.nn.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(d // h), axis=-1)
        x = x + (a @ v).transpose(1, 0, 2).reshape(s, d) @ w["o"]
        y = layer_norm(x) @ w["up"]
        return x + (jax.nn.gelu(y, approximate=True) + jax.nn.silu(y) + jax.nn.hard_swish(y)) @ w["down"]

    x = rng.standard_normal((s, d)).astype(np.float32)
    out, _ = stagec.simulate(stagec.compile(block, (x,)), x)
    assert rel_err(out, jax.jit(block)(x)) < 1e-4
    assert not np.isnan(jnp.asarray(out)).any()


def test_embedding_masks_and_integer_ops():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32)

    def f(ids, mask):
        e = jnp.take(table, ids, axis=0, mode="fill")                 # GATHER by runtime token ids
        s = jnp.where((mask > 0)[..., None], e * 2.0, -1e9)           # comparisons, select
        additive = (1.0 - mask.astype(jnp.float32)) * -10000.0        # int -> float conversion
        return s.sum(-1) + additive + jnp.maximum(ids, 3).astype(jnp.float32)

    ids = rng.integers(0, 50, (2, 7)).astype(np.int32)
    mask = (rng.random((2, 7)) > 0.3).astype(np.int32)
    program = stagec.compile(f, (ids, mask))
    assert any(layer.op == "gather" for layer in program.layers)
    out, _ = stagec.simulate(program, ids, mask)
    np.testing.assert_allclose(out, jax.jit(f)(ids, mask), rtol=1e-6)
    with pytest.raises(stagec.SimulationError, match=r"\(GATHER\): index 50 at position 3 is outside the table's 50"):
        stagec.simulate(program, np.where(np.arange(14).reshape(2, 7) == 3, 50, ids).astype(np.int32), mask)



def test_a_table_beyond_gathers_row_count_is_a_lowering_error_naming_the_layer():
    table = np.zeros((70_000, 2), np.float32)
    with pytest.raises(stagec.LoweringError, match=r"gather from a table of 70000 rows: GATHER indexes at most 65535"):
        stagec.compile(lambda ids: jnp.take(table, ids, axis=0), (np.zeros(3, np.int32),))

@pytest.mark.parametrize("module", [nn.Sequential(nn.Conv2d(8, 24, 3, padding=1), nn.ReLU()),
                                    nn.Conv2d(8, 24, 1, bias=False)])
def test_single_accumulator_tile_matches_torch(module):
    """One accumulator tile (the epilogue, or a COPY, moves each result to the scratchpad)."""
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    torch.manual_seed(0)
    x = torch.randn(1, 8, 10, 10)
    (layer,) = model_layers(model_graph(module.eval(), (x,)))
    m = TileMapping(5, 10, 16, 8, double_buffer=True, single_acc=True)
    program = stagec.compile(module, (x,), mappings={layer.name: m})
    assert "1-acc" in str(m) and m.acc_buffers == 1
    y, _ = stagec.simulate(program, x)
    assert rel_err(np.asarray(y), module(x).detach().numpy()) < 1e-5


class _ConvResidual(nn.Module):
    """A conv whose epilogue has a per-channel operand (bias), a full tile (the residual) and ReLU."""

    def __init__(self, c, o, k, stride, padding, dilation):
        super().__init__()
        self.conv = nn.Conv2d(c, o, k, stride, padding, dilation)

    def forward(self, x, residual):
        return torch.relu(self.conv(x) + residual)


@settings(max_examples=6)   # each example compiles and simulates a program
@given(k=st.sampled_from([1, 3, 5]), stride=st.sampled_from([(1, 1), (2, 2), (2, 1)]), dilation=st.integers(1, 2),
       padding=st.integers(0, 2), c=st.integers(1, 20), o=st.integers(2, 40), size=st.integers(1, 9),
       tile=st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(1, 40), st.integers(1, 20)),
       single_acc=st.booleans(), double_buffer=st.booleans())
def test_transposed_mappings_match_torch(k, stride, dilation, padding, c, o, size, tile, single_acc, double_buffer):
    """Operands swapped (output channels streamed, each tile's pixels a line through its halo), with
    edge tiles, padding, dilation, strides and a fused epilogue, against PyTorch."""
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    torch.manual_seed(0)
    module = _ConvResidual(c, o, k, stride, padding, dilation).eval()
    x = torch.randn(1, c, size + dilation * (k - 1), size + dilation * (k - 1))
    args = (x, torch.randn(module.conv(x).shape))
    (conv,) = model_layers(model_graph(module, args))
    p = conv.problem
    th, tw, to, tc = min(tile[0], p.oh), min(tile[1], p.ow), min(tile[2], o), min(tile[3], c)
    m = TileMapping(th, tw, to, tc, double_buffer, False, single_acc and double_buffer, transposed=True)
    program = stagec.compile(module, args, mappings={conv.name: m})
    build_plan(program)           # the batched executor runs it (no fallback to the reference interpreter)
    y, _ = stagec.simulate(program, *args)
    assert rel_err(np.asarray(y), module(*args).detach().numpy()) < 1e-5


@pytest.mark.parametrize("conv, size, switch, gain", [
    # 7x7 pixels and 2048 channels: streaming the channels beats streaming 49 rows per fold (by less
    # than the folds alone say: such a layer is close to bound by its weights' DRAM traffic)
    (nn.Conv2d(512, 2048, 1), 7, "transposed", 0.9),
    # a 7x7 kernel over 3 channels: a kernel row is 21 of k (2 row folds of 16, a third idle);
    # stacked, the kernel's 147 fill 10 row folds
    (nn.Conv2d(3, 64, 7, 2, 3), 64, "stacked", 0.85),
])
def test_mapper_picks_the_switch_and_the_simulator_agrees(conv, size, switch, gain):
    """The mapper turns the switch on where it pays, and the simulator confirms it against the same
    tiles without it."""
    from stagec.layers import measure, model_graph, model_layers
    from stagec.lower.schedule.nest_map import map_conv
    torch.manual_seed(0)
    module = nn.Sequential(conv, nn.ReLU()).eval()
    x = torch.randn(1, conv.in_channels, size, size)
    graph = model_graph(module, (x,))
    (layer,) = model_layers(graph)
    hw = stagec.HardwareConfig()
    chosen = map_conv(layer.problem, hw, layer.extras)
    assert getattr(chosen, switch)
    without = dataclasses.replace(chosen, **{switch: False})
    assert measure(graph, layer, chosen, hw)[0] < gain * measure(graph, layer, without, hw)[0]


def test_transposed_mapping_of_a_layer_that_cannot_turn_is_rejected():
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    module = nn.Conv2d(4, 8, 3, stride=(1, 2))
    x = torch.randn(1, 4, 9, 9)
    (layer,) = model_layers(model_graph(module, (x,)))
    with pytest.raises(TilingError, match="transposed, which needs a matrix-unit op whose row stride is a multiple"):
        stagec.compile(module, (x,), mappings={layer.name: TileMapping(2, 2, 8, 4, transposed=True)})


@settings(max_examples=6)   # each example compiles and simulates a program
@given(k=st.sampled_from([2, 3, 7]), stride=st.sampled_from([(1, 1), (2, 2), (1, 2)]), padding=st.integers(0, 4),
       c=st.integers(1, 8), o=st.integers(2, 24), size=st.integers(1, 9),
       tile=st.tuples(st.integers(1, 5), st.integers(1, 6), st.integers(1, 24), st.integers(1, 8)),
       double_buffer=st.booleans(), resident=st.booleans())
def test_stacked_mappings_match_torch(k, stride, padding, c, o, size, tile, double_buffer, resident):
    """Each output row's kernel rows LOADed side by side and one MATMUL over the whole kernel, with
    edge tiles, padding (kernel rows wholly in it filled with zeros), strides and an epilogue."""
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    torch.manual_seed(0)
    module = _ConvResidual(c, o, k, stride, padding, 1).eval()
    x = torch.randn(1, c, size + k - 1, size + k - 1)
    args = (x, torch.randn(module.conv(x).shape))
    (conv,) = model_layers(model_graph(module, args))
    p = conv.problem
    th, tw, to = min(tile[0], p.oh), min(tile[1], p.ow), min(tile[2], o)
    tc = c if resident else min(tile[3], c)
    m = TileMapping(th, tw, to, tc, double_buffer, resident, stacked=True)
    program = stagec.compile(module, args, mappings={conv.name: m})
    build_plan(program)           # the batched executor runs it: a tile's MATMUL reads its rows' LOADs as one value
    y, _ = stagec.simulate(program, *args)
    assert rel_err(np.asarray(y), module(*args).detach().numpy()) < 1e-5


def test_stacked_mapping_of_a_dilated_kernel_is_rejected():
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    module = nn.Conv2d(4, 8, 3, dilation=2)
    x = torch.randn(1, 4, 9, 9)
    (layer,) = model_layers(model_graph(module, (x,)))
    with pytest.raises(TilingError, match="is stacked, which needs an undilated matrix-unit kernel of several rows"):
        stagec.compile(module, (x,), mappings={layer.name: TileMapping(2, 2, 8, 4, stacked=True)})


@pytest.mark.parametrize("transposed, single_acc, double_buffer", [(False, False, True), (False, True, True),
                                                                    (True, False, True), (False, False, False)])
def test_a_nest_of_one_spatial_tile_loads_its_halo_once_and_channel_vectors_per_tile(transposed, single_acc,
                                                                                     double_buffer):
    """One spatial tile: one halo buffer, and the bias loaded a channel tile at a time (nest_work.one_spatial_tile),
    with the residual and ReLU in the epilogue, against PyTorch."""
    from stagec.isa.instructions import Opcode
    from stagec.layers import model_graph, model_layers
    from stagec.lower.schedule.nest import TileMapping
    torch.manual_seed(0)
    module = _ConvResidual(12, 40, 3, (1, 1), 1, 1).eval()
    x = torch.randn(1, 12, 5, 6)
    args = (x, torch.randn(1, 40, 5, 6))
    (conv,) = model_layers(model_graph(module, args))
    m = TileMapping(5, 6, 16, 12, double_buffer, False, single_acc and double_buffer, transposed)
    program = stagec.compile(module, args, mappings={conv.name: m})
    build_plan(program)
    loads = program.code[program.code["opcode"] == Opcode.LOAD]
    assert loads["pad"].any(axis=1).sum() == 1                      # the halo, once
    assert sorted(map(tuple, loads["n"][:, :3])).count((1, 1, 16)) == 2   # the bias: channels 0-15, 16-31, 32-39
    assert sorted(map(tuple, loads["n"][:, :3])).count((1, 1, 8)) == 1
    y, _ = stagec.simulate(program, *args)
    assert rel_err(np.asarray(y), module(*args).detach().numpy()) < 1e-5


def test_mapper_keeps_a_whole_layer_in_one_spatial_tile_and_the_simulator_agrees():
    """ResNet-50's stage-3 expand conv (1x1, 256 -> 1024 over 14 x 14, bias + residual + ReLU): with one
    halo buffer and the bias a tile at a time, all 196 pixels fit one tile, so each fold streams 196
    rows and the weights are read once, against 98 rows and twice."""
    from stagec.layers import measure, model_graph, model_layers
    from stagec.lower.schedule.nest import LayerShape
    from stagec.lower.schedule.nest_map import map_conv
    from stagec.lower.schedule.nest_work import one_spatial_tile
    torch.manual_seed(0)
    module = _ConvResidual(256, 1024, 1, (1, 1), 0, 1).eval()
    args = (torch.randn(1, 256, 14, 14), torch.randn(1, 1024, 14, 14))
    graph = model_graph(module, args)
    (layer,) = model_layers(graph)
    hw = stagec.HardwareConfig()
    chosen = map_conv(layer.problem, hw, layer.extras)
    assert one_spatial_tile(LayerShape.of("matrix", layer.problem), chosen, np)
    halves = dataclasses.replace(chosen, tile_oh=7)
    assert measure(graph, layer, chosen, hw)[0] < 0.9 * measure(graph, layer, halves, hw)[0]
