"""The right and wrong answers of triton_attention's steps, written out in torch in the grader's process.

The references are plain torch in the inputs' own dtype (the plain same-dtype implementation the
engine's low-precision rule measures by). The wrong answers are what a kernel with one named
mistake computes, tile by tile where the mistake depends on the tiles (the block sizes are the
launcher's arguments, so the grader knows them).
"""

import math

import torch

from grader.engine import attention

INF = math.inf


def _work(dtype):
    return torch.promote_types(dtype, torch.float32)


# -- softmax ----------------------------------------------------------------------------


def softmax_reference(x):
    return torch.softmax(x, -1)


def next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def softmax_padded(x, pad: float):
    """A kernel whose lanes past the row's end were loaded as `pad` (other=0 gives 0): their e^(pad - max) joins
    the sum, and the max, then the first n_cols lanes are stored."""
    cols = x.shape[-1]
    padded = torch.nn.functional.pad(x.to(_work(x.dtype)), (0, next_power_of_two(cols) - cols), value=pad)
    return torch.softmax(padded, -1)[..., :cols].to(x.dtype)


def softmax_padding_in_max(x):
    """Padded lanes loaded as 0 and counted in the max only (the sum is masked): the max is at least 0, so a row far
    below 0 has e^(x - 0) = 0 everywhere, and 0 / 0."""
    work = x.to(_work(x.dtype))
    if next_power_of_two(x.shape[-1]) == x.shape[-1]:
        return softmax_reference(x)
    e = torch.exp(work - work.amax(-1, keepdim=True).clamp_min(0.0))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def masked_row_not_nan(value, x):
    """Does the answer give a row of -inf only something other than NaN (0, or uniform), and every other row right?"""
    if not isinstance(value, torch.Tensor) or value.shape != x.shape:
        return False
    empty = torch.isneginf(x).all(-1)
    if not bool(empty.any()) or bool(torch.isnan(value[empty]).all()):
        return False
    want = softmax_reference(x.to(_work(x.dtype)))[~empty]
    return bool(torch.allclose(value[~empty].to(want.dtype), want, rtol=1e-2, atol=1e-3))


def block_narrower_than_row(value, x):
    """Does the answer hold, in every row's first BLOCK columns, the softmax of those columns alone, for a power of two
    BLOCK below n_cols (a block sized from another count, the columns past it never written)?"""
    if not isinstance(value, torch.Tensor) or value.shape != x.shape:
        return False
    block = 1
    while block < x.shape[-1]:
        want = torch.softmax(x[:, :block].to(_work(x.dtype)), -1)
        got = value[:, :block].to(want.dtype)
        if block > 1 and bool(torch.isfinite(got).all()) and bool(torch.allclose(got, want, rtol=1e-3, atol=1e-5)):
            return True
        block *= 2
    return False


def softmax_logged(x):
    return torch.log_softmax(x.to(_work(x.dtype)), -1).to(x.dtype)


def softmax_no_max(x):
    e = torch.exp(x.to(_work(x.dtype)))
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def softmax_output_strides(x):
    """A launcher that passes x's strides for y: the right softmax, stored at the places x's layout (its last two
    axes transposed in memory, as the worker hands it over) gives them in the contiguous y."""
    return softmax_reference(x).t().contiguous().view(x.shape)


def softmax_transposed_memory(x):
    """A kernel that takes the non-contiguous x the worker hands over (its last two axes transposed in memory) as
    contiguous: it reads x.T's memory in x's shape."""
    return softmax_reference(x.t().contiguous().view(x.shape))


def softmax_column_stride_ignored(x):
    """A kernel that steps through a row by 1, not by stride_xc, on the non-contiguous x the worker hands over (its
    last two axes transposed in memory): element (r, c) read from that memory at r · stride_xr + c."""
    rows, cols = x.shape
    memory = x.t().contiguous().reshape(-1)  # stride_xr = 1, stride_xc = rows
    read = memory[(torch.arange(rows)[:, None] + torch.arange(cols)[None, :]).clamp_max(memory.numel() - 1)]
    return softmax_reference(read)


