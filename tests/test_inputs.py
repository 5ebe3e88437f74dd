"""What simulate and compile refuse, in plain words: inputs of the wrong number, structure, shape or
kind of number; empty or malformed calibration sets."""

import numpy as np
import pytest
import torch
from programs import relu_matmul
from torch import nn

import stagec
from stagec import InputError


class Lookup(nn.Module):
    """Token ids (int64 in torch, int32 in the program), features, and a boolean mask."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)

    def forward(self, ids, features, mask):
        return self.embed(ids) * features * mask[..., None]


@pytest.fixture(scope="module")
def lookup():
    torch.manual_seed(0)
    model = Lookup().eval()
    ids, features, mask = torch.tensor([1, 7]), torch.randn(2, 4), torch.tensor([True, False])
    return stagec.compile(model, (ids, features, mask)), (ids, features, mask), model


def test_a_program_without_recorded_structure_counts_its_inputs():
    p, _, a = relu_matmul()
    with pytest.raises(InputError) as e:
        stagec.simulate(p, a, a)
    assert str(e.value) == ("expected 1 input: args[0] float32 (8, 4); got 2: args[0] float32 (8, 4), "
                            "args[1] float32 (8, 4) (unexpected: args[1])")
    with pytest.raises(InputError, match=r"^args\[0\] is float32 \(4, 8\), but the model was traced with float32 "
                                         r"\(8, 4\)$"):
        stagec.simulate(p, a.T)


def test_a_wrong_number_of_inputs_says_what_was_expected(lookup):
    program, (ids, features, mask), model = lookup
    with pytest.raises(InputError) as e:
        stagec.simulate(program, ids, features)
    assert str(e.value) == ("expected 3 inputs: args[0] int32 (2,), args[1] float32 (2, 4), args[2] bool (2,); "
                            "got 2: args[0] int64 (2,), args[1] float32 (2, 4) (missing: args[2])")
    with pytest.raises(InputError, match=r"\(missing: args\[2\]\) \(unexpected: kwargs\['mask'\]\)$"):
        stagec.simulate(program, ids, features, mask=mask)


@pytest.mark.parametrize("index, value, message", [
    (0, torch.tensor([1.0, 7.0]), r"args\[0\] is float32 \(2,\), but the model was traced with int32 \(2,\): "
                                  "floating-point values where it takes integer ones"),
    (0, torch.tensor([1, 2**40]), r"args\[0\]: an int64 tensor of shape \(2,\) holds values beyond int32's range"),
    (1, torch.ones(2, 4, dtype=torch.int64), "integer values where it takes floating-point ones"),
    (1, torch.ones(2, 4, dtype=torch.bool), "bool values where it takes floating-point ones"),
    (1, np.ones((2, 4), np.uint8), "integer values where it takes floating-point ones"),
    (1, np.full((2, 4), "x"), r"non-numeric \(<U1\) values where it takes floating-point ones"),
    (2, torch.tensor([1.0, 0.0]), "floating-point values where it takes bool ones"),
    (2, torch.tensor([1, 0]), "integer values where it takes bool ones"),
])
def test_inputs_of_another_kind_of_number_are_refused(lookup, index, value, message):
    program, inputs, _ = lookup
    args = list(inputs)
    args[index] = value
    with pytest.raises(InputError, match=message):
        stagec.simulate(program, *args)


def test_matching_inputs_run_with_int64_ids_bool_masks_and_nan(lookup):
    program, (ids, features, mask), model = lookup
    features = features.clone()
    features[0, 0] = float("nan")
    y, _ = stagec.simulate(program, ids, features.double(), mask)       # float64 features run as float32
    with torch.no_grad():
        ref = model(ids, features, mask).numpy()
    assert np.isnan(y[0, 0]) and np.allclose(y.reshape(-1)[1:], ref.reshape(-1)[1:], atol=1e-6)


@pytest.mark.parametrize("calibration, message", [
    ([], "calibration must be a non-empty list of batches (each the model's inputs); got an empty list"),
    (torch.randn(1, 4), "calibration must be a non-empty list of batches (each the model's inputs); got a Tensor"),
    ([(torch.randn(3, 4),), (torch.randn(3, 4), torch.randn(3, 4))],
     "calibration batch 1: expected 1 input: args[0] float32 (3, 4); got 2: "),
    ([(torch.randn(3, 5),)], "calibration batch 0: args[0] is float32 (3, 5), but the model was traced with float32"),
])
def test_bad_calibration_sets_name_the_batch(calibration, message):
    model, x = nn.Linear(4, 2).eval(), torch.randn(3, 4)
    with pytest.raises(InputError) as e:
        stagec.compile(model, (x,), quantize="int8", calibration=calibration)
    assert str(e.value).startswith(message)
