"""Exercise: FlashAttention's forward pass, tile by tile, written from scratch in PyTorch.

Plain attention builds the whole Tq × Tk matrix of scores, softmaxes it and
multiplies it with the values. FlashAttention gives the same result without
ever holding that matrix: it walks over tiles of block_q queries × block_k keys,
keeping for each query a running max, a running sum and an unnormalised output
(the online softmax), and returns with the output the log-sum-exp of each row.
Write the online-softmax update of one key block, the merge of two partial
results (the step of split-KV decoding and ring attention), and the tiled
attention itself.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/flash_attention.py

Hints come from the grader, not from this file. Every function returns its
results on the device of its inputs. The grader checks the shapes of the
tensors flash_attention's torch calls create: no more than one
block_q × block_k tile of scores per batch and head at a time.
"""

import math

import torch


def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, scores: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One key block of the running (online) softmax: returns the new state (m, l, acc).

    State, for each query row: m (..., Tq) the largest score seen so far, l
    (..., Tq) the sum of e^(score - m) over the keys seen so far, acc
    (..., Tq, Dv) the sum of e^(score - m) · v over them (unnormalised: the
    output so far is acc / l). The next key block: scores (..., Tq, Bk), already
    scaled and masked (a blocked key is -inf), and its values v (..., Bk, Dv).
    Every tensor has one float dtype (float32 or float64), and the results keep it.

        m' = max(m, rowmax(scores))
        l' = e^(m - m') · l + Σ_j e^(scores_j - m')
        acc' = e^(m - m') · acc + e^(scores - m') @ v

    The state starts at m = -inf, l = 0, acc = 0. A row whose scores so far are
    all -inf stays at m = -inf, l = 0, acc = 0: never NaN (e^(-inf - -inf) is NaN,
    so such a row must not subtract its max).

    Why: softmax needs the max and the sum over all keys before it can weigh
    any value; this update needs only the block at hand. When a block raises the
    max, what was summed so far was summed relative to the old max, and the
    factor e^(m - m') (at most 1) brings it to the new one. Subtracting the
    running max keeps every exponent <= 0, so nothing overflows.
    """
    # TODO
    raise NotImplementedError("online_softmax_update: not implemented yet")


def merge_partials(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two attention results over disjoint sets of keys into the result over their union: (o, lse).

    o1, o2 (..., Tq, Dv): each part's normalised output (softmax over its own
    keys @ their values); lse1, lse2 (..., Tq): each part's log-sum-exp of its
    scores, log Σ_j e^(score_j). The union's lse is log(e^lse1 + e^lse2), and
    its output weighs each part by its share of the union's sum:

        o = e^(lse1 - lse) · o1 + e^(lse2 - lse) · o2

    A part with lse = -inf (no keys, a fully masked row) weighs 0 and leaves the
    other unchanged; when both are -inf, o = 0 and lse = -inf. o keeps o1's
    dtype (computed in float32 at least), lse keeps lse1's (float32, or
    float64).

    Why: this is how split-KV decoding (flash-decoding) and ring attention put
    together attention computed on different devices or streams over different
    slices of the keys, and how flash_attention's tiles could be put together
    too. Never add e^lse directly: lse can be 1e4, and e^1e4 overflows.
    """
    # TODO
    raise NotImplementedError("merge_partials: not implemented yet")


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = 32,
    block_k: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention computed tile by tile, never holding the whole score matrix: returns (out, lse).

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), any leading dims
    (batch, heads). Scores are q · k / sqrt(D); with causal=True the mask is
    aligned to the bottom-right: query i sits at position Tk - Tq + i and sees
    the keys j <= Tk - Tq + i. Returns out (..., Tq, Dv) in q's dtype, the
    softmax over the keys @ v, and lse (..., Tq), the log-sum-exp of each row's
    scaled, masked scores, in float32 (float64 for float64 inputs). Any Tq and Tk
    work, multiples of the block sizes or not. A row with no key to see (causal
    with Tq > Tk) gives out 0 and lse -inf.

    Loop over blocks of block_q queries and block_k keys; for each tile, its
    scores (..., block_q, block_k), masked, go through online_softmax_update;
    after the last key block, out = acc / l and lse = m + log(l). At no time may
    more than one block_q × block_k tile of scores per batch and head exist (the
    grader checks the shapes of the tensors your torch calls create), and
    F.scaled_dot_product_attention and any softmax are off limits, as is reading
    a tensor's values into Python (int(), float(), .item(), .tolist(), NumPy,
    printing one): bounds come from shapes and block sizes. Compute in float32
    (or float64) whatever q's dtype, as FlashAttention does.

    Why: the Tq × Tk score matrix of a long sequence does not fit in a GPU's
    fast on-chip memory (SRAM), and writing it out to slow memory and reading
    it back is what makes plain attention slow. Tiles that fit, combined with
    the running max and sum of online_softmax_update, give the exact same
    result. lse is all the backward pass needs to recompute the softmax of a
    tile, and what merge_partials needs to put partial results together.
    """
    # TODO
    raise NotImplementedError("flash_attention: not implemented yet")
