"""Scaled dot-product attention written out plainly, with knobs that turn it into its common wrong versions.

A spec computes a named mistake's wrong answer by calling `attend` with one knob turned: the scores
divided by the root of another width, the softmax over the query axis, the mask inverted, ignored or
applied after the softmax, a finite fill, a bias added at the wrong place. With no knob turned it is
the right answer: softmax(q @ kᵀ / √D + bias, masked) @ v, D = q.shape[-1], a bool mask (True = may
attend) broadcastable to the scores, and a row whose keys are all blocked gets zero weights (as
F.scaled_dot_product_attention gives it). What is particular to an exercise (projections, heads, how
its mask or bias is built) stays in its spec, which hands the pieces to these functions.

The steps run in this order, each knob at its place:
  scores    q @ kᵀ (transposed: k @ qᵀ); bias_at="unscaled_scores" adds the bias here
  scale     divided by √width (scale_at="weights": the weights, after the softmax, instead)
  bias      bias_at="scores" adds it here, after the scaling
  mask      mask_mode "fill": blocked scores become `fill`; "inverted": the allowed ones do; "ignored": none
  softmax   along softmax_dim; empty_rows="zero" turns the NaN of an all-blocked row into zeros
  after     mask_mode "zero_weights" / "fill_weights": blocked weights become 0 / `fill`;
            bias_at="weights" adds the bias to the weights
  output    weights @ v
"""

from __future__ import annotations

import math

import torch

NEG_INF = float("-inf")
MASK_MODES = ("fill", "inverted", "ignored", "zero_weights", "fill_weights")


def causal_mask(t_q: int, t_k: int, *, top_left: bool = False) -> torch.Tensor:
    """Bool (t_q, t_k), True where a query may see a key: query i sits at position t_k - t_q + i (the queries are the
    last t_q of the t_k positions), or at i when top_left, and sees the keys up to its own position."""
    offset = 0 if top_left else t_k - t_q
    return torch.arange(t_k)[None, :] <= torch.arange(offset, offset + t_q)[:, None]


def scores(q, k, mask=None, *, width: float | None = None, scale_at: str = "scores", transposed: bool = False,
           mask_mode: str = "fill", fill: float = NEG_INF, bias=None, bias_at: str = "scores") -> torch.Tensor:
    """The scaled, biased and masked scores the softmax is taken of (the knobs are attend's)."""
    if mask_mode not in MASK_MODES:
        raise ValueError(f"unknown mask_mode {mask_mode!r}")
    s = k @ q.transpose(-2, -1) if transposed else q @ k.transpose(-2, -1)
    if bias is not None and bias_at == "unscaled_scores":
        s = s + bias
    if scale_at == "scores":
        s = s / math.sqrt(q.shape[-1] if width is None else width)
    if bias is not None and bias_at == "scores":
        s = s + bias
    if mask is not None and mask_mode in ("fill", "inverted"):
        s = s.masked_fill(mask if mask_mode == "inverted" else ~mask, fill)
    return s


def weights(q, k, mask=None, *, width: float | None = None, scale_at: str = "scores", transposed: bool = False,
            mask_mode: str = "fill", fill: float = NEG_INF, bias=None, bias_at: str = "scores", softmax_dim: int = -1,
            empty_rows: str = "zero") -> torch.Tensor:
    """The attention weights (the knobs are attend's)."""
    s = scores(q, k, mask, width=width, scale_at=scale_at, transposed=transposed, mask_mode=mask_mode, fill=fill,
               bias=bias, bias_at=bias_at)
    w = torch.softmax(s, softmax_dim)
    if empty_rows == "zero":  # softmax of a row of -inf only is NaN
        w = w.nan_to_num(0.0)
    if scale_at == "weights":
        w = w / math.sqrt(q.shape[-1] if width is None else width)
    if mask is not None and mask_mode in ("zero_weights", "fill_weights"):
        w = w.masked_fill(~mask, 0.0 if mask_mode == "zero_weights" else fill)
    if bias is not None and bias_at == "weights":
        w = w + bias
    return w


def attend(q, k, v, mask=None, *, width: float | None = None, scale_at: str = "scores", transposed: bool = False,
           mask_mode: str = "fill", fill: float = NEG_INF, bias=None, bias_at: str = "scores", softmax_dim: int = -1,
           empty_rows: str = "zero") -> torch.Tensor:
    """softmax(q @ kᵀ / √width + bias, masked) @ v; every keyword argument left alone gives the right answer.

    q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) -> (..., Tq, Dv); mask and bias broadcastable to (..., Tq, Tk).
      width        the scores are divided by √width; None: D, the width of q and k; 1: unscaled
      scale_at     "scores"; "weights": divide the weights after the softmax instead
      transposed   the scores are k @ qᵀ
      mask_mode    "fill" (blocked scores become `fill`), "inverted" (the allowed ones do), "ignored",
                   "zero_weights" / "fill_weights" (the blocked weights become 0 / `fill`, after the softmax)
      fill         what blocked scores become: -inf, or a finite value such as -1e9
      bias_at      where the bias is added: "scores" (after the scaling), "unscaled_scores" (before it), "weights"
      softmax_dim  the axis the softmax normalises: -1, the keys; -2 is the query axis
      empty_rows   "zero": a row with every key blocked gets zero weights; "nan": it keeps the softmax's NaN
    """
    return weights(q, k, mask, width=width, scale_at=scale_at, transposed=transposed, mask_mode=mask_mode, fill=fill,
                   bias=bias, bias_at=bias_at, softmax_dim=softmax_dim, empty_rows=empty_rows) @ v
