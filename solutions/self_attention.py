"""Reference solution: single-head self-attention, as the tutorials build it.

A model answer to exercises/self_attention.py: the same functions with the same
contracts, each written as the shortest clear code, with the shape of every
matmul in a comment. Compare with your own once the grader passes, or when you
are stuck on a step.
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
    projections = []
    for w, b in ((w_query, b_query), (w_key, b_key), (w_value, b_value)):
        y = x @ w.T  # (..., T, d_in) x (d_in, d_out) -> (..., T, d_out)
        projections.append(y if b is None else y + b)  # bias (d_out,) broadcasts over the tokens
    return tuple(projections)  # (queries, keys, values)


def attention_scores(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Dot product of every query with every key: queries @ keys^T.

    Shapes: queries (..., Tq, d_out), keys (..., Tk, d_out) -> (..., Tq, Tk),
    any number of leading dims, none included. Entry [..., i, j] is
    q_i . k_j, the unnormalized attention score of token i on token j.

    Why: the dot product is large when a query and a key point the same way,
    so it scores how relevant token j is to token i; one matmul scores all
    pairs at once. The tutorials' keys.T works only without a batch dim.
    """
    return queries @ keys.transpose(-2, -1)  # (..., Tq, d) x (..., d, Tk) -> (..., Tq, Tk)


def scale_scores(scores: torch.Tensor, d_out: int) -> torch.Tensor:
    """Divide the scores by sqrt(d_out), the width of the keys. Same shape out.

    Why: q . k is a sum of d_out products, so with unit-variance entries its
    variance grows with d_out. Dividing by sqrt(d_out) brings the scores back
    to unit scale, so the softmax does not saturate into a one-hot whose
    gradients vanish. It is the key width d_out, not the input width d_in.
    """
    return scores / math.sqrt(d_out)  # a Python float keeps the dtype of scores


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
    # The shift changes nothing mathematically, so no gradient needs to flow through it.
    e = torch.exp(scores - scores.amax(dim=dim, keepdim=True).detach())  # largest exponent is exp(0) = 1
    return e / e.sum(dim=dim, keepdim=True)  # keepdim: (..., 1) broadcasts back along dim


def weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Mix the values with the attention weights: context_i = sum_j weights_ij * values_j.

    Shapes: weights (..., Tq, Tk), values (..., Tk, d_out) -> (..., Tq, d_out),
    any number of leading dims, none included. Row i is the context vector of
    token i.

    Why: each token's context vector is the average of all the value vectors,
    weighted by how much that token attends to each of them.
    """
    return weights @ values  # (..., Tq, Tk) x (..., Tk, d_out) -> (..., Tq, d_out)


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
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Context vectors: (B, T, d_in) -> (B, T, d_out)."""
        q, k, v = project_qkv(
            x, self.W_query.weight, self.W_key.weight, self.W_value.weight,
            self.W_query.bias, self.W_key.bias, self.W_value.bias,
        )  # each (B, T, d_out)
        scores = scale_scores(attention_scores(q, k), self.d_out)  # (B, T, T)
        weights = softmax(scores, dim=-1)  # (B, T, T): each row sums to 1 over the keys
        return weighted_sum(weights, v)  # (B, T, T) x (B, T, d_out) -> (B, T, d_out)


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
    print(sa(inputs))  # (6, 2): one 2-d context vector per token
    batch = torch.stack((inputs, inputs))  # (2, 6, 3)
    print(sa(batch).shape)  # torch.Size([2, 6, 2])
