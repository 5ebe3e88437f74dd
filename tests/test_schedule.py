"""The schedule stage decides the tiling of every nest of every layer, vector ops' included, once:
its dump shows each, the emitter walks what it decided without calling the mapper, and a
caller's mapping of any layer is checked as the default mapper's choices are."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import rel_err
from torch import nn

import stagec
import stagec.lower.schedule.mapper as schedule_module
import stagec.lower.schedule.nest_map as nest_map
from stagec.errors import InputError, TilingError
from stagec.isa.instructions import Opcode
from stagec.lower.codegen.vector import VectorNest
from stagec.lower.schedule.mapper import make_schedule
from stagec.lower.schedule.nest import TileMapping
from stagec.pipeline import PIPELINE, Compilation, Request, position, run

NESTS = {"conv": ("matrix", "depthwise"), "matmul": ("matrix",), "pool": ("pool",), "elementwise": ("elementwise",),
         "reduce": ("reduce",), "gather": ("gather",)}   # the nest kinds each op's layer runs as (else copies)


class ConvNet(nn.Module):
    """Convs with a residual add, a depthwise gate, a pad, a concat, pooling, a mean and a softmax."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)
        self.dw, self.fc = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Linear(8, 5)

    def forward(self, x):
        h = torch.relu(self.c1(x))
        h = h + self.c2(h)
        h = torch.sigmoid(self.dw(h)) * h
        h = torch.cat([nn.functional.pad(h, (1, 2, 0, 1)), torch.zeros(1, 2, 9, 11)], 1)
        s = nn.functional.max_pool2d(h, 2).mean((2, 3))
        return torch.softmax(self.fc(s[:, :8]), -1), h.amax(1)


class Block(nn.Module):
    """An embedding lookup, then a transformer encoder layer (attention's softmax, layer norms,
    residual adds), its output transposed."""

    def __init__(self):
        super().__init__()
        self.emb, self.block = nn.Embedding(20, 16), nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0,
                                                                                batch_first=True)

    def forward(self, ids):
        return self.block(self.emb(ids)).transpose(1, 2)


def models():
    torch.manual_seed(0)
    return [(ConvNet().eval(), (torch.randn(1, 3, 8, 8),)), (Block().eval(), (torch.randint(0, 20, (1, 6)),))]


def compilation(model, args, hw=None, mappings=None, stages=PIPELINE) -> Compilation:
    request = Request(model, args, hw=hw or stagec.HardwareConfig(), mappings=mappings or {})
    return run(stages, Compilation(request))


