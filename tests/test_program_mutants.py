"""Mutated program files are rejected with a StagecError or run: never a crash (stagec.fuzz.mutate)."""

import collections

import numpy as np
import pytest

from stagec.fuzz import files
from stagec.fuzz.files import BASES, base_program, file_record
from stagec.fuzz.mutate import mutate_program, run_mutant


@pytest.fixture(scope="module")
def program_file():
    return base_program("fp32")   # a conv, a linear layer, a keyword input and two outputs


@pytest.mark.parametrize("name", sorted(BASES))
def test_every_base_file_runs_unmutated(name):
    data, inputs = base_program(name)
    assert run_mutant(data, inputs) == "ok"


def test_a_file_record_names_its_base_and_mutation_and_a_crash(monkeypatch):
    record = file_record(1)
    assert record["mode"] in BASES and record["mutation"] and record["outcome"] in ("ok", "rejected:ProgramFormatError",
                                                                                    "rejected:VerificationError")

    def broken(data, inputs):
        raise IndexError("list index out of range")
    monkeypatch.setattr(files, "run_mutant", broken)
    crash = file_record(1)
    assert crash["outcome"] == "crash" and "mutant: IndexError: list index out of range" in crash["message"]


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