def unmasked_rows(value, x):
    """Does the answer show a load with no mask: each row but the last the softmax of BLOCK contiguous elements
    from the row's start, the next row's first ones among them (the last row's read garbage past the end)?"""
    if not isinstance(value, torch.Tensor) or value.shape != x.shape or x.shape[0] < 2:
        return False
    rows, cols = x.shape
    block = next_power_of_two(cols)
    if block == cols:
        return False
    flat = torch.cat([x.reshape(-1).to(_work(x.dtype)), torch.zeros(block)])
    wanted = torch.stack([torch.softmax(flat[r * cols:r * cols + block], -1)[:cols] for r in range(rows - 1)])
    got = value[:-1].to(wanted.dtype)
    return bool(torch.isfinite(got).all()) and bool(torch.allclose(got, wanted, rtol=1e-3, atol=1e-5))


def all_nan(value, *args, **kwargs):
    """Is every entry of the answer (its first part) NaN: a rescale factor e^(m_new - m) is inf from the first
    block, where m is -inf, and inf · 0 is NaN in every row?"""
    first = value[0] if isinstance(value, (tuple, list)) and value else value
    return isinstance(first, torch.Tensor) and first.is_floating_point() and first.numel() > 0 and bool(
        torch.isnan(first).all())


def has_nan(value, *args, **kwargs):
    parts = value if isinstance(value, (tuple, list)) else (value,)
    return any(isinstance(p, torch.Tensor) and p.is_floating_point() and bool(torch.isnan(p).any()) for p in parts)


# -- flash_attention --------------------------------------------------------------------


def flash_reference(q, k, v, causal=False, block_m=16, block_n=16):
    """Plain attention in q's dtype, with its lse in float32 at least; a row with no key gives 0 and -inf."""
    mask = attention.causal_mask(q.shape[-2], k.shape[-2]) if causal else None
    lse = torch.logsumexp(attention.scores(q, k, mask).to(_work(q.dtype)), -1)
    return attention.attend(q, k, v, mask), lse


def top_left(q, k, v, causal=False, block_m=16, block_n=16):
    """Causal with query i at position i (the offset Tk - Tq forgotten)."""
    t_q, t_k = q.shape[-2], k.shape[-2]
    if not causal or t_q == t_k:
        return flash_reference(q, k, v, causal)
    mask = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None]
    scores = (q.to(_work(q.dtype)) @ k.to(_work(q.dtype)).transpose(-2, -1) / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~mask, -INF)
    lse = torch.logsumexp(scores, -1)
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ v.to(scores.dtype)
    return out.to(q.dtype), lse


