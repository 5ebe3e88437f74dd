"""int8 with float islands in bf16 (fallback=), layers pinned to a precision (layer_precision=) and
layers kept bf16 to meet an accuracy target (accuracy_target=): against PyTorch fp32, against the
graph's own evaluation, and as the program and report show them."""

import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec import int8_reference
from stagec.errors import AccuracyWarning, InputError, PrecisionWarning, ReferenceFallbackWarning
from stagec.lower.graph.evaluate import evaluate
from stagec.lower.graph.graph_ir import MATRIX_OPS, OpKind
from stagec.pipeline import build_graph
from stagec.precision import max_relative_error

VIEWS = (OpKind.RESHAPE, OpKind.TRANSPOSE, OpKind.SLICE, OpKind.BROADCAST)


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def simulated(program, args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReferenceFallbackWarning)
        out, report = stagec.simulate(program, *args)
    return np.asarray(out), report


def transformer_layer():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, activation="gelu").eval()
    return layer, (torch.randn(2, 8, 32),), [(torch.randn(2, 8, 32),) for _ in range(3)]


def cnn_with_softmax():
    """Int8 convs around a float island: a softmax over the channels."""
    torch.manual_seed(3)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return self.conv2(torch.softmax(torch.relu(self.conv1(x)), dim=1) * 4.0)
    return Net().eval(), (torch.randn(1, 3, 12, 12),), [(torch.randn(1, 3, 12, 12),) for _ in range(3)]


def outlier_mlp():
    """An MLP whose middle layer is int8-hostile: a weight column 300x the others reads a channel the
    ReLU before it always zeroes, so it changes nothing in float but sets every row's int8 weight
    scale, and the row's other weights round to 0 or +-1."""
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    with torch.no_grad():
        model[0].bias[0] = -100.0
        model[2].weight[:, 0] = 50.0
    return model, (torch.randn(8, 16),), [(torch.randn(8, 16),) for _ in range(3)]


def int8_graph(build, **options):
    model, args, calibration = build()
    return build_graph(model, args, quantize="int8", calibration=calibration, **options)[1]


def test_bf16_islands_hold_no_float32_between_the_quantize_boundaries():
    """fallback='bf16': every float value a node computes is bf16, but the graph's float32 outputs and
    views of its float32 inputs; float weights of float layers are bf16, and the float32 constants
    left are the dequantization's (read by int8 CONV/MATMULs).  fallback='fp32' keeps float32 islands."""
    for build in (transformer_layer, cnn_with_softmax):
        graph = int8_graph(build, fallback="bf16")
        outputs, inputs = {v.id for v in graph.outputs}, {v.id for v in graph.inputs}
        views_of_inputs = {n.output.id for n in graph.nodes if n.op in VIEWS and n.inputs[0].id in inputs}
        f32 = [n.name for n in graph.nodes
               if n.output.dtype == "float32" and n.output.id not in outputs | views_of_inputs]
        assert f32 == [] and any(n.output.dtype == "bfloat16" for n in graph.nodes)
        for n in graph.nodes:
            for v in n.inputs:
                a = graph.constants.get(v.id)
                if a is not None and a.dtype == np.float32 and a.size > 1:
                    assert n.op in MATRIX_OPS and n.inputs[0].dtype == "int8", n.name
        fp32 = int8_graph(build, fallback="fp32")
        assert not any(n.output.dtype == "bfloat16" for n in fp32.nodes)
        assert any(n.output.dtype == "float32" and n.output.id not in {v.id for v in fp32.outputs} for n in fp32.nodes)


@pytest.mark.parametrize("build", [transformer_layer, cnn_with_softmax])
def test_bf16_islands_simulate_as_the_graph_evaluates_and_match_pytorch(build):
    """The simulator, lower.graph.evaluate and the independent stagec.int8_reference round bf16 alike and
    run the same integer work (measured: equal); float32 summation order may move a value to the
    neighbouring bf16 (2**-8 relative), as in test_bf16.  Against fp32 PyTorch the bf16 islands keep
    cosine >= 0.999."""
    model, args, calibration = build()
    graph = build_graph(model, args, quantize="int8", calibration=calibration)[1]   # the default: bf16
    program = stagec.compile(model, args, quantize="int8", calibration=calibration)
    got, report = simulated(program, args)
    (expect,) = evaluate(graph, *(a.numpy() for a in args))
    (ref,) = int8_reference.run(graph, [a.numpy() for a in args])
    assert max_relative_error(got, expect) <= 2**-7 and max_relative_error(got, ref) <= 2**-7
    with torch.no_grad():
        assert cosine(got, model(*args).numpy()) >= 0.999
    assert report.actions.macs_int8 > 0 and report.actions.macs_fp32 == 0


def _starting(layers: dict, prefix: str):
    (layer,) = [layer for name, layer in layers.items() if name.startswith(prefix)]
    return layer


