"""Full-size layer shapes of ResNet-50 (224x224) and BERT-base (128 tokens), each as a one-layer
graph the simulator can run: the fidelity workloads of bench_costmodel.py.

Built from small PyTorch modules, one per distinct shape (tracing the whole networks would take
minutes and add nothing: the cost model and the simulator see one layer at a time).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from torch import nn

from stagec.layers import Layer, model_graph, model_layers

# (in channels, out channels, kernel, stride, input size) of ResNet-50's distinct convolutions
RESNET50_CONVS = [
    (3, 64, 7, 2, 224),
    (64, 64, 1, 1, 56), (64, 64, 3, 1, 56), (64, 256, 1, 1, 56), (256, 64, 1, 1, 56),
    (256, 128, 1, 1, 56), (128, 128, 3, 2, 56), (128, 512, 1, 1, 28), (256, 512, 1, 2, 56),
    (512, 128, 1, 1, 28), (128, 128, 3, 1, 28),
    (512, 256, 1, 1, 28), (256, 256, 3, 2, 28), (256, 1024, 1, 1, 14), (512, 1024, 1, 2, 28),
    (1024, 256, 1, 1, 14), (256, 256, 3, 1, 14),
    (1024, 512, 1, 1, 14), (512, 512, 3, 2, 14), (512, 2048, 1, 1, 7), (1024, 2048, 1, 2, 14),
    (2048, 512, 1, 1, 7), (512, 512, 3, 1, 7),
]
# (in features, out features) of BERT-base's linear layers over 128 tokens; attention's batched matmuls
BERT_LINEARS = [(768, 768), (768, 3072), (3072, 768)]
BERT_TOKENS, BERT_HEADS, BERT_HEAD_DIM = 128, 12, 64


def _one(name: str, module_or_fn, args) -> tuple[str, object, Layer]:
    graph = model_graph(module_or_fn, args)
    return name, graph, model_layers(graph)[0]


def resnet50_layers() -> list[tuple[str, object, Layer]]:
    """(name, one-layer graph, its Layer) of each distinct ResNet-50 layer shape."""
    out = []
    for cin, cout, k, stride, size in RESNET50_CONVS:
        conv = nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2), nn.ReLU())
        out.append(_one(f"resnet50/conv{k}x{k}s{stride} {cin}->{cout} @{size}", conv,
                        (torch.randn(1, cin, size, size),)))
    out.append(_one("resnet50/fc 2048->1000", nn.Linear(2048, 1000), (torch.randn(1, 2048),)))
    out.append(_one("resnet50/maxpool3x3s2 @112", nn.MaxPool2d(3, 2, 1), (torch.randn(1, 64, 112, 112),)))
    return out


def bert_layers() -> list[tuple[str, object, Layer]]:
    """(name, one-layer graph, its Layer) of each distinct BERT-base layer shape."""
    out = [_one(f"bert/linear {i}->{o} x{BERT_TOKENS}", nn.Linear(i, o), (torch.randn(BERT_TOKENS, i),))
           for i, o in BERT_LINEARS]

    def scores(q, k):
        return jnp.matmul(q, jnp.swapaxes(k, -1, -2))

    def context(p, v):
        return jnp.matmul(p, v)

    q = jnp.zeros((BERT_HEADS, BERT_TOKENS, BERT_HEAD_DIM), jnp.float32)
    p = jnp.zeros((BERT_HEADS, BERT_TOKENS, BERT_TOKENS), jnp.float32)
    out.append(_one(f"bert/attention scores {BERT_HEADS}x", scores, (q, q)))
    out.append(_one(f"bert/attention context {BERT_HEADS}x", context, (p, q)))
    return out
