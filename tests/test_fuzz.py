"""The fuzzing harness (stagec.fuzz): a seeded quick subset of the campaign, and the harness itself."""

import random

import numpy as np
import pytest
import torch
from torch import nn

import stagec
from stagec.fuzz.campaign import make_case, run_case
from stagec.fuzz.hardware import HW_KINDS, random_hardware
from stagec.fuzz.models import RULES, build_model, generate_model
from stagec.fuzz.pool import run_jobs
from stagec.pipeline import build_graph

# (seed, mode, hardware kind): attention, convs, gates (squeeze-and-excitation), norms, slices, permutes,
# residuals and concats, on the default config, a random one and tiny ones (2x1 to 3x2 arrays of either
# dataflow, scratchpads of 692 to 4096 bytes)
QUICK = [(25, "int8", "default"), (10, "int8", "tiny"), (18, "fp32", "tiny"), (13, "fp32", "tiny"),
         (4, "fp32", "random")]


@pytest.mark.parametrize("seed, mode, hw_kind", QUICK)
def test_quick_cases_are_ok_or_acceptably_rejected(seed, mode, hw_kind):
    case = make_case(seed, mode, hw_kind)
    outcome = run_case(case)
    assert outcome.acceptable, f"{case}\n{outcome}"


def test_a_case_is_reproducible_from_its_seed_and_prints_as_a_model():
    a, b = make_case(11), make_case(11)
    assert a == b and str(a) == str(b)
    assert str(a).count("\n") == len(a.spec.layers) + 1 and "->" in str(a)   # the hardware, the input, a layer a line
    (ma, (xa,)), (mb, (xb,)) = build_model(a.spec), build_model(b.spec)
    assert torch.equal(xa, xb)
    assert all(torch.equal(p, q) for p, q in zip(ma.state_dict().values(), mb.state_dict().values(), strict=True))
    assert make_case(12).spec != a.spec


def test_the_grammar_reaches_every_rule():
    seen = set()
    for seed in range(150):
        seen |= generate_model(seed).kinds()
    assert seen == set(RULES)


def test_every_conv_and_linear_output_has_unit_rms_on_the_input():
    rms = []
    hook = lambda m, args, out: rms.append(float(out.pow(2).mean().sqrt()))   # noqa: E731
    for seed in range(10):
        model, (x,) = build_model(generate_model(seed))
        for m in model.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
                m.register_forward_hook(hook)
        with torch.no_grad():
            assert torch.isfinite(model(x)).all()
    assert len(rms) > 10 and np.allclose(rms, 1.0, rtol=1e-4)


@pytest.mark.parametrize("kind", HW_KINDS)
def test_random_hardware_is_valid_and_of_its_kind(kind):
    rng = random.Random(0)
    configs = [random_hardware(rng, kind) for _ in range(50)]
    assert len({hw.dataflow for hw in configs}) == 2
    if kind == "tiny":
        assert max(hw.array_rows * hw.array_cols for hw in configs) <= 16
        assert min(hw.array_rows * hw.array_cols for hw in configs) == 1
        assert max(hw.scratchpad_bytes for hw in configs) <= 4096
    if kind == "default":
        assert all(hw.replace(dataflow="weight_stationary") == stagec.HardwareConfig() for hw in configs)
    else:   # each packing on and off, in every combination
        assert len({(hw.array_subword_packing, hw.vector_subword_packing) for hw in configs}) == 4


def _small_case():
    return make_case(3, "fp32", "default")


def test_a_simulated_output_off_by_more_than_the_tolerance_is_wrong(monkeypatch):
    simulate = stagec.simulate

    def off_by_a_little(program, x):
        y, report = simulate(program, x)
        return y + 1e-3 * np.abs(y).max(), report
    monkeypatch.setattr(stagec, "simulate", off_by_a_little)
    outcome = run_case(_small_case())
    assert outcome.outcome == "wrong" and outcome.error == pytest.approx(1e-3, rel=1e-2)


def test_an_exception_that_is_not_a_stagec_error_is_a_crash_and_names_where(monkeypatch):
    def broken(program, x):
        raise IndexError("index 7 is out of bounds")
    monkeypatch.setattr(stagec, "simulate", broken)
    outcome = run_case(_small_case())
    assert outcome.outcome == "crash" and "simulate: IndexError: index 7" in outcome.message
    assert "test_fuzz.py" in outcome.message and "in broken" in outcome.message


def test_a_program_the_batched_executor_refuses_is_a_fallback(monkeypatch):
    from stagec.sim import executor

    def refuse(program):
        raise executor.PlanError("a refused program")
    monkeypatch.setattr(executor, "Executor", refuse)
    outcome = run_case(_small_case())
    assert outcome.outcome == "fallback" and "a refused program" in outcome.message


def test_the_pool_replaces_a_worker_that_hangs_or_dies():
    jobs = ["6 * 7", "sum(range(10**12))", "__import__('os')._exit(3)", "2 + 2"]
    results = {job: (status, value) for job, status, value in run_jobs(jobs, eval, workers=1, timeout_s=1.0,
                                                                       start_method="fork")}
    assert results["6 * 7"] == ("done", 42) and results["2 + 2"] == ("done", 4)
    assert results[jobs[1]][0] == "hang" and "s of CPU" in results[jobs[1]][1]   # a limit on CPU, not wall time
    assert results[jobs[2]] == ("died", 3)



