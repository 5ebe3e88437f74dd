"""Mutated program files are rejected with a StagecError or run: never a crash (stagec.fuzz.mutate)."""

import collections

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec.fuzz.mutate import mutate_program, run_mutant


class Net(nn.Module):
    """A conv, a linear layer, a keyword input and two outputs: every part of a program file."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x, *, bias):
        h = torch.relu(self.conv(x))
        return self.fc(h.flatten(1)) + bias, h.amax(1)


@pytest.fixture(scope="module")
def program_file():
    torch.manual_seed(0)
    x, bias = torch.randn(1, 3, 4, 4), torch.randn(1, 5)
    return stagec.compile(Net().eval(), (x,), kwargs={"bias": bias}).to_bytes(), [x.numpy(), bias.numpy()]


def test_the_unmutated_file_runs(program_file):
    data, inputs = program_file
    assert run_mutant(data, inputs) == "ok"
    assert run_mutant(data, inputs[:1]) == "ok"    # inputs that do not fit: no simulation, the rest runs


@pytest.mark.filterwarnings("ignore:batched executor cannot run")
def test_mutants_are_rejected_or_run(program_file):
    data, inputs = program_file
    rng = np.random.default_rng(2024)
    outcomes = collections.Counter()
    kinds = collections.Counter()
    for _ in range(300):
        what, mutant = mutate_program(data, rng)
        kinds[what.split(":")[0]] += 1
        outcomes[run_mutant(mutant, inputs)] += 1      # a crash raises
    assert set(outcomes) <= {"ok", "rejected:ProgramFormatError", "rejected:VerificationError"}
    assert min(outcomes.values()) >= 15, outcomes         # each outcome is exercised
    assert len(kinds) == 15, kinds                         # every kind of mutation


def test_mutations_are_seeded(program_file):
    data, _ = program_file
    first = [mutate_program(data, np.random.default_rng(7)) for _ in range(2)]
    assert first[0] == first[1] and first[0][1] != data
