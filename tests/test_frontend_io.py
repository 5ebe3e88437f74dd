"""Models of any input and output structure: several and keyword inputs, integer token ids, non-tensor
inputs, tuple/dict outputs; the recorded trees rebuild the model's own structure."""

import json

import numpy as np
import pytest
import torch
from helpers import rel_err
from torch import nn

from stagec.frontend import TracedModel, flatten_inputs, from_torch, trace_torch, unflatten_outputs


class Tagger(nn.Module):
    """Token ids and features in, a dict with a nested tuple out; a keyword mask and a Python scale."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.proj = nn.Linear(8, 3)

    def forward(self, ids, features, *, mask=None, scale=1.0):
        h = self.embed(ids) + features
        h = h * mask[..., None] * scale
        return {"logits": self.proj(h), "pooled": (h.mean(1), h.amax(1))}


def example():
    torch.manual_seed(0)
    ids = torch.randint(0, 20, (2, 5))
    return Tagger().eval(), (ids, torch.randn(2, 5, 8)), {"mask": torch.ones(2, 5, dtype=torch.int64), "scale": 2.0}


def test_structured_inputs_and_outputs_round_trip():
    model, args, kwargs = example()
    traced = trace_torch(model, args, kwargs)
    assert isinstance(traced, TracedModel)
    # the jaxpr takes the flattened tensors: ids and mask as int32 (JAX runs without x64)
    assert [(tuple(v.aval.shape), str(v.aval.dtype)) for v in traced.closed.jaxpr.invars] == \
        [((2, 5), "int32"), ((2, 5, 8), "float32"), ((2, 5), "int32")]
    assert len(traced.closed.jaxpr.outvars) == 3
    json.loads(traced.in_tree)        # both trees are JSON text, to save beside a program
    json.loads(traced.out_tree)
    out = traced(*args, **kwargs)
    with torch.no_grad():
        ref = model(*args, **kwargs)
    assert set(out) == {"logits", "pooled"} and isinstance(out["pooled"], tuple)
    assert rel_err(out["logits"], ref["logits"].numpy()) < 1e-6
    assert rel_err(out["pooled"][1], ref["pooled"][1].numpy()) < 1e-6


def test_flatten_and_unflatten_are_the_jaxprs_interface():
    model, args, kwargs = example()
    traced = trace_torch(model, args, kwargs)
    flat = flatten_inputs(traced.in_tree, args, {"scale": 2.0, "mask": kwargs["mask"]})   # keyword order is free
    assert [a.dtype for a in flat] == [np.int32, np.float32, np.int32]
    rebuilt = unflatten_outputs(traced.out_tree, [np.zeros(3), np.ones(2), np.full(1, 2.0)])
    assert list(rebuilt) == ["logits", "pooled"] and rebuilt["pooled"][1][0] == 2.0
    with pytest.raises(ValueError, match="2 output arrays for an output structure of 3"):
        unflatten_outputs(traced.out_tree, [np.zeros(3), np.ones(2)])


def test_inputs_that_differ_from_the_trace_are_named():
    model, args, kwargs = example()
    traced = trace_torch(model, args, kwargs)
    with pytest.raises(ValueError, match=r"args\[1\] is float32 \(2, 4, 8\), but the model was traced with "
                                         r"float32 \(2, 5, 8\)$"):
        flatten_inputs(traced, (args[0], torch.randn(2, 4, 8)), kwargs)
    with pytest.raises(ValueError, match=r"kwargs\['scale'\] is 3.0, but the model was traced with 2.0"):
        flatten_inputs(traced, args, {**kwargs, "scale": 3.0})
    with pytest.raises(ValueError, match=r"kwargs\['scale'\] is a tensor, but the model was traced with 2.0"):
        flatten_inputs(traced, args, {**kwargs, "scale": torch.tensor(2.0)})
    with pytest.raises(ValueError, match=r"args\[0\] is 7, but the model was traced with a tensor"):
        flatten_inputs(traced, (7, args[1]), kwargs)
    with pytest.raises(ValueError) as e:
        flatten_inputs(traced, args, {"mask": kwargs["mask"]})
    assert str(e.value) == ("expected 4 inputs: args[0] int32 (2, 5), args[1] float32 (2, 5, 8), kwargs['mask'] "
                            "int32 (2, 5), kwargs['scale'] = 2.0; got 3: args[0] int64 (2, 5), args[1] float32 "
                            "(2, 5, 8), kwargs['mask'] int64 (2, 5) (missing: kwargs['scale'])")


def test_inputs_in_other_containers_are_pictured():
    class Pair(nn.Module):
        def forward(self, pair):
            return pair[0] + pair[1]

    a, b = torch.randn(3), torch.randn(3)
    traced = trace_torch(Pair(), ((a, b),))
    with pytest.raises(ValueError, match=r"; got 2: args\[0\]\[0\] float32 \(3,\), args\[0\]\[1\] float32 \(3,\) "
                                         r"\(in other containers: expected \(\(\(\*, \*\),\), \{\}\), "
                                         r"got \(\(\[\*, \*\],\), \{\}\)\)$"):
        flatten_inputs(traced, ([a, b],))


@pytest.mark.parametrize("value, fragment", [
    (torch.ones(2, 5, 8, dtype=torch.int32), "integer values where it takes floating-point ones"),
    (torch.ones(2, 5, 8, dtype=torch.bool), "bool values where it takes floating-point ones"),
])
def test_a_tensor_of_another_kind_of_number_is_refused(value, fragment):
    model, args, kwargs = example()
    traced = trace_torch(model, args, kwargs)
    with pytest.raises(ValueError, match=fragment):
        flatten_inputs(traced, (args[0], value), kwargs)
    with pytest.raises(ValueError, match=r"args\[0\] is float32 \(2, 5\), .* floating-point values where it "
                                         "takes integer"):
        flatten_inputs(traced, (args[0].float(), args[1]), kwargs)


def test_int64_beyond_int32_is_an_error_not_a_wrap():
    model, args, kwargs = example()
    traced = trace_torch(model, args, kwargs)
    with pytest.raises(ValueError, match="beyond int32's range"):
        flatten_inputs(traced, (args[0] + 2**40, args[1]), kwargs)


def test_single_tensor_and_bfloat16_inputs():
    model = nn.Linear(4, 2).to(torch.bfloat16).eval()
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    traced = trace_torch(model, x)      # a lone tensor stands for (x,)
    assert str(traced.closed.jaxpr.invars[0].aval.dtype) == "bfloat16"
    out = traced(x)
    assert str(out.dtype) == "bfloat16"
    assert rel_err(out.astype(np.float32), model(x).detach().float().numpy()) < 1e-2
    assert traced.note == ""


def test_from_torch_is_trace_torch_closed():
    model, args, kwargs = example()
    closed = from_torch(model, args, kwargs)
    assert str(closed) == str(trace_torch(model, args, kwargs).closed)


def test_an_output_container_of_a_module_not_yet_imported_is_rebuilt_by_importing_it():
    """`stagec run` of a zoo model: the program's out_tree names transformers' ModelOutput, which a fresh
    process has not registered; reading it imports transformers.modeling_outputs instead of failing."""
    import subprocess
    import sys

    import torch.utils._pytree as pytree
    from transformers.modeling_outputs import BaseModelOutput
    text = pytree.treespec_dumps(pytree.tree_structure(BaseModelOutput(last_hidden_state=torch.zeros(1))))
    code = ("import sys; from stagec.frontend.trace import read_out_tree; "
            "assert 'transformers' not in sys.modules; print(read_out_tree(sys.stdin.read()).type.__name__)")
    out = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "BaseModelOutput"