def keys_past_end(q, k, v, causal=False, block_m=16, block_n=16):
    """Keys past Tk loaded as 0 (other=0) and not masked: each is a score of 0 with a value of 0."""
    t_k = k.shape[-2]
    extra = -(-t_k // block_n) * block_n - t_k
    if causal or not extra:
        return flash_reference(q, k, v, causal)
    pad = lambda x: torch.nn.functional.pad(x, (0, 0, 0, extra))  # noqa: E731
    return flash_reference(q, pad(k), pad(v))


def tiled(q, k, v, causal=False, block_m=16, block_n=16, *, rescale=True, lse_last_block=False, acc_dtype=None,
          guard=True, rescale_acc=True, rescale_l=True, padded_scale=False, lse_form="natural", diagonal=True,
          end_short=False):
    """The forward kernel's loop, one query block at a time; the keyword arguments after * make the named wrong
    variants. The key loop ends where the reference kernel's does (causal: past the block's last query). lse_form:
    "natural" (m + log l), "no_max" (log l, relative to the running max), "base_two" (log2 of the sum, as an exp2
    kernel has it before converting back), "max_in_bits" (that kernel's max in base 2 with the natural log of l) or
    "unscaled_max" (the max of the raw scores with log l). diagonal=False:
    causal masks each query's own key too (< for <=). end_short: the causal key loop ends at the block's last query's
    position, exclusive, one key short."""
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale_width = max(16, next_power_of_two(d)) if padded_scale else d  # the kernel's BLOCK_D, or d
    work = _work(q.dtype)
    acc_dtype = acc_dtype or work
    outs, lses = [], []
    offset = t_k - t_q
    for i in range(0, t_q, block_m):
        qb = q[..., i:i + block_m, :].to(work)
        bq = qb.shape[-2]
        m = torch.full(qb.shape[:-1], -INF, dtype=work)
        l = torch.zeros(qb.shape[:-1], dtype=work)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=acc_dtype)
        last = (m, l)
        end = min(t_k, offset + i + block_m - (1 if end_short else 0)) if causal else t_k
        for j in range(0, max(end, 0), block_n):
            kb, vb = k[..., j:j + block_n, :].to(work), v[..., j:j + block_n, :]
            s = qb @ kb.transpose(-2, -1) / math.sqrt(scale_width)
            if causal:
                rows = torch.arange(offset + i, offset + i + bq)[:, None]
                s = s.masked_fill(torch.arange(j, j + kb.shape[-2])[None, :] > rows - (0 if diagonal else 1), -INF)
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(m_new == -INF, 0.0, m_new) if guard else m_new
            alpha = torch.exp(m - shift) if rescale else torch.ones_like(m)
            p = torch.exp(s - shift[..., None])
            l = (alpha if rescale_l else 1.0) * l + p.sum(-1)
            acc_alpha = alpha if rescale_acc else torch.ones_like(alpha)
            acc = (acc_alpha[..., None].to(acc_dtype) * acc + (p.to(vb.dtype) @ vb).to(acc_dtype)).to(acc_dtype)
            m = m_new
            block_max = s.amax(-1)
            last = (block_max, torch.exp(s - torch.where(block_max == -INF, 0.0, block_max)[..., None]).sum(-1))
        out = acc.to(work) / (torch.where(l > 0, l, 1.0) if guard else l)[..., None]
        outs.append(out)
        lse = last[0] + torch.log(last[1]) if lse_last_block else m + torch.log(l)
        forms = {"natural": lse, "no_max": torch.log(l), "base_two": lse * math.log2(math.e),
                 "max_in_bits": m * math.log2(math.e) + torch.log(l),  # an exp2 kernel's max, a natural log's sum
                 "unscaled_max": m * math.sqrt(scale_width) + torch.log(l)}  # the scale inside exp, m of raw scores
        lses.append(forms[lse_form])
    return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)


def flash_variant(**wrong):
    return lambda q, k, v, causal=False, block_m=16, block_n=16: tiled(q, k, v, causal, block_m, block_n, **wrong)


def strides_swapped(q, k, v, causal=False, block_m=16, block_n=16):
    """Each of q, k and v read with its token and width strides swapped (stride(3) for the token, stride(2) for
    the width), on contiguous inputs: a view of the same memory, while it stays inside it."""
    def swapped(x):
        b, h, t, d = x.shape
        flat = x.contiguous().reshape(-1)
        return flat.as_strided((b, h, t, d), (h * t * d, t * d, 1, d))
    return flash_reference(swapped(q), swapped(k), swapped(v), causal)


