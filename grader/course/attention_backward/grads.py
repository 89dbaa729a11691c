"""attention_backward's gradients written out here, plain and tiled, with knobs that make the named mistakes.

`plain` is the right answer of attention_backward and flash_attention_backward (its own code, not the
model answer's loop), `tiled` walks the tiles as the backward pass does, for the mistakes only a loop
makes. With no knob turned both give the gradients of softmax(q kᵀ / √D + mask) v.
"""

import math

import torch

INF = math.inf


def softmax_backward(probs, grad_probs, dim=-1, *, row_sum="p_dp", sign=-1, outer_p=True, normalise=False,
                     probs_on_first=False, diagonal_only=False, log_softmax=False, probs_twice=False):
    """probs ∘ (grad_probs − Σ_dim probs ∘ grad_probs); the knobs after * make the named wrong variants.

    row_sum: "p_dp" (right), "dp" (Σ grad_probs, without probs), "mean" (averaged, not summed), "all" (over every
    axis), "none" (nothing subtracted), "queries" (over the axis before `dim`'s, the query axis of attention).
    probs_on_first: probs multiplies grad_probs only, probs ∘ grad_probs − Σ probs ∘ grad_probs. diagonal_only: the
    Jacobian's diagonal alone, probs ∘ (1 − probs) ∘ grad_probs. log_softmax: the gradient through a log-softmax,
    grad_probs − probs ∘ Σ grad_probs. probs_twice: probs ∘ (probs ∘ grad_probs − Σ probs ∘ grad_probs).
    """
    if diagonal_only:
        return probs * (1 - probs) * grad_probs
    product = probs * grad_probs
    axis = dim if dim >= 0 else probs.dim() + dim
    if log_softmax:
        return grad_probs - probs * grad_probs.sum(axis, keepdim=True)
    sums = {
        "p_dp": lambda: product.sum(axis, keepdim=True),
        "dp": lambda: grad_probs.sum(axis, keepdim=True),
        "mean": lambda: product.mean(axis, keepdim=True),
        "all": lambda: product.sum(),
        "none": lambda: torch.zeros_like(product),
        "queries": lambda: product.sum(axis - 1 if axis > 0 else axis + 1, keepdim=True),
    }
    inner = sums[row_sum]()
    if normalise:  # divided by Σ probs: 1, but 0 / 0 on a row with no key
        inner = inner / probs.sum(axis, keepdim=True)
    if probs_on_first:
        return probs * grad_probs + sign * inner
    if probs_twice:
        return probs * (product + sign * inner)
    return (probs if outer_p else 1.0) * (grad_probs + sign * inner)