def test_the_minimizer_shrinks_inside_composites_whose_parameters_are_not_all_chains(monkeypatch):
    """Case 100782: shrinking a concat's branch, beside a branch holding conv(out=1, ...) (an int
    parameter), crashed the minimizer."""
    from stagec.fuzz import minimize as minimizer
    from stagec.fuzz.campaign import Outcome

    def run_case(case):   # "fails" while that conv and the softplus both remain
        return Outcome("wrong" if "conv(out=1," in str(case.spec) and "softplus" in str(case.spec) else "ok")
    monkeypatch.setattr(minimizer, "run_case", run_case)
    small = minimizer.minimize(make_case(100782), lambda o: o.outcome == "wrong")
    assert len(small.spec.layers) == 1 and small.spec.layers[0].kind == "concat"
    assert str(small.spec.layers[0]).endswith("| activation(fn='softplus_beta2')])")


def test_int8_output_a_rounding_tie_apart_from_the_reference_is_ok_and_one_step_off_elsewhere_is_wrong():
    """Case 100782: the simulator's fp32 island rounded a float an ulp over a rounding boundary that the
    integer reference's stayed under; one int8 step then moved a gate and 290 outputs."""
    from helpers import linear_across_a_rounding_tie

    from stagec import int8_reference
    from stagec.fuzz.campaign import CHECKS
    model, calibration, graph, below, above = linear_across_a_rounding_tie()
    x = torch.from_numpy(below)
    with torch.no_grad():
        expected = model(x).numpy()
    (ref,), (tipped,) = int8_reference.run(graph, [below]), int8_reference.run(graph, [above])
    assert CHECKS["int8"](tipped, expected, model, x, calibration).outcome == "ok"
    wrong = ref.copy()
    wrong[1, 0] += np.abs(ref).max() / 127   # one step, in the row without the tie
    assert CHECKS["int8"](wrong, expected, model, x, calibration).outcome == "wrong"


class Product(nn.Module):
    def __init__(self, a: nn.Module, b: nn.Module):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.a(x) * self.b(x)


def test_int8_that_cannot_keep_an_input_far_below_its_calibrated_ranges_is_not_wrong():
    """Case 101206: the calibration batches gave a product's tensor a range ~90x x's own (cubic layers
    after batch norms fitted to x's 4 samples a channel): in int8 steps of 400/127, x's values of +-4.5
    are one or two steps, and no quantization keeps them (cosine 0.373; PyTorch with such noise: 0.118).
    The oracle's noise is int8's: steps of the calibrated ranges, at the product too."""
    from stagec import int8_reference
    from stagec.fuzz.campaign import CHECKS, COSINE_FLOOR, NOISE_FLOOR, cosine
    torch.manual_seed(0)
    model = nn.Sequential(Product(nn.Linear(4, 4), nn.Identity()), nn.Linear(4, 3)).eval()
    x = torch.randn(2, 4)
    calibration = [(x,), (30 * torch.randn(2, 4),)]
    with torch.no_grad():
        expected = model(x).numpy()
    _, graph = build_graph(model, (x,), quantize="int8", calibration=calibration)
    (ref,) = int8_reference.run(graph, [x.numpy()])
    outcome = CHECKS["int8"](ref, expected, model, x, calibration)
    assert cosine(ref, expected) < COSINE_FLOOR and outcome.noise_cosine < NOISE_FLOOR
    assert outcome.outcome == "ok"


def test_int8_that_loses_a_near_cancelling_sum_to_its_weights_rounding_is_not_wrong():
    """Case 201719: a gate's second linear sums two terms that nearly cancel on x (-1 of a calibrated range
    of 16); its int8 weights, 39 and -127 steps, move that sum to -4.5 and hardsigmoid to 0, so the output
    is 0 in the simulator and the integer reference alike.  PyTorch with int8 weights and rounding keeps
    nothing either: the oracle's noise quantizes the weights too."""
    outcome = run_case(make_case(201719))
    assert outcome.cosine < 0.5 and outcome.noise_cosine < 0.5
    assert outcome.outcome == "ok"


def test_int8_output_that_int8_sized_noise_moves_past_its_own_size_is_not_wrong():
    """Case 115076: a mean over a layer norm's outputs, -3.3e-9 in PyTorch (zero but for rounding).  int8
    gives a value of the other sign, as the integer reference does; PyTorch under int8-sized noise keeps
    the sign (cosine 1), by chance: the noise moves the value by 2.5e-4, 76000 times its size."""
    outcome = run_case(make_case(115076))
    assert outcome.cosine < 0.5 and outcome.noise_cosine >= 0.9
    assert outcome.outcome == "ok"


def test_int8_output_that_matches_the_reference_but_not_pytorch_is_wrong(monkeypatch):
    """A quantization bug the integer reference shares (a wrong scale, say) is caught by the cosine with
    PyTorch where the model keeps its answer under int8 weights, rounding and noise."""
    from stagec import int8_reference
    from stagec.fuzz.campaign import CHECKS, NOISE_FLOOR
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x).numpy()
    monkeypatch.setattr(int8_reference, "run", lambda graph, inputs, **kw: [np.zeros_like(expected)])
    outcome = CHECKS["int8"](np.zeros_like(expected), expected, model, x, [(x,)])
    assert outcome.noise_cosine >= NOISE_FLOOR and outcome.outcome == "wrong"