def program_ids_swapped(value, q, k, v, causal=False, block_m=16, block_n=16):
    """Does the answer show a kernel reading its program ids the other way from the launcher's grid: right for the
    batch·heads a program of the swapped grid reached (fewer than all), wrong for the others?"""
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not isinstance(value[0], torch.Tensor):
        return False
    b, h, t_q, _ = q.shape
    blocks = -(-t_q // block_m)
    reached = min(blocks, b * h)  # axis 1 of the grid, read as the batch·head, runs to the number of query blocks
    if reached >= b * h or value[0].shape != q.shape:
        return False
    want = flash_reference(*(x.to(torch.float64) for x in (q, k, v)), causal)[0].reshape(b * h, t_q, -1)
    got = value[0].reshape(b * h, t_q, -1).to(torch.float64)
    rows = min(t_q, b * h * block_m)  # axis 0, read as the query block, runs to the number of batch·heads
    right = torch.allclose(got[:reached, :rows], want[:reached, :rows], rtol=1e-2, atol=1e-2)
    return right and not torch.allclose(got[reached:].nan_to_num(1e9), want[reached:], rtol=1e-2, atol=1e-2)


def grid_rounded_down(value, q, k, v, causal=False, block_m=16, block_n=16):
    """Does the answer show a grid of t_q // block_m query blocks: its full blocks right, the last partial one never
    written (whatever torch.empty held), so wrong in every row whose reference is not 0? (A wrong online softmax
    is right in the rows that see a single key block, and those may be in the last block.)"""
    return _unwritten_after(q.shape[-2] // block_m * block_m, value, q, k, v, causal)


def grid_from_keys(value, q, k, v, causal=False, block_m=16, block_n=16):
    """Does the answer show a grid of cdiv(t_k, block_m) query blocks, counted from the keys: where Tq is longer, the
    rows past them never written?"""
    return _unwritten_after(-(-k.shape[-2] // block_m) * block_m, value, q, k, v, causal)


def _unwritten_after(rows: int, value, q, k, v, causal) -> bool:
    """The answer right in its first `rows` query rows and wrong in every later row whose reference is not 0."""
    if not 0 < rows < q.shape[-2] or not isinstance(value, (tuple, list)) or not isinstance(value[0], torch.Tensor):
        return False
    if value[0].shape != q.shape:
        return False
    want = flash_reference(*(x.to(torch.float64) for x in (q, k, v)), causal)[0]
    got = value[0].to(torch.float64)
    if not torch.allclose(got[..., :rows, :], want[..., :rows, :], rtol=1e-2, atol=1e-2):
        return False
    tail, wanted = got[..., rows:, :].nan_to_num(1e9), want[..., rows:, :]
    close = torch.isclose(tail, wanted, rtol=1e-2, atol=1e-2).all(-1)  # (..., rows): each unwritten row right?
    nonzero = (wanted != 0).any(-1)
    return bool(nonzero.any()) and not bool((close & nonzero).any())


# -- decode_attention -------------------------------------------------------------------


def decode_reference(q, k_cache, v_cache, lengths, block_n=16):
    """One query per batch·head over the first lengths[b] keys of its cache: plain attention in q's dtype."""
    outs = []
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            outs.append(torch.zeros_like(q[b]))
            continue
        outs.append(attention.attend(q[b][:, None], k_cache[b, :, :n], v_cache[b, :, :n], None)[:, 0])
    return torch.stack(outs)


def cache_with_query_strides(q, k_cache, v_cache, lengths, block_n=16):
    """The kernel that found its sequence's keys and values with q's batch and head strides: program (b, h) reads
    the cache from b·q.stride(0) + h·q.stride(1), on contiguous memory as the plain checks hand it over."""
    def misread(cache):
        flat = cache.contiguous()
        return flat.as_strided(cache.shape, (q.stride(0), q.stride(1), flat.stride(2), flat.stride(3)))
    return decode_reference(q, misread(k_cache), misread(v_cache), lengths)


def cache_read_as_contiguous(q, k_cache, v_cache, lengths, block_n=16):
    """The kernel that took the cache's strides from its shape, as a contiguous cache's: over a cache of the strided
    checks' layouts (its last two axes transposed, or its heads and positions) it reads the memory in another
    order. One form for each pair of k_cache's and v_cache's layouts."""
    def misread(cache, axes):
        return cache.transpose(*axes).contiguous().view(cache.shape)
    layouts = ((2, 3), (1, 2))
    return [_unguarded_decode(q, misread(k_cache, k_axes), misread(v_cache, v_axes), lengths)
            for k_axes in layouts for v_axes in layouts]


def cache_with_other_strides(q, k_cache, v_cache, lengths, block_n=16):
    """k_cache read with v_cache's strides, or v_cache with k_cache's, over the layouts check's caches (k_cache laid
    out with its heads and positions transposed, v_cache with its last two axes)."""
    def memory(x, axes):  # x's values in that layout's memory, read back as a tensor of x's shape
        return x.transpose(*axes).contiguous().transpose(*axes)
    k_laid, v_laid = memory(k_cache, (1, 2)), memory(v_cache, (2, 3))
    found = []
    # every stride the other cache's (a whole offset line copied), or only those of its positions and dims, or of
    # its batch and heads (one line of two copied)
    for axes in ((0, 1, 2, 3), (2, 3), (0, 1), (2,), (3,)):
        for laid, other, as_k in ((k_laid, v_laid, True), (v_laid, k_laid, False)):
            stride = tuple(other.stride()[i] if i in axes else laid.stride()[i] for i in range(4))
            # past the cache's memory a kernel reads whatever lies there: NaN here, as the cache's unused slots hold
            end = 1 + sum((n - 1) * st for n, st in zip(laid.shape, stride, strict=True))
            padded = torch.full((max(end, laid.untyped_storage().nbytes() // laid.element_size()),), float("nan"),
                                 dtype=laid.dtype)
            padded[:laid.numel()] = laid.as_strided((laid.numel(),), (1,))
            misread = padded.as_strided(laid.shape, stride)
            out = (_unguarded_decode(q, misread, v_cache, lengths) if as_k
                   else _unguarded_decode(q, k_cache, misread, lengths))
            if not bool(torch.isnan(out).all()):  # all NaN tells this mistake from no other
                found.append(out)
    return found


def _unguarded_decode(q, k_cache, v_cache, lengths):
    """decode_reference without its guard against NaN: a NaN read where a sequence's keys are misread shows."""
    outs = []
    for b, n in enumerate(lengths.tolist()):
        k, v = k_cache[b, :, :n].to(_work(q.dtype)), v_cache[b, :, :n].to(_work(q.dtype))
        weights = torch.softmax((k @ q[b].to(k.dtype)[..., None])[..., 0] / math.sqrt(q.shape[-1]), -1)
        outs.append((weights[:, None] @ v)[:, 0].to(q.dtype) if n else torch.zeros_like(q[b]))
    return torch.stack(outs)


def batch_offset_one_stride(q, k, v, causal=False, block_m=16, block_n=16):
    """The kernel that offset program bh by bh · stride_h, batch and head as one axis: right for contiguous inputs,
    wrong over the layouts check's q and v (laid out as (B, T, H, D), transposed), whose batch stride is not H times
    their head stride."""
    def misread(x):
        b, h, t, d = x.shape
        return x.transpose(1, 2).contiguous().reshape(-1).as_strided((b, h, t, d), (h * d, d, h * d, 1))
    return flash_reference(misread(q), k, misread(v), causal)


# The layouts the checks hand tensors over in (grader/candidate.py's Strided): as made, the last two axes
# transposed in memory, the heads and positions transposed
LAYOUTS = (None, (2, 3), (1, 2))


def _lanes(x, axes, width: int):
    """x (…, D) read BLOCK_D = `width` lanes wide with no mask on the width, from its memory in the layout `axes`:
    lane d ≥ D is whatever lies d · stride_d past the row's start (0 past the tensor's end)."""
    laid = x.transpose(*axes).contiguous().transpose(*axes) if axes else x.contiguous()
    memory = torch.cat([laid.transpose(*axes).reshape(-1) if axes else laid.reshape(-1),
                        torch.zeros(width * max(laid.stride()) + 1, dtype=x.dtype)])  # past the end: 0 here
    return memory.as_strided((*x.shape[:-1], width), laid.stride())


def flash_lanes_unmasked(value, q, k, v, causal=False, block_m=16, block_n=16) -> bool:
    """Does the answer show q, k and v loaded without the head-width mask (d < D), in one of the checks' layouts:
    the lanes past D hold the memory after each row and join every score, out keeps its first D lanes? Compared
    where every lane read lies inside the tensors (past their end is whatever memory follows), and wrong there."""
    if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(isinstance(t, torch.Tensor) for t in value):
        return False
    width, d = max(16, next_power_of_two(q.shape[-1])), q.shape[-1]
    if width == d or value[0].shape != q.shape[:-1] + v.shape[-1:] or value[1].shape != q.shape[:-1]:
        return False
    right = flash_reference(q, k, v, causal)
    for q_axes, k_axes, v_axes in ((None, None, None), ((2, 3),) * 3, ((1, 2), None, (1, 2))):
        qe, ke, ve = (_lanes(x.to(torch.float64), a, width) for x, a in ((q, q_axes), (k, k_axes), (v, v_axes)))
        inside = [(_lanes(torch.ones_like(x, dtype=torch.float64), a, width) != 0).all(-1)  # no lane past the end
                  for x, a in ((q, q_axes), (k, k_axes), (v, v_axes))]
        known = inside[0] & (inside[1] & inside[2]).all(-1, keepdim=True)  # (B, H, Tq): a row read inside
        scores = qe @ ke.transpose(-2, -1) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(~attention.causal_mask(q.shape[-2], k.shape[-2]), -INF)
        lse = torch.logsumexp(scores, -1)
        out = (torch.softmax(scores, -1).nan_to_num(0.0) @ ve)[..., :d]
        got_out, got_lse = value[0].to(torch.float64)[known], value[1].to(torch.float64)[known]
        if (known.any() and torch.allclose(got_out, out[known], rtol=1e-2, atol=1e-2)
                and torch.allclose(got_lse, lse[known], rtol=1e-2, atol=1e-2)
                and not torch.allclose(got_out, right[0].to(torch.float64)[known], rtol=1e-2, atol=1e-2)):
            return True
    return False


def decode_keys_lanes_unmasked(q, k_cache, v_cache, lengths, block_n=16):
    """k_cache loaded without the head-width mask (d < D), q with it: a lane past D adds q's 0 times the memory after
    the key's row, which is 0 unless that memory is NaN (a slot past a sequence's length). One form per layout."""
    width, d = max(16, next_power_of_two(q.shape[-1])), q.shape[-1]
    qe = torch.nn.functional.pad(q.to(_work(q.dtype)), (0, width - d))
    forms = []
    for axes in LAYOUTS:
        ke = _lanes(k_cache.to(_work(q.dtype)), axes, width)
        outs = []
        for b, n in enumerate(lengths.tolist()):
            weights = torch.softmax((ke[b, :, :n] @ qe[b][..., None])[..., 0] / math.sqrt(d), -1)
            outs.append((weights[:, None] @ v_cache[b, :, :n].to(qe.dtype))[:, 0] if n else torch.zeros_like(q[b]))
        forms.append(torch.stack(outs).to(q.dtype))
    return forms


def first_length(q, k_cache, v_cache, lengths, block_n=16):
    """Every sequence read to lengths[0]."""
    return decode_reference(q, k_cache, v_cache, torch.full_like(lengths, int(lengths[0])))


def decode_keys_unmasked(q, k_cache, v_cache, lengths, block_n=16):
    """The scores of the last block's slots past lengths[b] not set to -inf: loaded as 0 (other=0), each is a key of
    score 0 with a value of 0 up to the block's end."""
    outs = []
    for b, n in enumerate(lengths.tolist()):
        padded = -(-n // block_n) * block_n
        k = torch.nn.functional.pad(k_cache[b, :, :n], (0, 0, 0, padded - n))
        v = torch.nn.functional.pad(v_cache[b, :, :n], (0, 0, 0, padded - n))
        outs.append(attention.attend(q[b][:, None], k, v, None)[:, 0] if n else torch.zeros_like(q[b]))
    return torch.stack(outs)


def decode_tiled(q, k_cache, v_cache, lengths, block_n=16, *, rescale_l=True, rescale_acc=True, padded_scale=False,
                 scaled=True, block_max=False, m_start=-INF):
    """The decode kernel's loop over key blocks, per sequence; the keyword arguments after * make the named wrong
    variants (block_max: each block's own max taken for the running one, so alpha overflows once the max falls far).
    A sequence of length 0 gives 0."""
    work = _work(q.dtype)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(max(16, next_power_of_two(d)) if padded_scale else d) if scaled else 1.0
    outs = []
    for b, n in enumerate(lengths.tolist()):
        qb = q[b].to(work)  # (H, D)
        m = torch.full(qb.shape[:-1], m_start, dtype=work)
        l = torch.zeros_like(m)
        acc = torch.zeros_like(qb)
        for j in range(0, n, block_n):
            kb, vb = (x[b, :, j:min(n, j + block_n)].to(work) for x in (k_cache, v_cache))
            s = (kb @ qb[..., None])[..., 0] * scale  # (H, n_block)
            m_new = s.amax(-1) if block_max else torch.maximum(m, s.amax(-1))  # block_max: the block's own max
            alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
            l = (alpha if rescale_l else 1.0) * l + p.sum(-1)
            acc = (alpha[..., None] if rescale_acc else 1.0) * acc + (p[:, None, :] @ vb)[:, 0]
            m = m_new
        outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
    return torch.stack(outs).to(q.dtype)


def decode_variant(**wrong):
    return lambda q, k_cache, v_cache, lengths, block_n=16: decode_tiled(q, k_cache, v_cache, lengths, block_n,
                                                                         **wrong)


def head_dims_cut(value, q, k_cache, v_cache, lengths, block_n=16):
    """Is the answer, in its first 2^k < D dims, attention over those dims only (scaled by √D): a BLOCK_D rounded
    down to a power of two, the dims past it never loaded nor stored?"""
    d = q.shape[-1]
    kept = 1 << (d.bit_length() - 1)
    if kept >= d or not isinstance(value, torch.Tensor) or value.shape != q.shape or not value.is_floating_point():
        return False
    outs = []
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            outs.append(torch.zeros(q.shape[1], kept, dtype=torch.float64))
            continue
        k, v = (x[b, :, :n, :kept].to("cpu", torch.float64) for x in (k_cache, v_cache))
        scores = q[b, :, None, :kept].to("cpu", torch.float64) @ k.transpose(-2, -1) / math.sqrt(d)
        outs.append((torch.softmax(scores, -1) @ v)[:, 0])
    got = value[..., :kept].to("cpu", torch.float64)
    return bool(torch.allclose(got, torch.stack(outs), rtol=1e-2, atol=1e-3))


def empty_sequence_nan(value, q, k_cache, v_cache, lengths, block_n=16):
    """Is the answer NaN in the sequences of length 0, and only there: acc / l with l = 0, unguarded?"""
    if not isinstance(value, torch.Tensor) or value.shape != q.shape or not value.is_floating_point():
        return False
    empty = lengths.to("cpu") == 0
    nan = torch.isnan(value).flatten(1).any(-1).to("cpu")
    return bool(empty.any()) and bool(nan[empty].all()) and not bool(nan[~empty].any())


def decode_ids_swapped(value, q, k_cache, v_cache, lengths, block_n=16):
    """Does the answer show a decode kernel that split its program id the other way, b = pid % H and h = pid // H
    (right only when B = H)? Modelled on contiguous memory, as the grader's inputs are handed over in its plain
    checks: program pid reads and writes the flat batch·head row b·H + h, with lengths[b]; every row the programs
    write holds one of their answers, and the whole is not the right answer."""
    if not isinstance(value, torch.Tensor) or value.shape != q.shape or q.shape[0] == q.shape[1]:
        return False
    batch, heads, d = q.shape
    if heads > batch:  # lengths[pid % H] would be read past its end
        return False
    flat = value.reshape(batch * heads, d).to(torch.float64)
    rows = {}
    for pid in range(batch * heads):
        b, h = pid % heads, pid // heads
        r = b * heads + h
        q_row = q.reshape(batch * heads, d)[r][None, None]
        n = int(lengths[b])
        keys, values = (x.reshape(batch * heads, -1, d)[r, :n][None] for x in (k_cache, v_cache))
        answer = attention.attend(q_row, keys, values, None)[0, 0] if n else torch.zeros(d, dtype=q.dtype)
        rows.setdefault(r, []).append(answer.to(torch.float64))
    for r, answers in rows.items():
        if not any(torch.allclose(flat[r], a, rtol=1e-2, atol=1e-2, equal_nan=True) for a in answers):
            return False
    right = decode_reference(q, k_cache, v_cache, lengths).reshape(batch * heads, d).to(torch.float64)
    return not torch.allclose(flat, right, rtol=1e-2, atol=1e-2, equal_nan=True)