def probabilities(q, k, mask=None, *, lse=None, fill=-INF, use_mask=True, softmax_dim=-1, invert_mask=False,
                  mask_added=False, mask_after_softmax=False, shift="row"):
    """P = softmax(q kᵀ / √D, masked), or e^(S − lse) from a given lse. mask_added: the bool mask added to the
    scores (+1 where allowed), as an additive mask would be. mask_after_softmax: the softmax of every score, the
    blocked probabilities then zeroed (each row sums to less than 1). shift: what a hand-written softmax subtracts
    before exp, "row" (each row's own max, as torch.softmax does), "all" (the whole tensor's), "none", or
    "before_mask" (each row's max over every key, blocked ones too, taken before the mask)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if shift == "before_mask":
        scores = scores - scores.amax(softmax_dim, keepdim=True)
    if mask is not None and mask_after_softmax:
        return torch.softmax(scores, softmax_dim).masked_fill(~mask, 0.0)
    if mask is not None and mask_added:
        scores = scores + mask.to(scores.dtype)
    elif mask is not None and use_mask:
        scores = scores.masked_fill(mask if invert_mask else ~mask, fill)
    if lse is not None:  # a row with no key: lse -inf becomes +inf, so e^(S - lse) = 0
        return torch.exp(scores - lse.masked_fill(lse == -INF, INF)[..., None])
    if shift != "row":
        exps = torch.exp(scores - scores.amax() if shift == "all" else scores)  # "before_mask": shifted already
        return (exps / exps.sum(softmax_dim, keepdim=True)).nan_to_num(0.0)
    return torch.softmax(scores, softmax_dim).nan_to_num(0.0)


def plain(q, k, v, grad_out, mask=None, *, out=None, lse=None, fill=-INF, use_mask=True, softmax_dim=-1,
          delta_sign=-1, ds_scale="sqrt", dv_transposed=True, dk_transposed=True, row_sum="p_dp", scale_dv=False,
          dq_scale=None, dk_scale=None, invert_mask=False, operands_swapped="", mask_added=False,
          mask_after_softmax=False, shift="row"):
    """(dq, dk, dv), computed whole; with `out` and `lse`, P from lse and D = rowsum(dO ∘ O) (the flash way).

    The keyword arguments after * make the named wrong variants.
    """
    d = q.shape[-1]
    probs = probabilities(q, k, mask, lse=lse, fill=fill, use_mask=use_mask, softmax_dim=softmax_dim,
                          invert_mask=invert_mask, mask_added=mask_added, mask_after_softmax=mask_after_softmax,
                          shift=shift)
    grad_v = (probs.transpose(-2, -1) if dv_transposed else probs) @ grad_out
    if scale_dv:
        grad_v = grad_v / math.sqrt(d)
    grad_probs = grad_out @ v.transpose(-2, -1)
    if out is not None:
        delta = (grad_out * out).sum(-1, keepdim=True)
        grad_scores = probs * (grad_probs + delta_sign * delta)
    else:
        grad_scores = softmax_backward(probs, grad_probs, row_sum=row_sum, sign=delta_sign)
    # "v": 1/√Dv, the values' width; dq_scale, dk_scale: one side's own, wrong, factor
    factors = {"sqrt": d**-0.5, "none": 1.0, "d": 1.0 / d, "v": v.shape[-1] ** -0.5}
    # operands_swapped "q", "k" or "qk": dq = dS q, dk = dSᵀ k, or both (a copied line; runs only when Tq = Tk)
    grad_q = grad_scores * factors[dq_scale or ds_scale] @ (q if "q" in operands_swapped else k)
    grad_k = (grad_scores.transpose(-2, -1) if dk_transposed else grad_scores) * factors[dk_scale or ds_scale] \
        @ (k if "k" in operands_swapped else q)
    return grad_q, grad_k, grad_v


def causal_mask(t_q, t_k, top_left=False):
    """Bool (t_q, t_k), True where query i (at position t_k − t_q + i, or i when top_left) may see key j."""
    offset = 0 if top_left else t_k - t_q
    return torch.arange(t_k)[None, :] <= torch.arange(offset, offset + t_q)[:, None]


def tiled(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32, *, top_left=False, use_mask=True,
          delta="rows", delta_sign=-1, ds_scale="sqrt", last_block=True, accumulate=True, dv_transposed=True,
          causal_shift=0, dq_scale=None, dk_scale=None, accumulate_q=True, last_q_block=True,
          skip_from_first_row=False, scores_scale="sqrt", mask_after_exp=False, stop_short=False):
    """flash_attention_backward tile by tile, queries outside, keys inside (another order than the model answer's);
    the keyword arguments after * make the named wrong variants. delta: "rows" (rowsum(dO ∘ O)), "tile" (the tile's
    own Σ P ∘ dP), "tile_queries" (the tile's Σ P ∘ dP over its queries). skip_from_first_row: causal, the key
    tiles past the block's first query's position skipped, though its later queries see some of them; stop_short:
    causal, a key tile starting at the block's last query's own key skipped too (>= where > belongs).
    scores_scale: what the recomputed tile's scores are scaled by before e^(S − lse), as ds_scale. mask_after_exp:
    the causal mask multiplies e^(S − lse) instead of filling S with -inf, so a large hidden score gives inf · 0."""
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    factors = {"sqrt": d**-0.5, "none": 1.0, "d": 1.0 / d, "v": v.shape[-1] ** -0.5}
    q_factor, k_factor = (factors[x or ds_scale] for x in (dq_scale, dk_scale))  # dS's 1/√D, for dq and for dk
    offset = 0 if top_left else t_k - t_q
    full = (grad_out * out).sum(-1)
    lse = lse.masked_fill(lse == -INF, INF)
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    stop = t_k if last_block else t_k - t_k % block_k
    for i in range(0, t_q if last_q_block else t_q - t_q % block_q, block_q):
        qb, dob, lb = q[..., i:i + block_q, :], grad_out[..., i:i + block_q, :], lse[..., i:i + block_q]
        for j in range(0, stop, block_k):
            if causal and skip_from_first_row and j > offset + i:
                break
            if causal and stop_short and j >= offset + i + qb.shape[-2] - 1:
                break
            kb, vb = k[..., j:j + block_k, :], v[..., j:j + block_k, :]
            scores = qb @ kb.transpose(-2, -1) * factors[scores_scale]
            hidden = None
            if causal and use_mask:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2])[:, None] + causal_shift
                hidden = torch.arange(j, j + kb.shape[-2])[None, :] > rows
                scores = scores if mask_after_exp else scores.masked_fill(hidden, -INF)
            probs = torch.exp(scores - lb[..., None])
            if mask_after_exp and hidden is not None:
                probs = probs * ~hidden
            grad_probs = dob @ vb.transpose(-2, -1)
            if delta == "rows":
                dd = full[..., i:i + block_q, None]
            else:  # the tile's own Σ P ∘ dP, along its keys ("tile") or its queries ("tile_queries")
                dd = (probs * grad_probs).sum(-1 if delta == "tile" else -2, keepdim=True)
            grad_scores = probs * (grad_probs + delta_sign * dd)
            part_v = (probs.transpose(-2, -1) if dv_transposed else probs) @ dob
            part_k = grad_scores.transpose(-2, -1) * k_factor @ qb
            part_q = grad_scores * q_factor @ kb
            if accumulate_q:
                grad_q[..., i:i + block_q, :] += part_q
            else:  # each key block overwrites what the ones before gave: the last one's part is left
                grad_q[..., i:i + block_q, :] = part_q
            if accumulate:
                grad_k[..., j:j + block_k, :] += part_k
                grad_v[..., j:j + block_k, :] += part_v
            else:  # each query block overwrites what the ones before gave
                grad_k[..., j:j + block_k, :] = part_k
                grad_v[..., j:j + block_k, :] = part_v
    return grad_q, grad_k, grad_v


def tiled_forward(q, k, v, causal=False, block_k=32, *, rescale_acc=True, causal_shift=0, rescale_sum=True,
                  scale="d", top_left=False, last_block=True, normalise=True, lse_base_two=False, local_keys=False,
                  running_max=True, block_q=32, last_query_block=True, skip_from_first_row=False, padded_keys=False,
                  max_kept=True, step_block_q=False, stop_short=False, unseen_blocks_skipped=False):
    """(out, lse) by the online softmax over key blocks, in float64; the keyword arguments after * make the named
    wrong variants (causal_shift=-1: the diagonal key masked too; scale: "d" (1/√D, right), "v" (1/√Dv), "none",
    "twice" (1/D); last_block=False: the last, shorter key block dropped; normalise=False: acc not divided by l;
    lse_base_two: lse in bits, an exp2 loop's; local_keys: the causal mask compares the tile's own key indices,
    0 to block_k - 1; running_max=False: the max is the tile's own, not the larger of it and the running one;
    last_query_block=False: the queries past the last whole block of block_q never computed, out 0 and lse -inf;
    skip_from_first_row: causal, a query block stops at the first key block past its first row's last key;
    padded_keys: k and v padded with zeros to whole blocks, the padding masked only by the causal mask; max_kept=False:
    the running max never stored, so it stays -inf and each key block starts the sums afresh; step_block_q: the key
    loop steps by block_q while each tile takes block_k keys, so keys are skipped or counted twice; stop_short: causal,
    a query block's key loop ends one key early, at Tk - Tq + its end - 1, so a key block that starts at its last
    query's own key is skipped; unseen_blocks_skipped: causal, a query block whose first row sees no key is skipped
    whole, its later rows left out 0, lse -inf).
    A row with no key: out 0, lse -inf."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    if padded_keys:
        pad = [0, 0, 0, -t_k % block_k]
        k64, v64 = torch.nn.functional.pad(k64, pad), torch.nn.functional.pad(v64, pad)
    rows = torch.arange(0 if top_left else t_k - t_q, t_q if top_left else t_k)[:, None] + causal_shift
    factor = {"d": d**-0.5, "v": v.shape[-1] ** -0.5, "none": 1.0, "twice": 1.0 / d}[scale]
    m = torch.full(q.shape[:-1], -INF, dtype=torch.float64)
    total = torch.zeros_like(m)
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for j in range(0, k64.shape[-2] if last_block else t_k - t_k % block_k, block_q if step_block_q else block_k):
        scores = q64 @ k64[..., j:j + block_k, :].transpose(-2, -1) * factor
        if causal:
            first = 0 if local_keys else j
            scores = scores.masked_fill(torch.arange(first, first + scores.shape[-1])[None, :] > rows, -INF)
            if skip_from_first_row:  # the whole key block, for every row of a query block whose first row it passes
                block_first = (torch.arange(t_q) // block_q * block_q + t_k - t_q)[:, None]
                scores = scores.masked_fill(j > block_first, -INF)
            if stop_short:  # the whole key block, for a query block whose last query's own key starts it, or before
                ends = torch.clamp(torch.arange(t_q) // block_q * block_q + block_q, max=t_q) + t_k - t_q
                scores = scores.masked_fill(j >= ends[:, None] - 1, -INF)
        m_new = torch.maximum(m, scores.amax(-1)) if running_max else scores.amax(-1)
        shift = torch.where(m_new == -INF, 0.0, m_new)
        alpha, p = torch.exp(m - shift), torch.exp(scores - shift[..., None])
        total = (alpha if rescale_sum else 1.0) * total + p.sum(-1)
        acc = (alpha[..., None] if rescale_acc else 1.0) * acc + p @ v64[..., j:j + block_k, :]
        m = m_new if max_kept else m
    out = acc / torch.where(total > 0, total, 1.0)[..., None] if normalise else acc
    lse = m + torch.log(total)
    if causal and unseen_blocks_skipped:
        skipped = torch.arange(t_q) // block_q * block_q + t_k - t_q < 0  # the block's first row sees no key
        out, lse = out.masked_fill(skipped[:, None], 0.0), lse.masked_fill(skipped, -INF)
    if not last_query_block:
        dropped = torch.arange(t_q) >= t_q - t_q % block_q
        out, lse = out.masked_fill(dropped[:, None], 0.0), lse.masked_fill(dropped, -INF)
    return out.to(q.dtype), (lse * math.log2(math.e) if lse_base_two else lse).to(q.dtype)
