"""compile(..., quantize="bf16"): bf16 activations and weights, against PyTorch eager in fp32 and in
bf16, against the bf16 graph's own evaluation, and priced at two bytes an element."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec.errors import InputError, ReferenceFallbackWarning
from stagec.lower.graph.evaluate import evaluate
from stagec.pipeline import build_graph
from stagec.precision import max_relative_error
from stagec.sim.reference import execute as reference


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def small_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU6(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 24, 1), nn.GELU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10))
    for m in model.modules():   # batch norm with statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval(), (torch.randn(2, 3, 16, 16),)


def transformer_layer():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, activation="gelu").eval()
    return layer, (torch.randn(2, 8, 32),)


def simulated(program, args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceFallbackWarning)   # the batched executor runs bf16
        out, report = stagec.simulate(program, *args)
    return np.asarray(out), report


@pytest.mark.parametrize("build", [small_cnn, transformer_layer])
def test_bf16_compile_matches_pytorch(build):
    """Against fp32 eager: bf16 rounds each stored value by at most 2**-9 relative, a few layers deep,
    so a max error of 1% of the output's scale and a cosine >= 0.999.  Against PyTorch's own bf16
    (the model and input in torch.bfloat16), stagec's error is no larger than twice torch's: it
    rounds where torch does or less often (fused epilogues, float32 accumulators)."""
    model, args = build()
    with torch.no_grad():
        want = model(*args).numpy()
        torch_bf16 = model.to(torch.bfloat16)(*(a.to(torch.bfloat16) for a in args)).float().numpy()
        model.float()
    program = stagec.compile(model, args, quantize="bf16")
    got, report = simulated(program, args)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert cosine(got, want) >= 0.999
    assert max_relative_error(got, want) <= 1e-2
    assert max_relative_error(got, want) <= 2 * max_relative_error(torch_bf16, want)
    assert report.actions.macs_bf16 > 0 and report.actions.macs_fp32 == 0
    assert "bf16" in report.summary() and all(layer["precision"] in (None, "bf16")
                                               for layer in report.to_dict()["layers"])


def test_the_simulator_computes_what_the_bf16_graph_says():
    """The bf16 graph evaluated (lower.graph.evaluate: float32 arithmetic, bf16 results rounded once),
    the batched executor and the reference interpreter agree to float32 summation order: a value
    may round to the neighbouring bf16, a unit of 2**-8 relative, and carry that on."""
    model, args = small_cnn()
    _, graph = build_graph(model, args, quantize="bf16")
    assert any(v.dtype == "bfloat16" for n in graph.nodes for v in (n.output,))
    assert all(v.dtype == "float32" for v in (*graph.inputs, *graph.outputs))
    (expect,) = evaluate(graph, args[0].numpy())
    program = stagec.compile(model, args, quantize="bf16")
    got, _ = simulated(program, args)
    (ref,) = reference(program, [args[0].numpy()])
    assert max_relative_error(got, expect) <= 2**-7
    assert max_relative_error(ref.reshape(got.shape), got) <= 2**-7


def first_conv(report):
    return next(layer for layer in report.layers if layer.op == "conv")


def test_a_bf16_conv_moves_half_the_dram_bytes_of_fp32_and_charges_bf16_macs():
    """The first of two convs: bf16 input, weights and output (the second writes the model's float32)."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 8, 1)).eval()
    args = (torch.randn(1, 32, 24, 24),)
    fp32 = simulated(stagec.compile(model, args), args)[1]
    bf16 = simulated(stagec.compile(model, args, quantize="bf16"), args)[1]
    conv16, conv32 = first_conv(bf16), first_conv(fp32)
    dram = [c.actions.dram_read_bytes + c.actions.dram_write_bytes for c in (conv16, conv32)]
    assert 0.45 <= dram[0] / dram[1] <= 0.55
    assert conv16.actions.macs_bf16 == conv32.actions.macs_fp32 == conv32.macs
    assert conv16.energy_pj["mac"] == pytest.approx(conv32.energy_pj["mac"] * bf16.hw.energy_pj_per_mac_bf16
                                                    / bf16.hw.energy_pj_per_mac_fp32)


def test_the_schedule_prices_a_bf16_conv_at_two_bytes():
    torch.manual_seed(3)
    model = nn.Conv2d(16, 32, 3).eval()
    args = (torch.randn(1, 16, 12, 12),)
    _, graph = build_graph(model, args, quantize="bf16")
    from stagec.lower.schedule.mapper import node_problem
    (conv,) = [n for n in graph.nodes if n.op.value == "conv"]
    problem = node_problem(conv).problem
    assert (problem.itemsize, problem.out_itemsize) == (2, 4)   # the output is the model's float32


def test_bf16_takes_no_calibration():
    model, args = small_cnn()
    with pytest.raises(InputError, match="calibration and percentile need quantize='int8'"):
        stagec.compile(model, args, quantize="bf16", calibration=[args])


def test_a_bf16_result_tile_is_held_as_float32():
    """The vector unit writes a conv's bf16 result as float32 and the STORE rounds it, so the
    single-accumulator result tile takes four bytes an element (two would let a full-size ResNet's
    result tile run past the scratchpad's end)."""
    from stagec.lower.schedule.mapper import node_problem
    from stagec.lower.schedule.nest import LayerShape, TileMapping
    from stagec.lower.schedule.nest_work import matrix_buffers
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(16, 32, 3), nn.ReLU(), nn.Conv2d(32, 8, 1)).eval()
    _, graph = build_graph(model, (torch.randn(1, 16, 12, 12),), quantize="bf16")
    first = next(n for n in graph.nodes if n.op.value == "conv")
    nest = node_problem(first)
    assert nest.problem.out_itemsize == 2   # stored as bf16
    m = TileMapping(10, 10, 32, 16, single_acc=True)
    (result,) = [b for b in matrix_buffers(LayerShape.of(nest.kind, nest.problem, nest.extras), m, np)
                 if b.name == "result"]
    assert (result.nbytes, result.count) == (10 * 10 * 32 * 4, 1)
