"""Exercise: single-head self-attention, as the tutorials build it.

The attention of "Build a Large Language Model (From Scratch)", chapter 3: a
`SelfAttention` module with three nn.Linear projections W_query, W_key and
W_value, and the five steps of its forward pass as top-level functions, from
`project_qkv` down to `weighted_sum`. The steps are functions, not methods, on
purpose: each is graded on its own with the grader's inputs, so a bug in one
step does not hide your work on the others. Use them in `SelfAttention.forward`
(or call the nn.Linear layers directly there; both are fine).

Fill in each function in order; each TODO comment marks the one place to write.
Grade your work with:

    attn-grade exercises/self_attention.py

Hints come from the grader, not from this file. Every function keeps the dtype
and device of its floating-point inputs and returns plain torch.Tensors. Once
SelfAttention works, `python exercises/self_attention.py` runs the worked
example at the bottom.
"""

import math

import torch
from torch import nn


def project_qkv(
    x: torch.Tensor,
    w_query: torch.Tensor,
    w_key: torch.Tensor,
    w_value: torch.Tensor,
    b_query: torch.Tensor | None = None,
    b_key: torch.Tensor | None = None,
    b_value: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Project every token to its query, key and value: x @ W^T + b, three times.

    Shapes: x (..., T, d_in); each weight (d_out, d_in), the layout nn.Linear
    stores (W_query.weight); each bias (d_out,) or None -> the tuple
    (queries, keys, values), each (..., T, d_out). Any number of leading dims,
    none included.

    Why: attention looks at every token three ways, each through its own
    learned matrix: as a query (what it is looking for), as a key (what it
    offers to be matched against) and as a value (what it passes on when it
    is matched). d_out need not equal d_in.

    Must not call F.linear.
    """
    # TODO
    raise NotImplementedError("project_qkv: not implemented yet")


def attention_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key: queries @ keys^T.

    Shapes: queries (..., Tq, d_out), keys (..., Tk, d_out) -> (..., Tq, Tk),
    any number of leading dims, none included. Entry [..., i, j] is
    q_i . k_j, the unnormalized attention score of token i on token j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one matmul scores all
    pairs at once. The tutorials' keys.T works only without a batch dim.
    """
    # TODO
    raise NotImplementedError("attention_scores: not implemented yet")


def scale_scores(scores: torch.Tensor, d_out: int) -> torch.Tensor:
    """Divide the scores by sqrt(d_out), the width of the keys. Same shape out.

    Why: q . k is a sum of d_out products, so with unit-variance entries its
    variance grows with d_out. Dividing by sqrt(d_out) brings the scores back
    to unit scale, so the softmax does not saturate into a one-hot whose
    gradients vanish. It is the key width d_out, not the input width d_in.
    """
    # TODO
    raise NotImplementedError("scale_scores: not implemented yet")


def softmax(scores: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along `dim`: exp(s_i) / sum_j exp(s_j). Same shape out.

    Must be numerically stable: entries of +-1e4 in float32 must not give inf
    or NaN.

    Why: it turns the scores of one query into attention weights, positive
    and summing to 1 over the keys. Why it needs care: exp overflows float32
    above about 88, and softmax(s) == softmax(s - c) for any c constant along
    dim, so the max can be subtracted first.

    Must not call torch.softmax, F.softmax, Tensor.softmax, log_softmax or
    nn.Softmax.
    """
    # TODO
    raise NotImplementedError("softmax: not implemented yet")


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Mix the values with the attention weights: context_i = sum_j weights_ij * values_j.

    Shapes: weights (..., Tq, Tk), values (..., Tk, d_out) -> (..., Tq, d_out),
    any number of leading dims, none included. Row i is the context vector of
    token i.

    Why: each token's context vector is the average of all the value vectors,
    weighted by how much that token attends to each of them.
    """
    # TODO
    raise NotImplementedError("weighted_sum: not implemented yet")


class SelfAttention(nn.Module):
    """Single-head self-attention with nn.Linear projections (no mask, no dropout).

    __init__(d_in, d_out, qkv_bias=False) creates three
    nn.Linear(d_in, d_out, bias=qkv_bias) layers named W_query, W_key and
    W_value (the grader loads weights by these names).

    forward(x): x (B, T, d_in), or (T, d_in) unbatched as in the demo
    below -> the context vectors (B, T, d_out) (or (T, d_out)): softmax of
    the scores scaled by sqrt(d_out), over the keys, times the values.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        # TODO
        raise NotImplementedError("SelfAttention.__init__: not implemented yet")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Context vectors: (B, T, d_in) -> (B, T, d_out)."""
        # TODO
        raise NotImplementedError("SelfAttention.forward: not implemented yet")


if __name__ == "__main__":
    # The classic worked example: "Your journey starts with one step", one 3-d embedding per token.
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89],  # Your     (x^1)
         [0.55, 0.87, 0.66],  # journey  (x^2)
         [0.57, 0.85, 0.64],  # starts   (x^3)
         [0.22, 0.58, 0.33],  # with     (x^4)
         [0.77, 0.25, 0.10],  # one      (x^5)
         [0.05, 0.80, 0.55]]  # step     (x^6)
    )
    torch.manual_seed(123)
    sa = SelfAttention(d_in=3, d_out=2)
    print(sa(inputs))  # (6, 2): one 2-d context vector per token; the reference prints
    # tensor([[-0.5337, -0.1051], [-0.5323, -0.1080], [-0.5323, -0.1079],
    #         [-0.5297, -0.1076], [-0.5311, -0.1066], [-0.5299, -0.1081]])
    batch = torch.stack((inputs, inputs))  # (2, 6, 3)
    print(sa(batch).shape)  # torch.Size([2, 6, 2])
