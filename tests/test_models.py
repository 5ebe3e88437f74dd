"""Models from outside the zoo, each of which found a gap (named beside it), built from transformers
config classes at a small size with the zoo's seeded weights, compiled and run against PyTorch.

The programs run on the reference interpreter: on programs this small it takes milliseconds where the
batched executor spends seconds compiling its groups (test_end_to_end runs the same lowering paths
through stagec.simulate)."""

import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree
from helpers import rel_err

import stagec
from stagec import zoo
from stagec.frontend import flatten_inputs
from stagec.sim.reference import execute


def _image(size: int) -> tuple:
    return (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1)),)


def swin():
    """Shifted windows, a relative position table indexed by a buffer (aten.index on a weight: numpy has
    no .at) and a pooler whose adaptive_avg_pool1d leaves an aten.as_strided."""
    hf = zoo._transformers()
    config = hf.SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=[2], num_heads=[2], window_size=4,
                           attn_implementation="sdpa")
    return zoo._instantiate(hf.SwinModel, config), _image(16)


def levit():
    """Attention biases indexed by a buffer (aten.index on a weight)."""
    hf = zoo._transformers()
    config = hf.LevitConfig(image_size=32, hidden_sizes=[16, 24], num_attention_heads=[1, 2], depths=[1, 1],
                            key_dim=[8, 8], down_ops=[["Subsample", 8, 1, 4, 2, 2]])
    return zoo._instantiate(hf.LevitModel, config), _image(32)


def roberta():
    """Position ids are a running count of the non-padding tokens: cumsum of a mask from the input ids."""
    hf = zoo._transformers()
    config = hf.RobertaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=24, attn_implementation="sdpa")
    ids = torch.randint(2, 50, (1, 12), generator=torch.Generator().manual_seed(1))
    ids[:, 9:] = config.pad_token_id
    return zoo._instantiate(hf.RobertaModel, config), (ids,)


def funnel():
    """Relative attention shifts its position scores with torch.gather (XLA batching dims)."""
    hf = zoo._transformers()
    config = hf.FunnelConfig(vocab_size=50, block_sizes=[1, 1], d_model=16, n_head=2, d_head=8, d_inner=32)
    return zoo._instantiate(hf.FunnelBaseModel, config), (torch.randint(0, 50, (1, 8),
                                                                          generator=torch.Generator().manual_seed(1)),)


def falcon():
    """Multi-query attention: scaled_dot_product_attention of two query heads over one key and value head,
    its batch axes broadcast."""
    hf = zoo._transformers()
    config = hf.FalconConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             use_cache=False)
    return zoo._instantiate(hf.FalconModel, config), (torch.randint(0, 50, (1, 8),
                                                                    generator=torch.Generator().manual_seed(1)),)


@pytest.mark.parametrize("build", [swin, levit, roberta, funnel, falcon], ids=lambda build: build.__name__)
def test_model_compiles_and_runs_as_pytorch(build):
    model, args = build()
    program = stagec.compile(model, args)
    got = execute(program, flatten_inputs(program.metadata["in_tree"], args))
    with torch.no_grad():
        want = [t.numpy() for t in pytree.tree_leaves(model(*args)) if isinstance(t, torch.Tensor)]
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).shape == w.shape and rel_err(g, w) < 1e-4
