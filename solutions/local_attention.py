"""Reference solution: sliding-window attention and ALiBi.

A model answer to exercises/local_attention.py: the same functions with the same
contracts, each written as the shortest clear code, with the shape of every
broadcast and matmul in a comment. Compare with your own once the grader passes,
or when you are stuck on a step.
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
    p = torch.arange(t_k - t_q, t_k, device=device)[:, None]  # (t_q, 1): each query's position
    j = torch.arange(t_k, device=device)[None, :]  # (1, t_k): each key's position
    return (j <= p) & (j > p - window)  # (t_q, t_k)


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
    p = 2 ** int(math.floor(math.log2(num_heads)))  # the largest power of two <= num_heads
    slopes = [2 ** (-8 * h / p) for h in range(1, p + 1)]  # 2^(-8/p), 2^(-16/p), ..., 2^(-8)
    slopes += [2 ** (-8 * h / (2 * p)) for h in range(1, 2 * p + 1, 2)][: num_heads - p]  # every other slope of 2p
    return torch.tensor(slopes, dtype=torch.float32)  # (H,)


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
    slopes = slopes.to(torch.float32)
    p = torch.arange(t_k - t_q, t_k, device=slopes.device)[:, None]  # (t_q, 1)
    j = torch.arange(t_k, device=slopes.device)[None, :]  # (1, t_k)
    distance = (p - j).to(torch.float32)  # (t_q, t_k): how far back key j is
    return -slopes[:, None, None] * distance  # (H, 1, 1) * (t_q, t_k) -> (H, t_q, t_k)


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
    t_q, t_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, D) @ (B, H, D, Tk) -> (B, H, Tq, Tk)
    if slopes is not None:
        scores = scores + alibi_bias(slopes, t_q, t_k).to(scores.dtype)  # (H, Tq, Tk) broadcasts over B
    mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)  # (Tq, Tk)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, H, Tq, Tk) @ (B, H, Tk, D) -> (B, H, Tq, D)
