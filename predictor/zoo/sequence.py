"""Sequence and fully-connected families: ParaDNN-style LSTM, GRU, MLP; transformer encoder.

The recurrent models follow ParaDNN's parameterisation (embedding, layers, hidden
size; Horus uses sentence length 200 and a 10,000-word vocabulary). The encoder
spells attention as explicit MatMul/Softmax so that its ONNX graph shows the
attention chain the feature extractor counts, whatever the exporter's fast paths.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class RecurrentLM(nn.Module):
    """Embedding -> LSTM/GRU stack -> per-step projection onto the vocabulary."""

    def __init__(
        self,
        cell: str = "lstm",
        vocab: int = 10000,
        embedding: int = 256,
        hidden: int = 512,
        layers: int = 2,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, embedding)
        rnn = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = rnn(embedding, hidden, layers, batch_first=True)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.proj(out)


class MLP(nn.Module):
    """ParaDNN fully-connected model: ``layers`` hidden Linear+ReLU of ``hidden`` units."""

    def __init__(
        self, input_dim: int = 784, hidden: int = 1024, layers: int = 4, num_classes: int = 10
    ):
        super().__init__()
        dims = [input_dim] + [hidden] * layers
        body: list[nn.Module] = []
        for cin, cout in zip(dims[:-1], dims[1:], strict=True):
            body += [nn.Linear(cin, cout), nn.ReLU()]
        body.append(nn.Linear(dims[-1], num_classes))
        self.body = nn.Sequential(*body)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention written as MatMul -> Softmax -> MatMul."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        if d_model % heads:
            raise ValueError("d_model must be divisible by heads")
        self.heads, self.head_dim = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out(ctx.transpose(1, 2).reshape(b, t, d))


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer: LayerNorm, attention, LayerNorm, GELU feed-forward."""

    def __init__(self, d_model: int, heads: int, ff: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads)
        self.ff = nn.Sequential(nn.Linear(d_model, ff), nn.GELU(), nn.Linear(ff, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm1(x)))
        return x + self.drop(self.ff(self.norm2(x)))


class TransformerEncoder(nn.Module):
    """BERT-style encoder classifier over token ids (learned positions, mean pooling)."""

    def __init__(
        self,
        vocab: int = 10000,
        seq_len: int = 128,
        d_model: int = 256,
        heads: int = 4,
        layers: int = 4,
        ff: int = 1024,
        dropout: float = 0.1,
        num_classes: int = 2,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(1, seq_len, d_model))
        self.layers = nn.Sequential(
            *(EncoderLayer(d_model, heads, ff, dropout) for _ in range(layers))
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.embed(tokens) + self.pos[:, : tokens.shape[1]])
        return self.head(self.norm(x).mean(dim=1))
