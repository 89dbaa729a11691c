"""Exercise: rotary position embeddings (RoPE), written from scratch in PyTorch.

Llama, Mistral, Qwen and GPT-NeoX give attention its sense of order by rotating the
queries and keys: the features of a head are taken in pairs, and the pair i of the
token at position m is turned by the angle m·θᵢ. The score q(m)·k(n) then depends on
the positions only through m − n. Write the frequencies, the cos and sin tables, the
half rotation, RoPE applied with the tables, RoPE in the other (interleaved) layout,
and a self-attention module that uses it.

There are two layouts, and mixing them up is the classic bug. In the half layout
(GPT-NeoX, Hugging Face Llama: `rotate_half`) feature j is paired with feature
j + Dh/2. In the interleaved layout (GPT-J, Meta's Llama with `view_as_complex`)
feature 2i is paired with feature 2i + 1. Both are right; a checkpoint is trained
with one of them.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/rope.py

Hints come from the grader, not from this file. Shapes are batch first with the
heads on axis 1: (B, H, T, Dh), Dh the head width (even). Positions are integer
tensors (T,) and need not be 0, 1, 2, ...: a decoder with a KV cache, or packed
sequences, give other positions. Every function returns a plain torch.Tensor.
"""

import math

import torch
from torch import nn


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The rotation frequencies: float32 (head_dim // 2,), θᵢ = base^(−2i / head_dim).

    i runs over the pairs, 0 … head_dim/2 − 1, so θ₀ = 1 and the frequencies
    fall geometrically towards 1/base. Always float32.

    Why: pair i turns by m·θᵢ radians at position m. The fast pairs tell
    neighbouring tokens apart; the slow ones still vary over thousands of
    tokens. Llama 3 raises base to 500000 for long contexts.
    """
    # TODO
    raise NotImplementedError("rope_frequencies: not implemented yet")


def rope_cos_sin(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables of the half layout: each float32 (T, head_dim), on the positions' device.

    positions: an integer tensor (T,). Pair i at position m turns by the angle
    m·θᵢ. In the half layout feature j and feature j + head_dim/2 form a pair,
    so columns j and j + head_dim/2 of each table hold the same angle. Returns
    the cosine and the sine of those angles, (cos, sin).

    Always computed in float32, whatever dtype the model runs in: at position
    8192 the angle of the fastest pair is 8192 rad, and bfloat16 spaces its
    numbers there 32 apart (float16 by 4), so a low-precision angle is noise.

    Why: the tables depend only on the positions, so a model computes them once
    per forward pass and shares them across layers and heads.
    """
    # TODO
    raise NotImplementedError("rope_cos_sin: not implemented yet")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., Dh) -> (..., Dh): every pair of the half layout turned by 90 degrees.

    Each pair (a, b) = (x[j], x[j + Dh/2]) becomes (−b, a). Works for any
    number of leading axes.

    Why: with it the rotation of every pair by its angle, (a, b) ->
    (a·cos − b·sin, b·cos + a·sin), is elementwise products with the cos and
    sin tables, with no complex numbers and no gather.
    """
    # TODO
    raise NotImplementedError("rotate_half: not implemented yet")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the half layout: each pair (x[j], x[j + Dh/2]) turned by its angle, with the tables.

    x: (B, H, T, Dh), any float dtype; cos and sin: (T, Dh) float32, from
    rope_cos_sin. Returns (B, H, T, Dh) in x's dtype, computed in float32 (in
    float64 when x is float64), so a bfloat16 x is rounded once, at the end.

    Why: applied to q and k, each after the heads are split, it makes
    q(m)·k(n) a function of m − n: rotations by m·θ and n·θ leave only the
    rotation by (m − n)·θ in the dot product. The values are not rotated.
    """
    # TODO
    raise NotImplementedError("apply_rope: not implemented yet")


def apply_rope_interleaved(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """RoPE in the interleaved layout (GPT-J, Meta's Llama): pair i is (x[..., 2i], x[..., 2i + 1]).

    x: (B, H, T, Dh), any float dtype; positions: an integer tensor (T,).
    Each pair is rotated by positions · θᵢ, θ from rope_frequencies:
    (a, b) -> (a·cos − b·sin, a·sin + b·cos). Returns (B, H, T, Dh) in x's dtype;
    the angles are computed in float32 (float64 for a float64 x).

    Why: Meta's code views the pairs as complex numbers and multiplies by
    e^(i·m·θ). The layouts differ only by an order of the features: the half
    layout applied to x with its features permuted (even ones first, then the
    odd ones) gives this layout's answer, permuted the same way. A checkpoint
    trained with one layout is wrong with the other.
    """
    # TODO
    raise NotImplementedError("apply_rope_interleaved: not implemented yet")


class RotarySelfAttention(nn.Module):
    """Multi-head self-attention with rotary position embeddings (half layout), batch first, no dropout.

    __init__(embed_dim, num_heads, base=10000.0, bias=False) creates w_q, w_k,
    w_v and w_o, each nn.Linear(D, D, bias=bias), D = embed_dim, as in mha (the
    grader loads weights by these names). Raises ValueError unless num_heads
    divides D. Dh = D // num_heads must be even.

    forward(x, positions=None, mask=None): (B, T, D) -> (B, T, D).
    positions: an integer tensor (T,), by default arange(T). mask: bool,
    True = may attend, broadcastable to (B, num_heads, T, T), or None.
    Project, split the heads to (B, H, T, Dh), apply RoPE (half layout, with
    rope_cos_sin and apply_rope) to q and k (never to v), then attention with
    scores / √Dh, merge the heads and project with w_o.

    Why: RoPE rotates each head's features, so it comes after the head split
    (before it, the pairs would straddle heads and the frequencies would run
    over D, not Dh). The values carry content, not position, so they are not
    rotated. Shifting every position by the same amount leaves the output
    unchanged: only the distances between tokens matter.
    """

    def __init__(self, embed_dim: int, num_heads: int, base: float = 10000.0, bias: bool = False) -> None:
        super().__init__()
        # TODO
        raise NotImplementedError("RotarySelfAttention.__init__: not implemented yet")

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Self-attention over x with RoPE on q and k: (B, T, D) -> (B, T, D)."""
        # TODO
        raise NotImplementedError("RotarySelfAttention.forward: not implemented yet")
