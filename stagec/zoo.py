"""A model zoo: the networks people deploy on wearables, built from `transformers` config classes.

Weights are random (seeded) and nothing is downloaded: each builder makes the config, instantiates the
model class and returns it in eval mode with example inputs. `reduced=True` keeps the architecture and
the model class but uses fewer, narrower layers and small inputs, so tests run in seconds; the full-size
configs match the published architectures' layer counts and widths (for benchmarks).

    >>> from stagec import zoo
    >>> model, args, kwargs = zoo.build("resnet18", reduced=True)
    >>> logits = model(*args, **kwargs).logits
"""

from __future__ import annotations

import errno
import importlib.util
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from stagec.errors import InputError

Example = tuple[torch.nn.Module, tuple, dict]
IMAGENET_CLASSES = 1000
ADE20K_CLASSES = 150          # Segformer's semantic-segmentation benchmark
ZOO: dict[str, Callable[[bool], Example]] = {}


def register(fn: Callable[[bool], Example]) -> Callable[[bool], Example]:
    ZOO[fn.__name__] = fn
    return fn


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise ImportError("the model zoo builds models with transformers: pip install transformers==5.24.0") from e
    return transformers


def build(name: str, reduced: bool = False) -> Example:
    """(model in eval mode, args, kwargs) for the zoo model `name`, with seeded random weights."""
    if name not in ZOO:
        raise InputError(f"no zoo model {name!r}; the zoo has {', '.join(sorted(ZOO))}")
    return ZOO[name](reduced)


def load_example(spec: str, reduced: bool = False) -> Example:
    """A zoo model by name, or `path/to/file.py:factory` whose factory() returns (model, args) or
    (model, args, kwargs): what `stagec ops` takes.  A file that does not import, a factory that
    raises or returns something else is an InputError that says so."""
    if spec in ZOO:
        return build(spec, reduced)
    path, _, factory = spec.rpartition(":")
    if not path.endswith(".py") or not factory:
        raise InputError(f"{spec!r} is neither a zoo model ({', '.join(sorted(ZOO))}) nor path/to/file.py:factory")
    if not Path(path).is_file():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file: whatever it raises is the user's to fix
        raise InputError(f"{path} failed to import: {type(e).__name__}: {e}") from e
    if not callable(getattr(module, factory, None)):
        raise InputError(f"{path} has no function {factory}")
    try:
        example = getattr(module, factory)()
    except Exception as e:  # noqa: BLE001 - as above
        raise InputError(f"{spec}: {factory}() raised {type(e).__name__}: {e}") from e
    return _example(spec, factory, example)


def _example(spec: str, factory: str, example) -> Example:
    """(model, args, kwargs) from what a factory returned, or an InputError that names it."""
    ok = (isinstance(example, tuple) and len(example) in (2, 3) and isinstance(example[0], torch.nn.Module)
          and (len(example) == 2 or isinstance(example[2], dict)))
    if not ok:
        parts = (f"({', '.join(type(v).__name__ for v in example)})" if isinstance(example, tuple)
                 else type(example).__name__)
        raise InputError(f"{spec}: {factory}() returned {parts}; expected (torch.nn.Module, args) or "
                         "(torch.nn.Module, args, kwargs dict)")
    model, args, *kwargs = example
    return model, args if isinstance(args, tuple) else (args,), (kwargs[0] if kwargs else {})


_NORMS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)


def _instantiate(model_class, config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = model_class(config).eval()
    # NOTE: transformers' initializers leave norms at the identity (batch norm with zero mean, unit
    # variance), or, for EfficientNet, scale them by ~0.02 per block until the logits are exactly 0.
    # Varied, well-scaled norm parameters keep every layer's arithmetic visible to a comparison.
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, _NORMS) and module.weight is not None:
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.running_mean.uniform_(-0.2, 0.2)
                module.running_var.uniform_(0.5, 1.5)
    return model


# NOTE: example inputs are made on the CPU explicitly, so that under `with torch.device("meta")` (a
# model's size without allocating its weights, as the tests check it) they stay real tensors.
def _images(size: int, channels: int = 3) -> tuple:
    return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(1), device="cpu"),)