def test_layer_precision_pins_a_layer_and_rejects_unknown_names():
    model, args, calibration = transformer_layer()

    def compiled(pins, **options):
        program = stagec.compile(model, args, quantize="int8", calibration=calibration, layer_precision=pins,
                                 **options)
        report = simulated(program, args)[1]
        return {layer.name: layer for layer in report.layers}, report

    layers, report = compiled({"linear1/matmul": "bf16", "linear2": "fp32"})   # a module's name: all of it
    # GELU fuses into linear1's epilogue (through the reshape between them): linear1/matmul+linear1/add+gelu/...
    lin1, lin2 = _starting(layers, "linear1/matmul+linear1/add"), layers["linear2/matmul+linear2/add"]
    assert lin1.precision == "bf16" and lin1.actions.macs_bf16 == lin1.macs and lin1.actions.macs_int8 == 0
    assert lin2.precision == "fp32" and lin2.actions.macs_fp32 == lin2.macs > 0
    assert layers["self_attn/matmul_3+self_attn/add_1"].precision == "int8"
    text = report.summary()
    assert "pinned: linear1/matmul bf16, linear2/reshape fp32" in text
    assert re.search(r"^linear1/matmul\+linear1/add\S* +matmul +bf16 ", text, re.M)
    layers, _ = compiled({"linear1/matmul+linear1/add": "fp32"}, fallback="fp32")
    assert _starting(layers, "linear1/matmul+linear1/add").precision == "fp32"
    assert {layer.precision for layer in layers.values() if layer.macs} == {"int8", "fp32"}
    with pytest.raises(InputError, match=r"names no layer 'linear3/matmul'; layers are named e\.g\. .*'linear1/matmul"):
        stagec.compile(model, args, quantize="int8", layer_precision={"linear3/matmul": "bf16"})
    with pytest.raises(InputError, match=r"layer_precision\['linear1'\] = 'fp16': expected one of"):
        stagec.compile(model, args, quantize="int8", layer_precision={"linear1": "fp16"})


def test_a_layer_pinned_int8_without_an_int8_kernel_is_named_in_a_warning():
    model, args, calibration = transformer_layer()
    with pytest.warns(PrecisionWarning, match=r"pins norm1/.* int8, .*no int8 kernel for (it|them): bf16") as caught:
        program = stagec.compile(model, args, quantize="int8", calibration=calibration,
                                 layer_precision={"norm1": "int8", "linear1": "int8"})
    assert "linear1" not in str(caught[0].message)      # it has one: no warning for it
    layers = {layer.name: layer for layer in simulated(program, args)[1].layers}
    assert _starting(layers, "linear1/matmul").precision == "int8"


@pytest.mark.parametrize("options, message", [
    ({"fallback": "bf16"}, "fallback need quantize='int8'"),
    ({"quantize": "int8", "fallback": "fp16"}, "fallback must be one of"),
    ({"quantize": "bf16", "accuracy_target": 0.99}, "accuracy_target need quantize='int8'"),
    ({"quantize": "int8", "accuracy_target": 1.5}, r"accuracy_target must be a cosine similarity in \(0, 1\]"),
    ({"quantize": "int8", "layer_precision": ["linear1"]}, "layer_precision must be a dict"),
])
def test_mixed_precision_options_are_checked(options, message):
    with pytest.raises(InputError, match=message):
        stagec.compile(nn.Linear(4, 4), (torch.randn(2, 4),), **options)


def test_accuracy_target_keeps_the_sensitive_layer_bf16_and_meets_the_target():
    """Plain int8 misses 0.99 on the outlier MLP; the search keeps its middle layer, and only it, bf16,
    and the program then meets the target against PyTorch too.  Twice, the same choice."""
    model, args, calibration = outlier_mlp()
    with torch.no_grad():
        want = model(*args).numpy()
    plain, _ = simulated(stagec.compile(model, args, quantize="int8", calibration=calibration), args)
    assert cosine(plain, want) < 0.9
    programs = [stagec.compile(model, args, quantize="int8", calibration=calibration, accuracy_target=0.99)
                for _ in range(2)]
    assert programs[0] == programs[1]
    got, report = simulated(programs[0], args)
    chosen = report.mixed_precision["chosen"]
    assert len(chosen) == 1 and chosen[0].startswith("2/") and report.mixed_precision["cosine"] >= 0.99
    assert cosine(got, want) >= 0.99
    (layer,) = [layer for layer in report.layers if set(chosen[0].split("+")) <= set(layer.name.split("+"))]
    assert layer.precision == "bf16" and layer.actions.macs_bf16 == layer.macs
    assert {other.precision for other in report.layers if other.macs and other is not layer} == {"int8"}
    assert "accuracy target 0.99: cosine" in report.summary() and chosen[0] in report.summary()


def test_an_unreachable_accuracy_target_warns_and_compiles_the_best_found():
    model, args, calibration = outlier_mlp()
    with pytest.warns(AccuracyWarning, match="accuracy_target=1.0: the best mix found reaches cosine"):
        program = stagec.compile(model, args, quantize="int8", calibration=calibration, accuracy_target=1.0)
    mixed = program.metadata["mixed_precision"]
    assert mixed["target"] == 1.0 and mixed["cosine"] < 1.0 and mixed["chosen"][0].startswith("2/")
