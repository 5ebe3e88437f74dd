"""The model zoo through the frontend: each model (reduced config, the same classes) traced, its
jaxpr evaluated by JAX, matching PyTorch eager; the full-size configs are the published architectures."""

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import evaluate, rel_err

from stagec import InputError, zoo
from stagec.frontend import trace_torch

# Parameter counts of the published architectures (torchvision / the original checkpoints' configs:
# 1000 ImageNet classes, 150 ADE20K classes for Segformer, BertModel with its pooler).
PUBLISHED_PARAMETERS = {
    "resnet18": 11_689_512, "resnet50": 25_557_032, "mobilenet_v2": 3_504_872, "efficientnet_b0": 5_288_548,
    "vit_b16": 86_567_656, "bert_base": 109_482_240, "segformer_b0": 3_752_694, "whisper_tiny_encoder": 8_208_384,
}
FULL_SIZE_INPUTS = {
    "bert_base": [(1, 128)], "segformer_b0": [(1, 3, 512, 512)], "whisper_tiny_encoder": [(1, 80, 3000)],
}


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_reduced_model_matches_pytorch(name):
    model, args, kwargs = zoo.build(name, reduced=True)
    traced = trace_torch(model, args, kwargs)
    out = evaluate(traced, args, kwargs)
    with torch.no_grad():
        ref = model(*args, **kwargs)
    assert type(out) is type(ref)     # the model's own output structure (a ModelOutput here)
    outs, refs = pytree.tree_leaves(out), pytree.tree_leaves(ref)
    assert len(outs) == len(refs) > 0
    for got, expected in zip(outs, refs, strict=True):
        assert np.abs(expected.numpy()).max() > 1e-3    # a live network, not vanished activations
        assert rel_err(got, expected.numpy()) < 1e-4


@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_full_size_config_is_the_published_architecture(name):
    with torch.device("meta"):     # sizes without allocating the weights
        model, args, kwargs = zoo.build(name)
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED_PARAMETERS[name]
    assert [tuple(a.shape) for a in args] == FULL_SIZE_INPUTS.get(name, [(1, 3, 224, 224)])
    assert not model.training


def test_bert_takes_token_ids_and_an_attention_mask():
    model, args, kwargs = zoo.build("bert_base", reduced=True)
    assert args[0].dtype == torch.int64 and set(kwargs) == {"attention_mask"}
    assert (kwargs["attention_mask"] == 0).any()    # padding is masked, so the mask matters
    traced = trace_torch(model, args, kwargs)
    assert [str(v.aval.dtype) for v in traced.closed.jaxpr.invars] == ["int32", "int32"]
    assert "int64 inputs run as their 32-bit types" in traced.note


def test_unknown_zoo_name_lists_the_zoo():
    with pytest.raises(InputError, match="resnet18"):
        zoo.build("resnet19")