def dumped(text: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """The schedule dump as [(layer, [(mapping, nest), ...])]: a layer's first nest on its line, the
    rest on lines of their own below it (the cascades' lines, after the layers', left out)."""
    layers = []
    for line in text.splitlines()[1:-1]:
        if line.startswith("  cascade "):
            continue
        first = re.fullmatch(r"  (\S+): (tile\(.*?\)[\w -]*?)  \[(.+)\]", line)
        more = re.fullmatch(r" +(tile\(.*?\)[\w -]*?)  \[(.+)\]", line)
        assert first or more, line
        if first:
            layers.append((first[1], [first.group(2, 3)]))
        else:
            assert len(more[0]) - len(more[0].lstrip()) == len(layers[-1][0]) + 4, line   # aligned under the first
            layers[-1][1].append(more.group(1, 2))
    return layers


@pytest.mark.parametrize("model, args", models(), ids=["convnet", "block"])
def test_the_schedule_dump_shows_every_layers_tiling(model, args, tmp_path):
    program = stagec.compile(model, args, dump=tmp_path)
    layers = dumped((tmp_path / f"{position('schedule'):02d}-schedule.txt").read_text())
    assert [name for name, _ in layers] == [layer.name for layer in program.layers]   # each layer the program runs
    ops = {layer.op for layer in program.layers}
    assert {"elementwise", "reduce", "pad", "concat"} <= ops or {"gather", "reduce", "transpose"} <= ops
    for layer, (_, nests) in zip(program.layers, layers, strict=True):
        # a nest per part the layer runs as: a pad's fill and copy, a concat's copy of each input
        count = {"pad": 2, "concat": len(layer.in_shapes)}.get(layer.op, 1)
        assert len(nests) == count, layer
        kinds = NESTS.get(layer.op, ("copy",))
        assert all(nest.split()[0] in kinds for _, nest in nests), (layer, nests)
        if layer.op in ("conv", "matmul", "pool"):   # what the program records of its mapping
            assert nests[0][0] == layer.detail


@pytest.mark.parametrize("model, args", models(), ids=["convnet", "block"])
def test_the_emitter_walks_the_schedule_without_the_mapper(model, args, monkeypatch):
    scheduled = compilation(model, args, stages=PIPELINE[:position("program")])

    def refuse(*args, **kwargs):
        raise AssertionError("the mapper ran after the schedule stage")

    for module, mapper in ((schedule_module, "map_vector"), (nest_map, "map_nest"), (nest_map, "_map_nest")):
        monkeypatch.setattr(module, mapper, refuse)
    program = run(PIPELINE[position("program"):], scheduled).program
    monkeypatch.undo()
    expected = stagec.compile(model, args)
    assert program.to_bytes() == expected.to_bytes()


def stores(program, name: str) -> int:
    (k,) = [k for k, layer in enumerate(program.layers) if layer.name == name]
    return int(np.sum(program.code["opcode"][program.layer_ids == k] == Opcode.STORE))


def test_a_callers_mapping_of_a_vector_layer_is_the_one_it_runs():
    """Single-element tiles, single-buffered, for the softmax's exp: a STORE per element, the
    footprint of that mapping, the model's values."""
    model, args = models()[0]
    c = compilation(model, args)
    (name,) = [name for name, t in c.schedule.tilings if "exp" in name]
    mapping = TileMapping(1, 1, 1, 1, double_buffer=False)
    program = compilation(model, args, mappings={name: mapping}).program
    (nest,) = c.schedule[name].nests
    assert stores(c.program, name) < stores(program, name) == nest.repeat * math.prod(nest.space)
    assert tuple(program.metadata["local_peak_bytes"][name]) == tuple(int(b) for b in nest.footprint(mapping))
    (y, _), _ = stagec.simulate(program, *args)
    with torch.no_grad():
        assert rel_err(y, model(*args)[0].numpy()) < 1e-5


@pytest.mark.parametrize("model, args", models(), ids=["convnet", "block"])
def test_a_schedules_own_mappings_give_it_back(model, args):
    """Every layer's mappings, given back as a caller's (a tuple of a layer's nests' mappings),
    pass the caller's checks and make the same tilings: the default mapper's choices are legal (a
    cascade member's too, alone; layers the caller maps run alone)."""
    c = compilation(model, args)
    given = {name: t.mappings for name, t in c.schedule.tilings}
    again = make_schedule(c.graph, c.layout, c.request.hw, given)
    assert again.tilings == c.schedule.tilings and again.cascades == ()


def test_a_callers_mapping_that_does_not_fit_names_the_layer():
    model, args = models()[0]
    c = compilation(model, args)
    pad, _ = next((name, t) for name, t in c.schedule.tilings if name.endswith("/pad"))
    conv = next(name for name, t in c.schedule.tilings if "conv" in name)
    vector = next(name for name, t in c.schedule.tilings if len(t.nests) == 1 and isinstance(t.nests[0], VectorNest))
    big = TileMapping(64, 64, 64, 1)
    cases = [
        (vector, big, TilingError, rf"^{re.escape(vector)} \(\w+\): mapping .* needs \d+ bytes of scratchpad "
                                   r"\(has \d+\) and 0 bytes of accumulator"),
        (vector, TileMapping(1, 1, 8, 1, weights_resident=True), TilingError,
         rf"^{re.escape(vector)} \(\w+\): mapping .* is w-resident, which needs a matrix-unit op \(have a vector-unit"),
        (vector, TileMapping(1, 1, 8, 2), TilingError, rf"^{re.escape(vector)} \(\w+\): mapping .* tiles c"),
        (pad, (big,) * 3, TilingError, rf"^{re.escape(pad)} \(pad\): 3 mappings for a layer of 2 nests"),
        (pad, (TileMapping(1, 1, 1, 1), big), TilingError, rf"^{re.escape(pad)} \(pad\): mapping tile\(oh=64"),
        (conv, replace(TileMapping(1, 1, 1, 1), tile_oh=0), TilingError,
         rf"^{re.escape(conv)} \(conv\): mapping .* has a tile size outside 1\.\.65535"),
        (pad, (TileMapping(1, 1, 1, 1), "tile"), InputError, rf"^{re.escape(pad)} \(pad\): a mapping is a .*, not str"),
        (vector, {"tile_oh": 1}, InputError,
         rf"^{re.escape(vector)} \(\w+\): a mapping is a .*TileMapping .*, not dict"),
        ("no/such/layer", big, InputError, r"mappings for layers the schedule does not have: \['no/such/layer'\]"),
    ]
    for name, mapping, error, message in cases:
        with pytest.raises(error, match=message):
            make_schedule(c.graph, c.layout, stagec.HardwareConfig(scratchpad_bytes=64 * 1024), {name: mapping})
