"""The pipeline is one list: compile walks it, dump names its stages, a pass is one function and
one entry, the tuner's and codesign's lowering is its tail, and stagec's modules import in one direction."""

import ast
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec.isa.instructions import Opcode
from stagec.layers import model_graph
from stagec.pipeline import PIPELINE, GraphPass, Stage, build_graph, lower_graph, position

STAGEC = Path(stagec.__file__).parent
NARROW_VECTOR = stagec.HardwareConfig(vector_lanes=4)   # depthwise convs pack onto the array (test_pack)


def conv_relu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    with torch.no_grad():
        for stat in (model[1].weight, model[1].bias, model[1].running_mean):
            stat.normal_()
        model[1].running_var.uniform_(0.5, 2.0)
    return model, torch.randn(1, 3, 8, 8)


def test_a_new_pass_is_one_function_and_one_list_entry(tmp_path):
    model, x = conv_relu()
    seen = []

    def count_nodes(graph):
        seen.append([n.op.value for n in graph.nodes])
        return graph

    stages = list(PIPELINE)
    stages.insert(position("fold_affine") + 1, Stage("count_nodes", GraphPass(count_nodes)))
    program = stagec.compile(model, (x,), stages=stages, dump=tmp_path)
    assert seen == [["conv"]]                  # after fold_affine: batch norm, bias and ReLU in the conv
    files = sorted(p.name for p in tmp_path.iterdir())
    n = position("fold_affine")
    before, after = f"{n:02d}-fold_affine.txt", f"{n + 1:02d}-count_nodes.txt"
    assert files[files.index(before) + 1] == after
    assert (tmp_path / after).read_text() == (tmp_path / before).read_text()
    assert program == stagec.compile(model, (x,))


def test_batch_norm_folds_into_the_conv_before_an_activation_that_reads_its_input_twice():
    """hardswish(bn(conv(x))) reads bn's result after x + 3: batch norm still folds into the
    weights and bias, the 3 stays in the epilogue."""
    model, x = conv_relu()
    model[2] = nn.Hardswish().eval()
    graph = build_graph(model, (x,))[1]
    (conv,) = graph.nodes
    expr = conv.attr("epilogue")
    assert [s.func for s in expr[:2]] == ["add", "add"]   # bias, then hardswish's + 3
    sizes = sorted(graph.constants[v.id].size for v in conv.inputs[2:])
    assert sizes == [1, 1, 1, 8]   # 3, 6, 1/6 and the bias: no per-channel scale left
    y, _ = stagec.simulate(stagec.compile(model, (x,)), x)
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_a_pass_that_changes_the_graph_changes_the_program():
    model, x = conv_relu()

    def drop_epilogue(graph):   # the conv's fused bias and ReLU, gone
        return replace(graph, nodes=tuple(n.with_attrs(epilogue=()) if n.op.value == "conv" else n
                                          for n in graph.nodes))

    stages = list(PIPELINE)
    stages.insert(position("fold_affine") + 1, Stage("drop_epilogue", GraphPass(drop_epilogue)))
    y, _ = stagec.simulate(stagec.compile(model, (x,), stages=stages), x)
    conv, bn = model[0], model[1]
    with torch.no_grad():   # batch norm's scale folded into the weights stays; its shift and the ReLU go
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        scaled = (conv(x) - conv.bias.view(1, -1, 1, 1)) * scale.view(1, -1, 1, 1)
    assert torch.allclose(torch.as_tensor(y), scaled, atol=1e-4)


def test_the_hardware_stages_are_entries_too():
    torch.manual_seed(0)
    model, x = nn.Conv2d(32, 32, 3, padding=1, groups=32).eval(), torch.randn(1, 32, 14, 14)
    packed = stagec.compile(model, (x,), hw=NARROW_VECTOR)
    unpacked = stagec.compile(model, (x,), hw=NARROW_VECTOR, stages=[s for s in PIPELINE if s.name != "pack"])
    assert (packed.code["opcode"] == Opcode.MATMUL).any()
    assert not (unpacked.code["opcode"] == Opcode.MATMUL).any()


def test_dump_prints_the_stages_that_apply_in_pipeline_order(capsys):
    model, x = conv_relu()
    stagec.compile(model, (x,), dump=True)
    printed = [line[5:-5] for line in capsys.readouterr().out.splitlines() if line.startswith("==== ")]
    skipped = {"split_activations", "split_residuals", "calibrate", "precision", "quantize", "fuse_quantized",
               "bf16", "tune"}   # int8, bf16 and tuning only
    assert printed == [s.name for s in PIPELINE if s.name not in skipped]


def test_dump_of_a_stage_name_prints_that_stage_and_writes_no_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, x = conv_relu()
    stagec.compile(model, (x,), dump="schedule")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("==== ")]
    assert printed == ["==== schedule ===="] and not list(tmp_path.iterdir())


def test_a_tracing_note_names_the_users_line():
    for build in (lambda m, x: stagec.compile(m, (x,)), lambda m, x: model_graph(m, (x,))):
        with pytest.warns(UserWarning, match="traced in inference mode") as record:
            build(nn.Linear(3, 4).train(), torch.randn(2, 3))
        assert record[0].filename == __file__


def test_lower_graph_is_compile_after_the_graph_stages():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(), nn.Conv2d(16, 8, 1)).eval()
    x = torch.randn(1, 16, 10, 10)
    compiled = stagec.compile(model, (x,), hw=NARROW_VECTOR)
    lowered = lower_graph(model_graph(model, (x,)), NARROW_VECTOR)
    assert (lowered.code == compiled.code).all() and lowered.constants == compiled.constants


def _imported_stagec_modules(path: Path) -> set[str]:
    """The stagec top-level modules `path` imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ("stagec." + (node.module or "")) if node.level == 1 else (node.module or "")
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        modules = {n.split(".")[1] for n in names if n.startswith("stagec.")}
        found |= {m for m in modules if (STAGEC / f"{m}.py").exists()}
    return found


def test_stagec_modules_import_each_other_without_a_circle():
    graph = {p.stem: _imported_stagec_modules(p) - {p.stem} for p in STAGEC.glob("*.py") if p.stem != "__init__"}
    done, visiting = set(), []

    def visit(module):
        assert module not in visiting, f"import circle: {' -> '.join(visiting[visiting.index(module):] + [module])}"
        if module not in done:
            visiting.append(module)
            for imported in graph[module]:
                visit(imported)
            visiting.pop()
            done.add(module)

    for module in graph:
        visit(module)
    assert {"compiler", "tuning", "layers", "pipeline"} <= done