def _resnet(layer_type: str, depths: list[int], widths: list[int], reduced: bool = False) -> Example:
    hf = _transformers()
    stem, size = 64, 224
    if reduced:
        depths, widths, stem, size = [1] * len(depths), [w // 16 for w in widths], 8, 32
    config = hf.ResNetConfig(layer_type=layer_type, hidden_sizes=widths, depths=depths, embedding_size=stem,
                             num_labels=10 if reduced else IMAGENET_CLASSES)
    return _instantiate(hf.ResNetForImageClassification, config), _images(size), {}


ZOO["resnet18"] = partial(_resnet, "basic", [2, 2, 2, 2], [64, 128, 256, 512])
ZOO["resnet50"] = partial(_resnet, "bottleneck", [3, 4, 6, 3], [256, 512, 1024, 2048])


@register
def mobilenet_v2(reduced: bool = False) -> Example:
    # MobileNetV2's 17 inverted-residual blocks are fixed by the class; reduced narrows them (0.25x).
    hf = _transformers()
    config = hf.MobileNetV2Config(depth_multiplier=0.25 if reduced else 1.0, image_size=32 if reduced else 224,
                                  num_labels=10 if reduced else IMAGENET_CLASSES)
    return _instantiate(hf.MobileNetV2ForImageClassification, config), _images(config.image_size), {}


@register
def efficientnet_b0(reduced: bool = False) -> Example:
    # EfficientNetConfig defaults to B7; B0 is width 1.0, depth 1.0, 224x224, a 1280-wide head.
    hf = _transformers()
    width, depth, size = (0.25, 0.34, 32) if reduced else (1.0, 1.0, 224)
    config = hf.EfficientNetConfig(width_coefficient=width, depth_coefficient=depth, image_size=size,
                                   hidden_dim=max(8, int(1280 * width)), dropout_rate=0.2,
                                   num_labels=10 if reduced else IMAGENET_CLASSES)
    return _instantiate(hf.EfficientNetForImageClassification, config), _images(size), {}


@register
def vit_b16(reduced: bool = False) -> Example:
    hf = _transformers()
    dims = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                image_size=32, patch_size=8) if reduced else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
             image_size=224, patch_size=16)
    config = hf.ViTConfig(**dims, num_labels=10 if reduced else IMAGENET_CLASSES, attn_implementation="sdpa")
    return _instantiate(hf.ViTForImageClassification, config), _images(config.image_size), {}


@register
def bert_base(reduced: bool = False) -> Example:
    hf = _transformers()
    dims = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64) \
        if reduced else dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                             intermediate_size=3072)
    config = hf.BertConfig(**dims, attn_implementation="sdpa")
    seq = 16 if reduced else 128
    input_ids = torch.randint(0, config.vocab_size, (1, seq), generator=torch.Generator().manual_seed(1),
                              device="cpu")
    attention_mask = torch.ones(1, seq, dtype=torch.int64, device="cpu")
    attention_mask[:, seq * 3 // 4:] = 0    # a padded tail, as a tokenizer batch has
    return _instantiate(hf.BertModel, config), (input_ids,), {"attention_mask": attention_mask}


@register
def segformer_b0(reduced: bool = False) -> Example:
    hf = _transformers()
    dims = dict(num_encoder_blocks=2, hidden_sizes=[8, 16], depths=[1, 1], num_attention_heads=[1, 2],
                sr_ratios=[4, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2],
                decoder_hidden_size=16) if reduced else {}      # the config's defaults are b0
    config = hf.SegformerConfig(**dims, num_labels=10 if reduced else ADE20K_CLASSES, attn_implementation="sdpa")
    return _instantiate(hf.SegformerForSemanticSegmentation, config), _images(32 if reduced else 512), {}


@register
def whisper_tiny_encoder(reduced: bool = False) -> Example:
    # WhisperConfig's defaults are whisper-tiny: d_model 384, 4 layers, 6 heads, 80 mel bins, 30 s of audio.
    hf = _transformers()
    dims = dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=8,
                max_source_positions=16) if reduced else {}
    config = hf.WhisperConfig(**dims, attn_implementation="sdpa")
    frames = 2 * config.max_source_positions      # the encoder's second conv has stride 2
    mel = torch.randn(1, config.num_mel_bins, frames, generator=torch.Generator().manual_seed(1), device="cpu")
    return _instantiate(hf.models.whisper.modeling_whisper.WhisperEncoder, config), (mel,), {}
