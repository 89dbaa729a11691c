"""Exercise: causal and padding masks, and attention that applies them.

Build the masks a decoder needs (a causal mask that also works for the last
queries of a KV cache, a padding mask from sequence lengths, the two combined)
and the attention function of the tutorials that applies a mask, handles rows
with nothing to attend to, and applies dropout to the weights when training.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/masks.py

Hints come from the grader, not from this file. Masks are bool tensors in which
True means "may attend" (the F.scaled_dot_product_attention convention; the
opposite of nn.MultiheadAttention's). Every function returns its result on the
device of its inputs (causal_mask: on the `device` it is given), and attention
keeps the dtype of q, k and v.
"""

import math

import torch


def causal_mask(t_q: int, t_k: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A bool (t_q, t_k) mask, True = may attend: query i sees keys 0 .. t_k - t_q + i.

    The queries are the last t_q of the t_k positions (0 < t_q <= t_k), so the
    mask is aligned to the bottom-right: query i sits at absolute position
    t_k - t_q + i and may attend to every key at or before it. With
    t_q == t_k this is the usual lower triangle. Built on `device`.

    Why: a language model predicts token i + 1 from tokens 0 .. i, so token i
    must not see the future. During generation with a KV cache, the few new
    queries come after all the cached keys: a top-left aligned triangle would
    hide the cache's most recent keys from them.
    """
    # TODO
    raise NotImplementedError("causal_mask: not implemented yet")


def padding_mask(lengths: torch.Tensor, t: int) -> torch.Tensor:
    """A bool (B, t) mask, True for real tokens: row b is True at positions < lengths[b].

    lengths: a 1-D integer tensor (B,) of sequence lengths, each in [0, t].
    The result is on the device of lengths and always has t columns, even when
    every sequence is shorter than t.

    Why: sequences of different lengths are padded to the same length t to
    share a batch; attention must give the padding positions no weight.
    """
    # TODO
    raise NotImplementedError("padding_mask: not implemented yet")


def combine_masks(padding: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
    """Both rules at once: a bool (B, 1, Tq, Tk) mask, True where both masks allow.

    padding: (B, Tk) from padding_mask, True for real keys; causal: (Tq, Tk)
    from causal_mask. Entry [b, 0, i, j] is padding[b, j] and causal[i, j]. The
    axis of size 1 broadcasts over the heads of (B, H, Tq, Tk) scores.

    Why: a decoder over a padded batch must block both the future and the
    padding. The padding mask is per key, so it must line up with the key
    axis (the last one), not the query axis.
    """
    # TODO
    raise NotImplementedError("combine_masks: not implemented yet")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention that returns (output, weights).

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) -> output
    (..., Tq, Dv) and weights (..., Tq, Tk), any leading dims. Scores are
    q @ k^T / sqrt(D). mask: bool, broadcastable to (..., Tq, Tk), True = may
    attend, or None. A query row the mask blocks entirely gets zero weights and
    a zero output (no NaN), as F.scaled_dot_product_attention gives.

    Dropout: when training and dropout_p > 0 (0 <= dropout_p < 1), each weight
    is zeroed with probability dropout_p and the kept ones are divided by
    1 - dropout_p; the mask is drawn from `generator` (torch.rand or
    torch.bernoulli take one; F.dropout and nn.Dropout do not). Not training,
    dropout does nothing. The weights returned are the ones multiplied with v.

    Why: this is the attention of the tutorials (the Annotated Transformer's
    `attention`), with the masks of the steps above. Dropout on the weights
    regularizes which tokens a query relies on; scaling by 1 / (1 - p) keeps
    the expected output the same, so nothing changes at eval.

    Must not call F.scaled_dot_product_attention.
    """
    # TODO
    raise NotImplementedError("attention: not implemented yet")
