"""Candidates for `flash_attention` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant


def update(middle: str, end: str = "    return m_new, l_new, acc_new") -> str:
    """An online_softmax_update with m_new, `middle` (which makes l_new and acc_new), then `end`."""
    return f"""
def online_softmax_update(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.amax(dim=-1))
{middle}
{end}
"""


GUARDED = """\
    safe = torch.where(m_new == -math.inf, 0.0, m_new)
    alpha = torch.exp(m - safe)
    p = torch.exp(scores - safe[..., None])"""


MERGE_REFERENCE = """
_merge_reference = merge_partials
"""


def merge(body: str) -> str:
    """A merge_partials computing `body` (which returns)."""
    return f"""
def merge_partials(o1, lse1, o2, lse2):
{body}
"""


def flash(tile: str = "", *, mask: str = "", after: str = "", end: str = "") -> str:
    """A flash_attention written out (the reference's loop), with pieces to replace: `tile` after the scores of a tile,
    `mask` in place of the causal mask, `after` in place of the end of a query block, `end` in place of the return."""
    mask = mask or """\
            if causal:
                rows = torch.arange(offset + i, offset + i + bq, device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""
    after = after or """\
        seen = l > 0
        outs.append(torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0))
        lses.append(m + torch.log(l))"""
    end = end or "    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)"
    return f"""
def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d)
    offset = t_k - t_q
    outs, lses = [], []
    for i in range(0, t_q, block_q):
        qb = q[..., i:i + block_q, :].to(work) * scale
        bq = qb.shape[-2]
        m = torch.full(qb.shape[:-1], -math.inf, dtype=work, device=q.device)
        l = torch.zeros(qb.shape[:-1], dtype=work, device=q.device)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work, device=q.device)
        for j in range(0, t_k, block_k):
            kb = k[..., j:j + block_k, :].to(work)
            vb = v[..., j:j + block_k, :].to(work)
            scores = qb @ kb.transpose(-2, -1)
{tile}
{mask}
            m, l, acc = online_softmax_update(m, l, acc, scores, vb)
{after}
{end}
"""


INLINE_UPDATE = """\
            m_new = torch.maximum(m, scores.amax(-1))
            safe = torch.where(m_new == -math.inf, 0.0, m_new)
            p = torch.exp(scores - safe[..., None])"""

BUGGY = [
    # -- online_softmax_update ------------------------------------------------------------
    Variant("update_no_rescale", update(GUARDED + """
    l_new = l + p.sum(-1)
    acc_new = acc + p @ v"""), "online_softmax_update", "online_softmax_update.no_rescale"),
    Variant("update_l_not_rescaled", update(GUARDED + """
    l_new = l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "online_softmax_update.l_not_rescaled"),
    Variant("update_l_rescaled_twice", update(GUARDED + """
    l = alpha * l  # rescaled here, and again below
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "online_softmax_update.l_rescaled_twice"),
    Variant("update_acc_not_rescaled", update(GUARDED + """
    l_new = alpha * l + p.sum(-1)
    acc_new = acc + p @ v"""), "online_softmax_update", "online_softmax_update.acc_not_rescaled"),
    Variant("update_rescale_sign", update(GUARDED.replace("torch.exp(m - safe)", "torch.exp(safe - m)") + """
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "online_softmax_update.rescale_sign"),
    Variant("update_old_max", update("""\
    safe = torch.where(m_new == -math.inf, 0.0, m_new)
    old = torch.where(m == -math.inf, 0.0, m)
    alpha = torch.exp(m - safe)
    p = torch.exp(scores - old[..., None])
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "online_softmax_update.old_max"),
    Variant("update_normalised", update(GUARDED + """
    l_new = alpha * l + p.sum(-1)
    acc_new = (alpha[..., None] * acc + p @ v) / l_new[..., None]"""), "online_softmax_update", "online_softmax_update.normalised"),
    Variant("update_no_max", update("""\
    p = torch.exp(scores)
    l_new = l + p.sum(-1)
    acc_new = acc + p @ v"""), "online_softmax_update", "online_softmax_update.no_max"),
    Variant("update_nan_rows", update("""\
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "online_softmax_update.nan_rows"),
    Variant("update_block_max_only", """
def online_softmax_update(m, l, acc, scores, v):
    m_new = scores.amax(dim=-1)  # the block's max, the running one forgotten
    safe = torch.where(m_new == -math.inf, 0.0, m_new)
    alpha = torch.exp(m - safe)
    p = torch.exp(scores - safe[..., None])
    return m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + p @ v
""", "online_softmax_update", "online_softmax_update.block_max_only"),
    Variant("update_l_keepdim", update(GUARDED + """
    l_new = alpha[..., None] * l[..., None] + p.sum(-1, keepdim=True)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "axis_extra"),
    Variant("update_four_dims",  # B, H, T, _ = scores.shape: only batched scores work
            update(GUARDED + """
    b, h, t, _ = scores.shape
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha.view(b, h, t, 1) * acc + p @ v"""), "online_softmax_update", "fixed_rank"),
    # -- merge_partials -------------------------------------------------------------------
    Variant("merge_nan_rows", merge("""\
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse)[..., None], torch.exp(lse2 - lse)[..., None]
    return (w1 * o1.to(w1.dtype) + w2 * o2.to(w1.dtype)).to(o1.dtype), lse"""), "merge_partials", "merge_partials.nan_rows"),
    Variant("merge_max_lse", merge("""\
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(lse == -math.inf, 0.0, lse)
    w1, w2 = torch.exp(lse1 - safe)[..., None], torch.exp(lse2 - safe)[..., None]
    o = w1 * o1.to(w1.dtype) + w2 * o2.to(w1.dtype)
    return o.to(o1.dtype), torch.maximum(lse1, lse2)"""), "merge_partials", "merge_partials.max_lse"),
    Variant("merge_max_lse_weights", merge("""\
    lse = torch.maximum(lse1, lse2)  # and the weights relative to it
    safe = torch.where(lse == -math.inf, 0.0, lse)
    w1, w2 = torch.exp(lse1 - safe)[..., None], torch.exp(lse2 - safe)[..., None]
    return (w1 * o1.to(w1.dtype) + w2 * o2.to(w1.dtype)).to(o1.dtype), lse"""), "merge_partials", "merge_partials.max_lse"),
    Variant("merge_weights_swapped", merge("""\
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(lse == -math.inf, 0.0, lse)
    w1, w2 = torch.exp(lse1 - safe)[..., None], torch.exp(lse2 - safe)[..., None]
    return (w2 * o1.to(w1.dtype) + w1 * o2.to(w1.dtype)).to(o1.dtype), lse"""), "merge_partials", "merge_partials.weights_swapped"),
    Variant("merge_weights_not_unsqueezed", merge("""\
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(lse == -math.inf, 0.0, lse)
    w1, w2 = torch.exp(lse1 - safe), torch.exp(lse2 - safe)
    return (w1 * o1.to(w1.dtype) + w2 * o2.to(w1.dtype)).to(o1.dtype), lse"""), "merge_partials",
            "merge_partials.weights_not_unsqueezed"),
    Variant("merge_unnormalised", merge("""\
    top = torch.maximum(lse1, lse2)
    safe = torch.where(top == -math.inf, 0.0, top)
    w1, w2 = torch.exp(lse1 - safe), torch.exp(lse2 - safe)
    o = w1[..., None] * o1.to(w1.dtype) + w2[..., None] * o2.to(w1.dtype)
    return o.to(o1.dtype), safe + torch.log(w1 + w2)"""), "merge_partials", "merge_partials.unnormalised"),
    Variant("merge_unweighted", merge("""\
    return (o1 + o2) / 2, torch.logaddexp(lse1, lse2)"""), "merge_partials", "merge_partials.unweighted"),
    Variant("merge_unstable", merge("""\
    e1, e2 = torch.exp(lse1), torch.exp(lse2)
    o = (e1[..., None] * o1.to(e1.dtype) + e2[..., None] * o2.to(e1.dtype)) / (e1 + e2)[..., None]
    return o.to(o1.dtype), torch.log(e1 + e2)"""), "merge_partials", "merge_partials.unstable"),
    Variant("merge_lse_keepdim", merge("""\
    lse = torch.logaddexp(lse1, lse2)[..., None]
    safe = torch.where(lse == -math.inf, 0.0, lse)
    o = torch.exp(lse1[..., None] - safe) * o1.to(lse.dtype) + torch.exp(lse2[..., None] - safe) * o2.to(lse.dtype)
    return o.to(o1.dtype), lse"""), "merge_partials", "axis_extra"),
    # -- flash_attention ------------------------------------------------------------------
    Variant("flash_unscaled", flash().replace("scale = 1.0 / math.sqrt(d)", "scale = 1.0"),
            "flash_attention", "flash_attention.unscaled"),
    Variant("flash_scaled_by_d", flash().replace("scale = 1.0 / math.sqrt(d)", "scale = 1.0 / d"),
            "flash_attention", "flash_attention.scaled_by_d"),
    Variant("flash_scaled_by_value_width", flash().replace("scale = 1.0 / math.sqrt(d)", "scale = 1.0 / math.sqrt(v.shape[-1])"),
            "flash_attention", "flash_attention.scaled_by_value_width"),
    Variant("flash_no_diagonal", flash().replace("cols > rows, -math.inf", "cols >= rows, -math.inf"),
            "flash_attention", "flash_attention.no_diagonal"),
    Variant("flash_tile_local_mask", flash(mask="""\
            if causal:  # positions within the tile
                rows = torch.arange(bq, device=q.device)[:, None] + offset
                cols = torch.arange(kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""),
            "flash_attention", "flash_attention.tile_local_mask"),
    Variant("flash_skip_stops_short",  # causal: keys after the block's last query skipped, one too many
            flash().replace("range(0, t_k, block_k)", "range(0, min(t_k, offset + i + bq - 1) if causal else t_k, block_k)"),
            "flash_attention", "flash_attention.skip_stops_short"),
    Variant("flash_finite_fill", flash().replace("cols > rows, -math.inf", "cols > rows, -1e9"),
            "flash_attention", "flash_attention.finite_fill"),
    Variant("flash_top_left", flash().replace("offset = t_k - t_q", "offset = 0"), "flash_attention", "flash_attention.top_left"),
    Variant("flash_positions_past_the_end", flash().replace(
        "cols = torch.arange(j, j + kb.shape[-2], device=q.device)", "cols = torch.arange(j, j + block_k, device=q.device)"),
            "flash_attention", "flash_attention.positions_past_the_end"),
    Variant("flash_last_block_dropped", flash().replace("range(0, t_k, block_k)", "range(0, t_k - block_k + 1, block_k)"),
            "flash_attention", "flash_attention.last_block_dropped"),
    Variant("flash_slice_off_by_one", flash().replace("j:j + block_k, :].to(work)", "j:j + block_k - 1, :].to(work)"),
            "flash_attention", "flash_attention.slice_off_by_one"),
    Variant("flash_k_step_block_q", flash().replace("range(0, t_k, block_k)", "range(0, t_k, block_q)"),
            "flash_attention", "flash_attention.k_step_block_q"),
    Variant("flash_no_rescale_inline",  # the update written in the loop, without the rescale
            flash().replace(
                "            m, l, acc = online_softmax_update(m, l, acc, scores, vb)", INLINE_UPDATE + """
            l = l + p.sum(-1)
            acc = acc + p @ vb
            m = m_new"""), "flash_attention", "flash_attention.no_rescale"),
    Variant("flash_normalised_in_loop", flash(after="""\
        out = torch.where((l > 0)[..., None], acc, 0.0)
        outs.append(out)
        lses.append(m + torch.log(l))""").replace(
        "            m, l, acc = online_softmax_update(m, l, acc, scores, vb)",
        "            m, l, acc = online_softmax_update(m, l, acc, scores, vb)\n            acc = acc / l[..., None]"),
        "flash_attention", "flash_attention.normalised_in_loop"),
    Variant("flash_lse_without_max", flash().replace("lses.append(m + torch.log(l))", "lses.append(torch.log(l))"),
            "flash_attention", "flash_attention.lse_without_max"),
    Variant("flash_lse_log2", flash().replace("lses.append(m + torch.log(l))", "lses.append((m + torch.log(l)) / math.log(2))"),
            "flash_attention", "flash_attention.lse_log2"),
    Variant("flash_lse_in_q_dtype", flash(end="    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1).to(q.dtype)"),
            "flash_attention", "flash_attention.lse_dtype"),
    Variant("flash_nan_rows", flash(after="""\
        outs.append(acc / l[..., None])
        lses.append(m + torch.log(l))"""), "flash_attention", "flash_attention.nan_rows"),
    Variant("flash_out_in_float32", flash(end="    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)"),
            "flash_attention", "dtype_promoted"),
    Variant("flash_whole_score_matrix",  # right values, but the whole (Tq, Tk) matrix at once, einsum and all
            """
def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    s = torch.einsum("...qd,...kd->...qk", q.to(work), k.to(work)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q).logical_not(), -math.inf)
    m = s.amax(-1)
    safe = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(s - safe[..., None])
    l = p.sum(-1)
    out = torch.where((l > 0)[..., None], (p @ v.to(work)) / torch.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.to(q.dtype), safe + torch.log(l)
""", "flash_attention", "flash_attention.full_score_matrix"),
    Variant("flash_query_blocks_only",  # tiles of block_q queries against every key: a block_q × Tk row of scores
            flash().replace("range(0, t_k, block_k)", "range(0, t_k, t_k)").replace("j:j + block_k", "j:j + t_k"),
            "flash_attention", "flash_attention.full_score_matrix"),
    Variant("flash_whole_causal_mask",  # tiles, but the (Tq, Tk) mask is built once and sliced
            flash(mask="""\
            if causal:
                scores = scores.masked_fill(~visible[i:i + bq, j:j + kb.shape[-2]], -math.inf)""").replace(
        "    outs, lses = [], []",
        "    outs, lses = [], []\n"
        "    visible = torch.arange(t_k, device=q.device)[None, :] <= torch.arange(offset, offset + t_q, device=q.device)[:, None]"),
        "flash_attention", "flash_attention.full_score_matrix"),
    Variant("flash_block_sizes_ignored",  # 32 × 32 tiles, whatever the caller asks for
            flash().replace("    t_q, t_k, d = q.shape[-2]", "    block_q = block_k = 32\n    t_q, t_k, d = q.shape[-2]"),
            "flash_attention", "flash_attention.block_sizes_ignored"),
    Variant("flash_returns_out_only", flash(end="    return torch.cat(outs, dim=-2).to(q.dtype)"), "flash_attention"),
    # -- found by the search (grader/engine/search.py) -------------------------------------
    Variant("flash_causal_inverted", flash().replace("            if causal:", "            if not causal:"),
            "flash_attention", "flag_inverted"),
    Variant("flash_float32_inside", flash().replace("work = torch.promote_types(q.dtype, torch.float32)",
                                                    "work = torch.float32").replace(
        "torch.cat(lses, dim=-1)", "torch.cat(lses, dim=-1).to(torch.promote_types(q.dtype, torch.float32))"),
        "flash_attention", "computed_in_float32"),
    Variant("merge_lse_first", MERGE_REFERENCE + merge("""    o, lse = _merge_reference(o1, lse1, o2, lse2)
    return lse, o"""), "merge_partials", "outputs_reordered"),
]

RULES_ONLY = [
    Variant("update_tile_softmax",  # p from the tile's softmax, scaled back: right, but a softmax
            update("""\
    safe = torch.where(m_new == -math.inf, 0.0, m_new)
    alpha = torch.exp(m - safe)
    top = torch.where(scores.amax(-1) == -math.inf, 0.0, scores.amax(-1))
    p = scores.softmax(-1).nan_to_num(0.0) * (torch.exp(scores - top[..., None]).sum(-1) * torch.exp(top - safe))[..., None]
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "forbidden_call"),
    Variant("flash_sdpa", """
import torch.nn.functional as F

def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    visible = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible).nan_to_num(0.0)
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~visible, -math.inf)
    return out, torch.logsumexp(s, -1)
""", "flash_attention", "forbidden_call"),
]

DEVICE_BUGGY = [
    Variant("update_zeros_on_cpu", update("""\
    safe = torch.where(m_new == -math.inf, torch.zeros(m_new.shape, dtype=m_new.dtype), m_new)
    alpha = torch.exp(m - safe)
    p = torch.exp(scores - safe[..., None])
    l_new = alpha * l + p.sum(-1)
    acc_new = alpha[..., None] * acc + p @ v"""), "online_softmax_update", "tensor_on_cpu"),
    Variant("merge_inf_on_cpu", merge("""\
    lse = torch.logaddexp(lse1, lse2)
    empty = lse == torch.full(lse.shape, -math.inf, dtype=lse.dtype)
    safe = torch.where(empty, 0.0, lse)
    w1, w2 = torch.exp(lse1 - safe)[..., None], torch.exp(lse2 - safe)[..., None]
    return (w1 * o1.to(w1.dtype) + w2 * o2.to(w1.dtype)).to(o1.dtype), lse"""), "merge_partials", "tensor_on_cpu"),
    Variant("flash_positions_on_cpu", flash(mask="""\
            if causal:
                rows = torch.arange(offset + i, offset + i + bq)[:, None]
                cols = torch.arange(j, j + kb.shape[-2])[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""), "flash_attention", "tensor_on_cpu"),
]

CORRECT = [
    Variant("tile_matmul_in_q_dtype",  # the tile's q · k in q's own dtype (as the kernels' tensor cores do), the state in float32
            flash().replace("qb = q[..., i:i + block_q, :].to(work) * scale", "qb = q[..., i:i + block_q, :] * scale")
            .replace("kb = k[..., j:j + block_k, :].to(work)", "kb = k[..., j:j + block_k, :]")
            .replace("scores = qb @ kb.transpose(-2, -1)", "scores = (qb @ kb.transpose(-2, -1)).to(work)")),
    Variant(
        "exp2_inline_k_outer",  # base 2 throughout (q scaled by log2(e)/√D, exp2), keys outer, queries inner, lse in ln
        """
        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
            work = torch.promote_types(q.dtype, torch.float32)
            q2 = q.to(work) * (math.log2(math.e) / math.sqrt(d))
            starts = list(range(0, t_q, block_q))
            state = {i: (torch.full((*q.shape[:-2], min(block_q, t_q - i)), -math.inf, dtype=work, device=q.device),
                         torch.zeros(*q.shape[:-2], min(block_q, t_q - i), dtype=work, device=q.device),
                         torch.zeros(*q.shape[:-2], min(block_q, t_q - i), v.shape[-1], dtype=work, device=q.device))
                     for i in starts}
            for j in range(0, t_k, block_k):
                kb, vb = k[..., j:j + block_k, :].to(work), v[..., j:j + block_k, :].to(work)
                for i in starts:
                    m, l, acc = state[i]
                    s = q2[..., i:i + block_q, :] @ kb.mT
                    if causal:
                        pos = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[-2], device=q.device)
                        s = torch.where(torch.arange(j, j + s.shape[-1], device=q.device) <= pos[:, None], s, -math.inf)
                    m_new = torch.maximum(m, s.amax(-1))
                    base = torch.where(torch.isinf(m_new), 0.0, m_new)
                    alpha = torch.exp2(m - base)
                    p = torch.exp2(s - base[..., None])
                    state[i] = (m_new, alpha * l + p.sum(-1), alpha[..., None] * acc + p @ vb)
            outs, lses = [], []
            for i in starts:
                m, l, acc = state[i]
                outs.append((acc / l.clamp_min(1e-30)[..., None]))
                lses.append((m + torch.log2(l)) * math.log(2))
            return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)
        """,
    ),
    Variant(
        "tiles_merged_by_lse",  # each tile attended on its own (logsumexp of the tile), tiles put together with merge_partials
        """
        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            t_q, t_k = q.shape[-2], k.shape[-2]
            work = torch.promote_types(q.dtype, torch.float32)
            outs, lses = [], []
            for i in range(0, t_q, block_q):
                qb = q[..., i:i + block_q, :].to(work) / math.sqrt(q.shape[-1])
                o = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work, device=q.device)
                lse = torch.full(qb.shape[:-1], -math.inf, dtype=work, device=q.device)
                for j in range(0, t_k, block_k):
                    s = torch.einsum("...qd,...kd->...qk", qb, k[..., j:j + block_k, :].to(work))
                    if causal:
                        rows = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[-2], device=q.device)[:, None]
                        s = s.masked_fill(torch.arange(j, j + s.shape[-1], device=q.device) > rows, -math.inf)
                    tile_lse = torch.logsumexp(s, -1)
                    w = torch.exp(s - torch.where(torch.isinf(tile_lse), 0.0, tile_lse)[..., None])
                    o, lse = merge_partials(o, lse, w @ v[..., j:j + block_k, :].to(work), tile_lse)
                outs.append(o)
                lses.append(lse)
            return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)
        """,
    ),
    Variant(
        "flattened_small_tiles_skipping_the_future",  # batch and heads flattened, tiles of at most 8, causal tiles
        # wholly in the future skipped, masks with torch.where, the update with nan_to_num
        """
        def online_softmax_update(m, l, acc, scores, v):
            m_new = torch.max(m, scores.max(dim=-1).values)
            alpha = torch.exp(m - m_new).nan_to_num(0.0)
            p = torch.exp(scores - m_new.unsqueeze(-1)).nan_to_num(0.0)
            return m_new, l * alpha + p.sum(dim=-1), acc * alpha.unsqueeze(-1) + torch.matmul(p, v)

        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            lead, t_q, t_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
            bq, bk = min(block_q, 8), min(block_k, 8)
            work = torch.promote_types(q.dtype, torch.float32)
            qf, kf, vf = q.reshape(-1, t_q, d), k.reshape(-1, t_k, d), v.reshape(-1, t_k, v.shape[-1])
            outs, lses = [], []
            for i in range(0, t_q, bq):
                qb = qf[:, i:i + bq].to(work) * d ** -0.5
                n = qb.shape[1]
                m = qb.new_full((qb.shape[0], n), -math.inf)
                l, acc = qb.new_zeros(qb.shape[0], n), qb.new_zeros(qb.shape[0], n, vf.shape[-1])
                last = t_k - t_q + i + n - 1  # the last position this block's queries see
                for j in range(0, t_k, bk):
                    if causal and j > last:
                        break
                    s = qb @ kf[:, j:j + bk].to(work).transpose(1, 2)
                    if causal:
                        rows = torch.arange(t_k - t_q + i, t_k - t_q + i + n, device=q.device).unsqueeze(1)
                        s = torch.where(torch.arange(j, j + s.shape[-1], device=q.device) <= rows, s, torch.tensor(-math.inf))
                    m, l, acc = online_softmax_update(m, l, acc, s, vf[:, j:j + bk].to(work))
                outs.append(torch.where(l.unsqueeze(-1) > 0, acc / l.unsqueeze(-1), torch.zeros_like(acc)))
                lses.append(m + l.log())
            out = torch.cat(outs, 1).reshape(*lead, t_q, v.shape[-1])
            return out.to(q.dtype), torch.cat(lses, 1).reshape(*lead, t_q)
        """,
    ),
    Variant(
        "padded_to_whole_blocks",  # keys padded to a whole number of blocks with F.pad, the padding masked as -inf
        """
        import torch.nn.functional as F

        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            t_q, t_k = q.shape[-2], k.shape[-2]
            work = torch.promote_types(q.dtype, torch.float32)
            extra = -t_k % block_k
            kp, vp = F.pad(k.to(work), (0, 0, 0, extra)), F.pad(v.to(work), (0, 0, 0, extra))
            outs, lses = [], []
            for i in range(0, t_q, block_q):
                qb = q[..., i:i + block_q, :].to(work) / math.sqrt(q.shape[-1])
                m = torch.full(qb.shape[:-1], -math.inf, dtype=work, device=q.device)
                l = torch.zeros_like(m)
                acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work, device=q.device)
                for j in range(0, t_k + extra, block_k):
                    s = qb @ kp[..., j:j + block_k, :].transpose(-2, -1)
                    cols = torch.arange(j, j + block_k, device=q.device)
                    blocked = cols >= t_k
                    if causal:
                        rows = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2], device=q.device)[:, None]
                        blocked = blocked | (cols > rows)
                    m, l, acc = online_softmax_update(m, l, acc, s.masked_fill(blocked, -math.inf), vp[..., j:j + block_k, :])
                outs.append(acc / torch.where(l == 0, 1.0, l)[..., None])
                lses.append(m + torch.log(l))
            return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)
        """,
    ),
    Variant(
        "merge_stacked",  # the two parts stacked on a new axis: logsumexp over it, weights from it
        """
        def merge_partials(o1, lse1, o2, lse2):
            lses = torch.stack([lse1, lse2])
            lse = torch.logsumexp(lses, 0)
            w = torch.exp(lses - lse.nan_to_num(neginf=0.0)).unsqueeze(-1)
            work = torch.promote_types(o1.dtype, lse.dtype)
            o = (w * torch.stack([o1, o2]).to(work)).sum(0)
            return o.to(o1.dtype), lse
        """,
    ),
    Variant(
        "update_by_logsumexp",  # the block's max and sum from one logsumexp per row, the update in log space
        """
        def online_softmax_update(m, l, acc, scores, v):
            m_new = torch.maximum(m, scores.amax(-1))
            ref = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            block = torch.logsumexp(scores - ref[..., None], -1)
            p = torch.exp(scores - ref[..., None])
            return m_new, torch.exp(m - ref) * l + torch.exp(block), torch.exp(m - ref)[..., None] * acc + torch.einsum("...qk,...kd->...qd", p, v)
        """,
    ),
    Variant("flash_with_bthd_view", """
_flash_reference = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    q_bthd = q.transpose(1, 2)  # flash-attn's own layout (B, T, H, D), made and never used
    k_bthd = k.transpose(1, 2).contiguous()
    return _flash_reference(q, k, v, causal, block_q, block_k)
"""),
]
