"""Exercise: sliding-window attention and ALiBi, written from scratch in PyTorch.

Long-context models bound what each token attends to. Mistral attends to a
sliding window of the most recent keys; BLOOM and MPT use no position
embeddings at all but ALiBi, a bias on the scores that grows with the distance
back, with a slope of its own for each head. Write the window's mask, ALiBi's
slopes and bias, and causal attention with either or both.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/local_attention.py

Hints come from the grader, not from this file. Masks are bool, True = may
attend. Queries are the last t_q of the t_k positions (bottom-right, as after a
KV cache): query i sits at position p = t_k - t_q + i. Every function returns
its result on the device of its inputs (sliding_window_mask: on `device`), in its
inputs' dtype and computed in it: a float64 input taken through .float() loses the
precision the checks ask of it (the half types may be computed in float32).
"""
import math

import torch


def sliding_window_mask(t_q: int, t_k: int, window: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A bool (t_q, t_k) mask, True = may attend: causal, and only the `window` most recent keys.

    The queries are the last t_q of the t_k positions (0 < t_q <= t_k), so the
    mask is aligned to the bottom-right: query i sits at position
    p = t_k - t_q + i. It may attend to key j when p - window < j <= p, that is
    to the `window` most recent keys including itself (Mistral's convention:
    min(p + 1, window) keys per row). window >= 1; a window >= t_k is the plain
    causal mask. Built on `device`.

    Why: a sliding window bounds what each token attends to (and what a KV cache
    must keep) to `window` tokens, whatever the length of the text; stacked
    layers still reach further back. Off by one here, the model sees one key
    more or fewer than the one it was trained with.
    """
    # TODO
    raise NotImplementedError("sliding_window_mask: not implemented yet")


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's per-head slopes: float32 (num_heads,), as the paper's get_slopes makes them.

    For a power of two n, the slopes are the geometric sequence 2^(-8h/n) for
    h = 1 .. n (for 8 heads: 1/2, 1/4, ..., 1/256). For any other n, take the
    slopes of the largest power of two p <= n, then append the first n - p of
    every other slope of 2p (those at indices 0, 2, 4, ... of its sequence),
    which fall between the ones already taken.

    Why: each head gets its own rate at which attention fades with distance,
    from heads that look far back to heads that look only nearby. The
    non-power-of-two rule is the paper's; models trained with it (BLOOM, MPT)
    need exactly these numbers, and 2^(-8h/n) for n = 12 is not them.
    """
    # TODO
    raise NotImplementedError("alibi_slopes: not implemented yet")


def alibi_bias(slopes: torch.Tensor, t_q: int, t_k: int) -> torch.Tensor:
    """ALiBi's additive bias: float32 (H, t_q, t_k), entry [h, i, j] = -slopes[h] * (p - j).

    slopes: (H,) from alibi_slopes, on the device the bias is made on. Query i
    sits at position p = t_k - t_q + i (bottom-right, as in the causal mask), so
    the bias is 0 for the key at the query's own position and falls by
    slopes[h] per step back. Entries after the query (j > p) are masked away in
    attention and are not graded: any value will do.

    Why: ALiBi gives a model its sense of order without position embeddings, by
    penalising each score in proportion to how far back the key is. The
    penalty must be negative (nearer keys score higher) and be added to the
    scores before the softmax.
    """
    # TODO
    raise NotImplementedError("alibi_bias: not implemented yet")


def local_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None = None,
    slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention with an optional sliding window and optional ALiBi bias.

    Shapes: q (B, H, Tq, D), k and v (B, H, Tk, D), Tq <= Tk; returns
    (B, H, Tq, D) in q's dtype. Scores are q . k / sqrt(D), plus
    alibi_bias(slopes, Tq, Tk) when slopes (H,) is given, then masked with
    sliding_window_mask(Tq, Tk, window) (the plain causal mask, bottom-right,
    when window is None), then a softmax over the keys and the weighted sum of
    v. Every query sees at least itself, so no row is fully masked. Must not
    call F.scaled_dot_product_attention.

    Why: this is the attention of Mistral (a window of 4096) and of BLOOM and
    MPT (ALiBi). The bias goes into the scores before the softmax, never onto
    the weights after it; the mask's window counts the query itself.
    """
    # TODO
    raise NotImplementedError("local_attention: not implemented yet")
