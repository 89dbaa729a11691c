"""Candidates for `attention_backward` made from the reference by redefining one thing (Python keeps a file's last
definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the grader must find.
CORRECT: unusual but right ways to write the steps; each must score 100. RULES_ONLY: autograd, torch's own
backward ops or a softmax where the step forbids them; each loses its whole step.
"""

from tests.exercises.mha.variants import Variant


def softmax_backward(body: str) -> str:
    return f"""
def softmax_backward(probs, grad_probs, dim=-1):
{body}
"""


RIGHT_INNER = "    inner = (grad_probs * probs).sum(dim=dim, keepdim=True)"


def attention(*, scores: str = "", probs: str = "", grad_v: str = "", grad_scores: str = "", grad_k: str = "") -> str:
    """An attention_backward written out as the reference's, with lines to replace."""
    scores = scores or """\
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)"""
    probs = probs or "    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)"
    grad_v = grad_v or "    grad_v = probs.transpose(-2, -1) @ grad_out"
    grad_scores = grad_scores or "    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1)) * scale"
    grad_k = grad_k or "    grad_k = grad_scores.transpose(-2, -1) @ q"
    return f"""
def attention_backward(q, k, v, grad_out, mask=None):
    scale = 1.0 / math.sqrt(q.shape[-1])
{scores}
{probs}
{grad_v}
{grad_scores}
    grad_q = grad_scores @ k
{grad_k}
    return grad_q, grad_k, grad_v
"""


def flash(*, delta: str = "", guard: str = "", keys: str = "", offset: str = "", mask: str = "", probs: str = "",
          grad_v: str = "", grad_scores: str = "", grad_k: str = "") -> str:
    """A flash_attention_backward written out as the reference's, with lines to replace."""
    delta = delta or "    delta = (grad_out * out).sum(dim=-1)"
    guard = guard or "    lse = lse.masked_fill(lse == -math.inf, math.inf)"
    keys = keys or "range(0, t_k, block_k)"
    offset = offset or "t_k - t_q"
    mask = mask or """\
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""
    probs = probs or "            probs = torch.exp(scores - lse[..., i:i + block_q, None])"
    grad_v = grad_v or "            grad_v[..., j:j + block_k, :] += probs.transpose(-2, -1) @ dob"
    grad_scores = grad_scores or \
        "            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None]) * scale"
    grad_k = grad_k or "            grad_k[..., j:j + block_k, :] += grad_scores.transpose(-2, -1) @ qb"
    return f"""
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = {offset}
{delta}
{guard}
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in {keys}:
        kb, vb = k[..., j:j + block_k, :], v[..., j:j + block_k, :]
        for i in range(0, t_q, block_q):
            qb, dob = q[..., i:i + block_q, :], grad_out[..., i:i + block_q, :]
            scores = qb @ kb.transpose(-2, -1) * scale
{mask}
{probs}
{grad_v}
            grad_probs = dob @ vb.transpose(-2, -1)
{grad_scores}
            grad_q[..., i:i + block_q, :] += grad_scores @ kb
{grad_k}
    return grad_q, grad_k, grad_v
"""


def function(*, tiles: str = "", row_end: str = "", save: str = "", back: str = "") -> str:
    """A FlashAttentionFunction written out as the reference's, with pieces to replace: `tiles` the tile loop's
    range, `row_end` the end of a query block, `save` what forward keeps, `back` backward's body."""
    tiles = tiles or "range(0, t_q, block_q)"
    row_end = row_end or """\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append(m + torch.log(l))"""
    save = save or """\
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k"""
    back = back or """\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None"""
    return f"""
class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        t_q, t_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        bq_, bk_ = block_q, block_k
        outs, lses = [], []
        for i in {tiles}:
            qb = q[..., i:i + bq_, :] * scale
            m = torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
            l = torch.zeros_like(m)
            acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
            for j in range(0, t_k, bk_):
                scores = qb @ k[..., j:j + bk_, :].transpose(-2, -1)
                if causal:
                    rows = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2], device=q.device)[:, None]
                    cols = torch.arange(j, j + scores.shape[-1], device=q.device)[None, :]
                    scores = scores.masked_fill(cols > rows, -math.inf)
                m_new = torch.maximum(m, scores.amax(dim=-1))
                m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
                alpha, p = torch.exp(m - m_safe), torch.exp(scores - m_safe[..., None])
                l = alpha * l + p.sum(dim=-1)
                acc = alpha[..., None] * acc + p @ v[..., j:j + bk_, :]
                m = m_new
{row_end}
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
{save}
        return out

    @staticmethod
    def backward(ctx, grad_out):
{back}
"""


BUGGY = [
    # -- softmax_backward -----------------------------------------------------------------------
    Variant("softmax_backward_flattened_with_view", """
def softmax_backward(probs, grad_probs, dim=-1):
    if dim in (-1, probs.dim() - 1):  # the last axis: rows flattened with view, which needs contiguous memory
        p, g = probs.view(-1, probs.shape[-1]), grad_probs.view(-1, probs.shape[-1])
        return (p * (g - (p * g).sum(-1, keepdim=True))).view(probs.shape)
    return probs * (grad_probs - (probs * grad_probs).sum(dim, keepdim=True))
""", "softmax_backward", "view_non_contiguous"),
    Variant("softmax_backward_negative_dim_in_permutation", """
def softmax_backward(probs, grad_probs, dim=-1):
    if dim == -1:
        return probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True))
    order = [i for i in range(probs.dim()) if i != dim] + [dim]  # a negative dim is never left out: no permutation
    p, g = probs.permute(order), grad_probs.permute(order)
    back = [order.index(i) for i in range(probs.dim())]
    return (p * (g - (p * g).sum(-1, keepdim=True))).permute(back)
""", "softmax_backward", "softmax_backward.negative_dim_mishandled"),
    Variant("sb_row_sum_squeezed", """
def softmax_backward(probs, grad_probs, dim=-1):
    inner = (grad_probs * probs).sum(dim=dim, keepdim=True).squeeze()  # every axis of 1 goes, not only dim's
    return probs * (grad_probs - inner.unsqueeze(dim))
""", "softmax_backward", situations=("softmax_backward.one_row_mishandled",)),
    Variant("sb_default_dim_one", softmax_backward(RIGHT_INNER + "\n    return probs * (grad_probs - inner)").replace(
        "dim=-1):", "dim=1):"), "softmax_backward", "default_misread"),
    Variant("sb_row_mean", softmax_backward(
        "    inner = (grad_probs * probs).mean(dim=dim, keepdim=True)\n    return probs * (grad_probs - inner)"),
            "softmax_backward", "softmax_backward.row_mean"),
    Variant("sb_first_term_twice", softmax_backward("""\
    terms = (grad_probs * probs).unbind(dim)
    inner = terms[0]
    for term in terms:  # the loop starts at 0 too: the first term counted twice
        inner = inner + term
    return probs * (grad_probs - inner.unsqueeze(dim % probs.dim()))"""), "softmax_backward", "softmax_backward.row_sum_off"),
    Variant("sb_real_rows_zeroed", softmax_backward(RIGHT_INNER + """
    real = probs.sum(dim=dim, keepdim=True) == 1  # the forty-eighth blind set's b01: rounding fails the test
    return torch.where(real, probs * (grad_probs - inner), torch.zeros_like(probs))"""),
            "softmax_backward", "softmax_backward.real_rows_zeroed"),
    Variant("sb_no_row_sum", softmax_backward("    return probs * grad_probs"),
            "softmax_backward", "softmax_backward.no_row_sum"),
    Variant("sb_probs_twice", softmax_backward(RIGHT_INNER + "\n    return probs * (probs * grad_probs - inner)"),
            "softmax_backward", "softmax_backward.probs_twice"),  # the forty-seventh blind set's b01
    Variant("sb_sum_not_weighted", softmax_backward(RIGHT_INNER + "\n    return probs * grad_probs - inner"),
            "softmax_backward", "softmax_backward.sum_not_weighted"),
    Variant("sb_log_softmax_gradient", softmax_backward(
        "    return grad_probs - probs * grad_probs.sum(dim, keepdim=True)"),
            "softmax_backward", "softmax_backward.log_softmax_gradient"),
    Variant("sb_diagonal_only", softmax_backward("    return probs * (1 - probs) * grad_probs"),
            "softmax_backward", "softmax_backward.diagonal_only"),
    Variant("sb_sign", softmax_backward(RIGHT_INNER + "\n    return probs * (grad_probs + inner)"),
            "softmax_backward", "softmax_backward.sign"),
    Variant("sb_sum_without_probs", softmax_backward("""\
    inner = grad_probs.sum(dim=dim, keepdim=True)
    return probs * (grad_probs - inner)"""), "softmax_backward", "softmax_backward.sum_without_probs"),
    Variant("sb_probs_outside_dropped", softmax_backward(RIGHT_INNER + "\n    return grad_probs - inner"),
            "softmax_backward", "softmax_backward.probs_outside_dropped"),
    Variant("sb_sum_over_everything", softmax_backward("""\
    return probs * (grad_probs - (grad_probs * probs).sum())"""), "softmax_backward",
            "softmax_backward.sum_over_everything"),
    Variant("sb_sum_over_queries", softmax_backward("""\
    inner = (grad_probs * probs).sum(dim=-2, keepdim=True)  # the axis before the keys
    return probs * (grad_probs - inner)"""), "softmax_backward", "softmax_backward.sum_over_queries"),
    Variant("sb_dim_ignored", softmax_backward("""\
    inner = (grad_probs * probs).sum(-1, keepdim=True)
    return probs * (grad_probs - inner)"""), "softmax_backward", "softmax_backward.dim_ignored"),
    Variant("sb_dim_zero_falsy", softmax_backward("""\
    dim = dim or -1  # 0 is falsy: dim=0 becomes the last axis
    inner = (grad_probs * probs).sum(dim=dim, keepdim=True)
    return probs * (grad_probs - inner)"""), "softmax_backward", "zero_read_as_default"),
    Variant("sb_weighted_mean", softmax_backward("""\
    inner = (grad_probs * probs).sum(dim=dim, keepdim=True) / probs.sum(dim=dim, keepdim=True)
    return probs * (grad_probs - inner)"""), "softmax_backward", "softmax_backward.nan_rows"),
    Variant("sb_keepdim_lost", softmax_backward("""\
    inner = (grad_probs * probs).sum(dim=dim)
    return probs * (grad_probs - inner)"""), "softmax_backward", "keepdim_lost"),
    # -- attention_backward ---------------------------------------------------------------------
    Variant("att_causal_when_unmasked", attention(scores="""\
    scores = q @ k.transpose(-2, -1) * scale
    if mask is None:  # a decoder's habit: the forty-fourth blind set's b03
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(k.shape[-2] - q.shape[-2])
    scores = scores.masked_fill(~mask, -math.inf)"""), "attention_backward", "attention_backward.causal_unasked"),
    Variant("att_max_before_mask", attention(scores="""\
    scores = q @ k.transpose(-2, -1) * scale
    scores = scores - scores.amax(dim=-1, keepdim=True)  # the max over every key, blocked ones too
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)""", probs="""\
    e = torch.exp(scores)
    probs = (e / e.sum(dim=-1, keepdim=True)).nan_to_num(0.0)"""), "attention_backward",
            "attention_backward.max_before_mask"),  # the forty-second blind set's b03
    Variant("att_nan_rows", attention(probs="    probs = torch.softmax(scores, dim=-1)"),
            "attention_backward", "attention_backward.nan_rows"),
    Variant("att_mask_added", attention(scores="""\
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores + mask"""), "attention_backward", "attention_backward.mask_added"),
    Variant("att_dv_not_transposed", attention(grad_v="    grad_v = probs @ grad_out"),
            "attention_backward", "attention_backward.dv_not_transposed"),
    Variant("att_dk_not_transposed", attention(grad_k="    grad_k = grad_scores @ q"),
            "attention_backward", "attention_backward.dk_not_transposed"),
    Variant("att_unscaled",
            attention(grad_scores="    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1))"),
            "attention_backward", "attention_backward.unscaled"),
    Variant("att_scaled_twice", attention(
        grad_scores="    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1)) * scale * scale"),
            "attention_backward", "attention_backward.scaled_by_d"),
    Variant("att_dv_scaled", attention(grad_v="    grad_v = probs.transpose(-2, -1) @ grad_out * scale"),
            "attention_backward", "attention_backward.dv_scaled"),
    Variant("att_scale_divided_by", attention(scores="""\
    scores = q @ k.transpose(-2, -1) / scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)"""), "attention_backward", "attention_backward.forward_scale_wrong"),
    Variant("att_mask_ignored", attention(scores="    scores = q @ k.transpose(-2, -1) * scale"),
            "attention_backward", "attention_backward.mask_ignored"),
    Variant("att_mask_after_softmax", attention(scores="    scores = q @ k.transpose(-2, -1) * scale", probs="""\
    probs = torch.softmax(scores, dim=-1)
    if mask is not None:
        probs = probs.masked_fill(~mask, 0.0)"""), "attention_backward", "attention_backward.mask_after_softmax"),
    Variant("att_finite_fill", attention(scores="""\
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)"""), "attention_backward", "attention_backward.finite_fill"),
    Variant("att_softmax_over_queries", attention(probs="    probs = torch.softmax(scores, dim=-2).nan_to_num(0.0)"),
            "attention_backward", "attention_backward.softmax_over_queries"),
    Variant("att_row_sum_over_queries", attention(grad_scores="""\
    grad_probs = grad_out @ v.transpose(-2, -1)
    grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-2, keepdim=True)) * scale"""),
            "attention_backward", "attention_backward.row_sum_over_queries"),
    Variant("att_max_of_all_rows", attention(probs="""\
    exps = torch.exp(scores - scores.max())  # one max for every row
    probs = (exps / exps.sum(-1, keepdim=True)).nan_to_num(0.0)"""),
            "attention_backward", "attention_backward.max_of_all_rows"),
    Variant("att_max_not_subtracted", attention(probs="""\
    exps = scores.exp()
    probs = (exps / exps.sum(-1, keepdim=True)).nan_to_num(0.0)"""),
            "attention_backward", "attention_backward.max_not_subtracted"),
    Variant("att_no_row_sum", attention(grad_scores="    grad_scores = probs * (grad_out @ v.transpose(-2, -1)) * scale"),
            "attention_backward", "attention_backward.no_row_sum"),
    Variant("att_dq_unscaled", attention(
        grad_scores="    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1))",
        grad_k="    grad_k = grad_scores.transpose(-2, -1) @ q * scale"),
            "attention_backward", "attention_backward.dq_scale_wrong"),
    Variant("att_dk_from_prescaled_q", attention(scores="""\
    q = q * scale  # pre-scaled once for the scores, and reused in dk below
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)""", grad_k="    grad_k = grad_scores.transpose(-2, -1) @ q"),
            "attention_backward", "attention_backward.dk_scale_wrong"),
    Variant("att_heads_transposed_with_queries", attention(grad_v="    grad_v = probs.transpose(1, 2) @ grad_out"),
            "attention_backward", "attention_backward.heads_transposed_with_queries"),
    Variant("att_four_dims_only", attention(grad_k="    grad_k = grad_scores.transpose(2, 3) @ q  # (B, H, T, T) only"),
            "attention_backward"),
    Variant("att_dp_from_keys",
            attention(grad_scores="    grad_scores = softmax_backward(probs, grad_out @ k.transpose(-2, -1)) * scale"),
            "attention_backward", "attention_backward.dp_from_keys"),
    Variant("att_dq_from_queries", attention().replace("grad_q = grad_scores @ k", "grad_q = grad_scores @ q"),
            "attention_backward", "attention_backward.operands_swapped"),
    Variant("att_gradient_order", attention().replace("return grad_q, grad_k, grad_v", "return grad_q, grad_v, grad_k"),
            "attention_backward", "attention_backward.gradient_order"),
    Variant("att_mask_inverted", attention(scores="""\
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, -math.inf)"""), "attention_backward", "attention_backward.mask_inverted"),
    # -- flash_attention_backward -----------------------------------------------------------------
    Variant("fab_nan_rows", flash(guard="    pass"), "flash_attention_backward", "flash_attention_backward.nan_rows"),
    Variant("fab_dv_shaped_like_k", flash().replace(
        "grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)",
        "grad_q, grad_k = torch.zeros_like(q), torch.zeros_like(k)\n    grad_v = torch.zeros_like(k)  # dk's line, copied"),
            "flash_attention_backward", "flash_attention_backward.dv_shaped_like_k"),
    Variant("fab_query_start_unclamped", flash(mask="""\
            if causal:
                rows = torch.arange(offset + i, offset + min(i + block_q, t_q), device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)""").replace(
        "for i in range(0, t_q, block_q):", "for i in range(j - offset if causal else 0, t_q, block_q):"),
            "flash_attention_backward", "empty_slice"),  # the fortieth blind set's b05: the first query to see key j
    Variant("fab_exp_ratio", flash(probs="            probs = torch.exp(scores) / torch.exp(lse[..., i:i + block_q, None])"),
            "flash_attention_backward", "flash_attention_backward.large_scores_mishandled"),
    Variant("fab_delta_sign", flash(
        grad_scores="            grad_scores = probs * (grad_probs + delta[..., i:i + block_q, None]) * scale"),
            "flash_attention_backward", "flash_attention_backward.delta_sign"),
    Variant("fab_delta_from_the_tile", flash(
        grad_scores="            grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-1, keepdim=True)) * scale"),
            "flash_attention_backward", "flash_attention_backward.delta_from_the_tile"),
    Variant("fab_delta_over_queries", flash(
        grad_scores="            grad_scores = probs * (grad_probs - (probs * grad_probs).sum(-2, keepdim=True)) * scale"),
            "flash_attention_backward", "flash_attention_backward.delta_over_queries"),
    Variant("fab_unscaled", flash(
        grad_scores="            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None])"),
            "flash_attention_backward", "flash_attention_backward.unscaled"),
    Variant("fab_scaled_twice", flash(
        grad_scores="            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None]) * scale ** 2"),
            "flash_attention_backward", "flash_attention_backward.scaled_by_d"),
    Variant("fab_dv_not_transposed", flash(grad_v="            grad_v[..., j:j + block_k, :] += probs @ dob"),
            "flash_attention_backward", "flash_attention_backward.dv_not_transposed"),
    Variant("fab_lse_not_unsqueezed", flash(probs="            probs = torch.exp(scores - lse[..., i:i + block_q])"),
            "flash_attention_backward", "flash_attention_backward.lse_not_unsqueezed"),
    Variant("fab_mask_forgotten", flash(mask="            pass"),
            "flash_attention_backward", "flash_attention_backward.mask_forgotten"),
    Variant("fab_masked_after_exp", flash(mask="""\
            hidden = None
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                hidden = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :] > rows""",
        probs="""\
            probs = torch.exp(scores - lse[..., i:i + block_q, None])
            if hidden is not None:
                probs = probs * ~hidden"""),
            "flash_attention_backward", "flash_attention_backward.masked_after_exp"),
    Variant("fab_top_left", flash(offset="0"), "flash_attention_backward", "flash_attention_backward.top_left"),
    Variant("fab_last_block_dropped", flash(keys="range(0, t_k - t_k % block_k, block_k)"),
            "flash_attention_backward", "flash_attention_backward.last_block_dropped"),
    Variant("fab_positions_past_the_end", flash(mask="""\
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + block_k, device=q.device)[None, :]  # the last tile is shorter
                scores = scores.masked_fill(cols > rows, -math.inf)"""),
            "flash_attention_backward", "flash_attention_backward.positions_past_the_end"),
    Variant("fab_overwritten", flash(
        grad_v="            grad_v[..., j:j + block_k, :] = probs.transpose(-2, -1) @ dob",
        grad_k="            grad_k[..., j:j + block_k, :] = grad_scores.transpose(-2, -1) @ qb"),
            "flash_attention_backward", "flash_attention_backward.overwritten"),
    Variant("fab_full_score_matrix", """
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if causal:
        keep = torch.arange(t_k, device=q.device)[None, :] <= torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
        scores = scores.masked_fill(~keep, -math.inf)
    probs = torch.exp(scores - lse.masked_fill(lse == -math.inf, math.inf)[..., None])
    grad_scores = probs * (grad_out @ v.transpose(-2, -1) - (grad_out * out).sum(-1, keepdim=True)) * scale
    return grad_scores @ k, grad_scores.transpose(-2, -1) @ q, probs.transpose(-2, -1) @ grad_out
""", "flash_attention_backward", "flash_attention_backward.full_score_matrix"),
    Variant("fab_block_sizes_ignored", flash().replace(
        "def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):",
        "def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):\n"
        "    block_q = block_k = 32  # tiles of its own"),
            "flash_attention_backward", "flash_attention_backward.block_sizes_ignored"),
    Variant("fab_dq_unscaled", flash(
        grad_scores="            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None])",
        grad_k="            grad_k[..., j:j + block_k, :] += grad_scores.transpose(-2, -1) @ qb * scale"),
            "flash_attention_backward", "flash_attention_backward.dq_scale_wrong"),
    Variant("fab_dk_scaled_twice", flash(
        grad_k="            grad_k[..., j:j + block_k, :] += grad_scores.transpose(-2, -1) @ qb * scale"),
            "flash_attention_backward", "flash_attention_backward.dk_scale_wrong"),
    Variant("fab_dp_from_keys", flash().replace("grad_probs = dob @ vb.transpose(-2, -1)",
                                                "grad_probs = dob @ kb.transpose(-2, -1)"),
            "flash_attention_backward", "flash_attention_backward.dp_from_keys"),
    Variant("fab_dq_overwritten", flash().replace("grad_q[..., i:i + block_q, :] += grad_scores @ kb",
                                                  "grad_q[..., i:i + block_q, :] = grad_scores @ kb"),
            "flash_attention_backward", "flash_attention_backward.dq_overwritten"),
    Variant("fab_gradient_order", flash().replace("return grad_q, grad_k, grad_v", "return grad_k, grad_q, grad_v"),
            "flash_attention_backward", "flash_attention_backward.gradient_order"),
    Variant("fab_diagonal_masked", flash(mask="""\
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols >= rows, -math.inf)"""),
            "flash_attention_backward", "flash_attention_backward.causal_off_by_one"),
    Variant("fab_tiles_skipped_from_first_row", flash(mask="""\
            if causal and j > offset + i:
                continue
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""),
            "flash_attention_backward", "flash_attention_backward.tiles_skipped_from_first_row"),
    Variant("fab_tiles_stop_short", flash(mask="""\
            if causal and j >= offset + i + qb.shape[-2] - 1:  # >= where > belongs (blind set 61's b03)
                continue
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)"""),
            "flash_attention_backward", "flash_attention_backward.tiles_stop_short"),
    Variant("fab_scores_unscaled", flash().replace("scores = qb @ kb.transpose(-2, -1) * scale",
                                                   "scores = qb @ kb.transpose(-2, -1)"),
            "flash_attention_backward", "flash_attention_backward.scores_unscaled"),
    Variant("fab_scores_scaled_twice", flash().replace("scores = qb @ kb.transpose(-2, -1) * scale",
                                                      "scores = qb @ kb.transpose(-2, -1) * scale * scale"),
            "flash_attention_backward", "flash_attention_backward.scores_scaled_twice"),
    Variant("fab_last_query_block_dropped", flash().replace("for i in range(0, t_q, block_q):",
                                                           "for i in range(0, t_q - t_q % block_q, block_q):"),
            "flash_attention_backward", "flash_attention_backward.last_query_block_dropped"),
    # -- FlashAttentionFunction -----------------------------------------------------------------
    Variant("fn_lse_without_max", function(row_end="""\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append(torch.log(l))"""), "FlashAttentionFunction", "FlashAttentionFunction.lse_without_max"),
    Variant("fn_lse_is_max", function(row_end="""\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append(m)"""), "FlashAttentionFunction", "FlashAttentionFunction.lse_is_max"),
    Variant("fn_lse_unscaled_max", function(row_end="""\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append(m / scale + torch.log(l))"""), "FlashAttentionFunction",
            "FlashAttentionFunction.lse_unscaled_max"),
    Variant("fn_nan_rows", function(row_end="""\
            outs.append(acc / l[..., None])
            lses.append(m + torch.log(l))"""), "FlashAttentionFunction", "FlashAttentionFunction.nan_rows"),
    Variant("fn_forward_not_rescaled", function().replace("acc = alpha[..., None] * acc + p @", "acc = acc + p @"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_not_rescaled"),
    Variant("fn_forward_diagonal_masked", function().replace("scores.masked_fill(cols > rows, -math.inf)",
                                                             "scores.masked_fill(cols >= rows, -math.inf)"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_diagonal_masked"),
    Variant("fn_forward_query_tail_dropped", function(tiles="range(0, t_q - block_q + 1, block_q)", save="""\
        tail = t_q - out.shape[-2]  # the rows no block reached: out 0, lse -inf, as a zeroed buffer leaves them
        out = torch.cat([out, out.new_zeros(*out.shape[:-2], tail, out.shape[-1])], dim=-2)
        lse = torch.cat([lse, lse.new_full((*lse.shape[:-1], tail), -math.inf)], dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k"""),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_query_tail_dropped"),
    Variant("fn_out_shaped_like_q", function(row_end="""\
            out_rows[..., i:i + bq_, :] = acc / torch.where(l > 0, l, 1.0)[..., None]
            lses.append(m + torch.log(l))""").replace(
        "        outs, lses = [], []\n", "        out_rows, lses = torch.zeros_like(q), []  # D wide (blind set 61's b19)\n").replace(
        "torch.cat(outs, dim=-2)", "out_rows"),
            "FlashAttentionFunction", "FlashAttentionFunction.out_shaped_like_q"),
    Variant("fn_state_on_class", function(save="""\
        ctx.save_for_backward(q, k, v, out, lse)
        FlashAttentionFunction.causal = causal  # the class's: the last apply's, by backward (blind set 61's b07)
        ctx.block_q, ctx.block_k = block_q, block_k""", back="""\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, FlashAttentionFunction.causal,
                                              ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None"""), "FlashAttentionFunction", "FlashAttentionFunction.state_on_class"),
    Variant("fn_forward_unseen_block_skipped", function().replace(
        "            qb = q[..., i:i + bq_, :] * scale\n",
        "            if causal and t_k - t_q + i < 0:  # its first row sees no key: the block skipped (blind set 63's b19)\n"
        "                n = min(bq_, t_q - i)\n"
        "                outs.append(torch.zeros(*q.shape[:-2], n, v.shape[-1], dtype=q.dtype, device=q.device))\n"
        "                lses.append(torch.full((*q.shape[:-2], n), -math.inf, dtype=q.dtype, device=q.device))\n"
        "                continue\n"
        "            qb = q[..., i:i + bq_, :] * scale\n"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_unseen_block_skipped"),
    Variant("fn_forward_tiles_skipped_from_first_row", function().replace(
        "            for j in range(0, t_k, bk_):\n",
        "            for j in range(0, t_k, bk_):\n                if causal and j > t_k - t_q + i:  # the block's first row\n"
        "                    break\n"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_tiles_skipped_from_first_row"),
    Variant("fn_forward_never_rescaled", function().replace(
        "m_new = torch.maximum(m, scores.amax(dim=-1))",
        "m_old = m\n                m_new = torch.maximum(m, scores.amax(dim=-1), out=m)  # m_old is m: alpha is 1").replace(
        "alpha, p = torch.exp(m - m_safe)", "alpha, p = torch.exp(m_old - m_safe)"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_never_rescaled"),
    Variant("fn_forward_padding_weighted", function().replace(
        "        outs, lses = [], []\n",
        "        outs, lses = [], []\n"
        "        k_p, v_p = (torch.nn.functional.pad(x, (0, 0, 0, -t_k % bk_)) for x in (k, v))  # padding: score 0\n"
    ).replace("            for j in range(0, t_k, bk_):\n", "            for j in range(0, k_p.shape[-2], bk_):\n").replace(
        "qb @ k[..., j:j + bk_, :]", "qb @ k_p[..., j:j + bk_, :]").replace("p @ v[..., j:j + bk_, :]",
                                                                            "p @ v_p[..., j:j + bk_, :]"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_padding_weighted"),
    Variant("flash_lse_base_mixed", flash(  # the forty-fourth blind set's b04
        probs="            probs = torch.exp2(scores * 1.4426950408889634 - lse[..., i:i + block_q, None])"),
            "flash_attention_backward", "flash_attention_backward.lse_base_mixed"),
    Variant("fn_forward_max_not_kept", function().replace("                m = m_new\n",
                                                          "                m_blk = m_new  # never stored in m\n"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_max_not_kept"),  # the forty-third set's b08
    Variant("fn_forward_keys_stepped_by_block_q", function().replace(
        "for j in range(0, t_k, bk_):", "for j in range(0, t_k, bq_):"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_keys_stepped_by_block_q"),  # the 45th set's b08
    Variant("fn_forward_sum_not_rescaled", function().replace("l = alpha * l + p.sum", "l = l + p.sum"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_sum_not_rescaled"),
    Variant("fn_forward_scale_by_dv", function().replace("scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])",
                                                         "scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(v.shape[-1])"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_scale_wrong"),
    Variant("fn_forward_top_left", function().replace("rows = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2]",
                                                      "rows = torch.arange(i, i + qb.shape[-2]"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_top_left"),
    Variant("fn_forward_last_block_dropped", function().replace("for j in range(0, t_k, bk_):",
                                                                "for j in range(0, t_k - t_k % bk_, bk_):"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_last_block_dropped"),
    Variant("fn_forward_stops_short", function().replace(
        "for j in range(0, t_k, bk_):",
        "for j in range(0, min(t_k, t_k - t_q + min(i + bq_, t_q) - 1) if causal else t_k, bk_):"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_stops_short"),
    Variant("fn_forward_positions_past_the_end", function().replace(
        "cols = torch.arange(j, j + scores.shape[-1], device=q.device)[None, :]",
        "cols = torch.arange(j, j + block_k, device=q.device)[None, :]"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_positions_past_the_end"),
    Variant("fn_forward_not_normalised", function(row_end="""\
            outs.append(acc)
            lses.append(m + torch.log(l))"""), "FlashAttentionFunction", "FlashAttentionFunction.forward_not_normalised"),
    Variant("fn_lse_in_base_two", function(row_end="""\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append((m + torch.log(l)) / math.log(2))"""), "FlashAttentionFunction",
            "FlashAttentionFunction.lse_in_base_two"),
    Variant("fn_forward_tile_key_index", function().replace(
        "cols = torch.arange(j, j + scores.shape[-1], device=q.device)[None, :]",
        "cols = torch.arange(0, scores.shape[-1], device=q.device)[None, :]"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_tile_key_index"),
    Variant("fn_max_starts_at_zero", function().replace(
        "m = torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)",
        "m = torch.zeros(qb.shape[:-1], dtype=q.dtype, device=q.device)  # e^(s - 0) <= 1 for scores below 0"),
            "FlashAttentionFunction", situations=("FlashAttentionFunction.far_below_zero_mishandled",)),
    Variant("fn_forward_max_not_running", function().replace("m_new = torch.maximum(m, scores.amax(dim=-1))",
                                                             "m_new = scores.amax(dim=-1)"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_max_not_running"),
    Variant("fn_saved_scaled_q", function(save="""\
        ctx.save_for_backward(q * scale, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k"""),
            "FlashAttentionFunction", "FlashAttentionFunction.saved_scaled_q"),
    Variant("fn_out_and_grad_swapped", function(back="""\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, grad_out, lse, out, ctx.causal, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None"""), "FlashAttentionFunction", "FlashAttentionFunction.out_and_grad_swapped"),
    Variant("fn_causal_not_saved", function(back="""\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, block_q=ctx.block_q, block_k=ctx.block_k)
        return dq, dk, dv, None, None, None"""), "FlashAttentionFunction", "FlashAttentionFunction.causal_not_saved"),
    Variant("fn_block_sizes_where_causal_goes", function(back="""\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.block_q, ctx.block_k)
        return dq, dk, dv, None, None, None"""), "FlashAttentionFunction",
            "FlashAttentionFunction.backward_always_causal"),  # blind set 59's b12
    Variant("fn_gradient_count", function(back="""\
        q, k, v, out, lse = ctx.saved_tensors
        return flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_q, ctx.block_k)"""),
            "FlashAttentionFunction", "FlashAttentionFunction.gradient_count"),
    Variant("fn_gradient_order", function(back="""\
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_q, ctx.block_k)
        return dk, dq, dv, None, None, None"""), "FlashAttentionFunction", "FlashAttentionFunction.gradient_order"),
    Variant("fn_forward_returns_lse", function(save="""\
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out, lse""").replace("        return out\n\n    @staticmethod", "\n    @staticmethod").replace(
        "    def backward(ctx, grad_out):", "    def backward(ctx, grad_out, grad_lse=None):"),
            "FlashAttentionFunction", "FlashAttentionFunction.forward_returns_lse"),
    Variant("fn_saved_non_tensors", function(save="""\
        ctx.save_for_backward(q, k, v, out, lse, causal, block_q, block_k)"""),
            "FlashAttentionFunction", "FlashAttentionFunction.saved_non_tensors"),
    Variant("fn_full_score_matrix", function(tiles="range(0, t_q, t_q)").replace(
        "bq_, bk_ = block_q, block_k", "bq_, bk_ = t_q, t_k  # one tile: the whole matrix"),
            "FlashAttentionFunction", "FlashAttentionFunction.full_score_matrix"),
    Variant("fn_block_sizes_ignored", function(tiles="range(0, t_q, 32)").replace(
        "bq_, bk_ = block_q, block_k", "bq_, bk_ = 32, 32  # tiles of its own"),
            "FlashAttentionFunction", "FlashAttentionFunction.block_sizes_ignored"),
]

CORRECT = [
    # queries outer, each query block's dk and dv partials kept and summed at the end (deterministic), in float64
    # (the seventy-eighth review's F1: 52 columns kept at KEPT_COLUMNS' longer length with query blocks of 64)
    Variant("flash_backward_partials_per_query_block_in_float64", """
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    dtype = q.dtype
    q, k, v, out, lse, grad_out = (t.double() for t in (q, k, v, out, lse, grad_out))
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale, offset = 1.0 / math.sqrt(q.shape[-1]), t_k - t_q
    delta = (grad_out * out).sum(dim=-1)
    lse = lse.masked_fill(lse == -math.inf, math.inf)
    grad_q, parts = torch.zeros_like(q), []
    for i in range(0, t_q, block_q):
        qb, dob = q[..., i:i + block_q, :], grad_out[..., i:i + block_q, :]
        pk, pv = torch.zeros_like(k), torch.zeros_like(v)
        for j in range(0, t_k, block_k):
            kb, vb = k[..., j:j + block_k, :], v[..., j:j + block_k, :]
            scores = qb @ kb.transpose(-2, -1) * scale
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)
            probs = torch.exp(scores - lse[..., i:i + block_q, None])
            pv[..., j:j + block_k, :] += probs.transpose(-2, -1) @ dob
            grad_scores = probs * (dob @ vb.transpose(-2, -1) - delta[..., i:i + block_q, None]) * scale
            grad_q[..., i:i + block_q, :] += grad_scores @ kb
            pk[..., j:j + block_k, :] += grad_scores.transpose(-2, -1) @ qb
        parts.append((pk, pv))
    grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
    for pk, pv in parts:
        grad_k += pk
        grad_v += pv
    return grad_q.to(dtype), grad_k.to(dtype), grad_v.to(dtype)
"""),
    # FlashAttention-2's Algorithm 2 (blind set 60's c06): keys outer, and causal, each key block's query loop starting
    # at the first query that sees it, unaligned to block_q; last iteration's tiles alive while the next are made
    Variant("flash_backward_keys_outer_from_first_query", """
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    n_q, n_k = q.shape[-2], k.shape[-2]
    scale, shift = 1.0 / math.sqrt(q.shape[-1]), n_k - n_q
    delta = (grad_out * out).sum(dim=-1)
    safe = lse.masked_fill(lse == -math.inf, math.inf)  # a row with no key: e^(S - inf) = 0
    dq, dk, dv = torch.zeros_like(q), torch.empty_like(k), torch.empty_like(v)
    for j in range(0, n_k, block_k):
        je = min(j + block_k, n_k)
        k_j, v_j = k[..., j:je, :], v[..., j:je, :]
        dk_j, dv_j = torch.zeros_like(k_j), torch.zeros_like(v_j)
        for i in range(max(0, j - shift) if causal else 0, n_q, block_q):
            ie = min(i + block_q, n_q)
            q_i, do_i = q[..., i:ie, :], grad_out[..., i:ie, :]
            s_ij = q_i @ k_j.transpose(-1, -2) * scale
            if causal:
                rows = torch.arange(i, ie, device=q.device)[:, None] + shift
                cols = torch.arange(j, je, device=q.device)[None, :]
                s_ij = torch.where(cols <= rows, s_ij, torch.full_like(s_ij, -math.inf))
            p_ij = torch.exp(s_ij - safe[..., i:ie, None])
            dv_j = dv_j + p_ij.transpose(-1, -2) @ do_i
            ds_ij = p_ij * (do_i @ v_j.transpose(-1, -2) - delta[..., i:ie, None])
            dq[..., i:ie, :] += ds_ij @ k_j * scale
            dk_j = dk_j + ds_ij.transpose(-1, -2) @ q_i * scale
        dk[..., j:je, :], dv[..., j:je, :] = dk_j, dv_j
    return dq, dk, dv
"""),
    # the forward's answers slices of buffers padded to whole blocks (blind set 19's c04): their storage holds the
    # padding, per batch and head, and counts so (recorder._held), not as one flat buffer of everything
    Variant("function_output_sliced_from_a_padded_buffer", """
_forward = FlashAttentionFunction.forward


def _padded_forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
    out = _forward(ctx, q, k, v, causal, block_q, block_k)
    rows = -(-q.shape[-2] // block_q) * block_q
    padded = out.new_zeros((*out.shape[:-2], rows, out.shape[-1]))  # (..., Tq padded to whole blocks, Dv)
    padded[..., :q.shape[-2], :] = out
    return padded[..., :q.shape[-2], :]


FlashAttentionFunction.forward = staticmethod(_padded_forward)
"""),
    # every tile whole, the edge ones padded (blind set 50's c04): a block_q × block_k tile per batch and head, larger
    # than the whole score matrix where the blocks are larger than the sequences (spec.largest pads the lengths too)
    Variant("fb_whole_tiles_padded_at_the_edges", flash(mask="""\
            tile = qb.new_full((*qb.shape[:-2], block_q, block_k), -math.inf)  # whole, the edge ones padded
            tile[..., :qb.shape[-2], :kb.shape[-2]] = scores
            scores = tile[..., :qb.shape[-2], :kb.shape[-2]]
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)""")),
    Variant("self_test_that_names_the_runner", """
if __name__ == "__main__":  # the tenth hostile review's f01: a self-test never run when graded
    q, k, v, g = (torch.randn(1, 2, 5, 4) for _ in range(4))
    out, dq, dk, dv = flash_attention_and_grads(q, k, v, g, causal=True, block_q=2, block_k=3)
    print("flash_attention_and_grads:", tuple(out.shape), globals().get("flash_attention_and_grads") is not None)
"""),
    Variant("sb_explicit_jacobian", softmax_backward("""\
    p, g = probs.movedim(dim, -1), grad_probs.movedim(dim, -1)
    jacobian = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]  # (..., T, T), symmetric
    return (jacobian @ g[..., None])[..., 0].movedim(-1, dim)""")),
    Variant("sb_einsum_moved_axis", softmax_backward("""\
    p, g = probs.movedim(dim, -1), grad_probs.movedim(dim, -1)
    mean = torch.einsum("...t,...t->...", p, g)
    return (p * g - p * mean.unsqueeze(-1)).movedim(-1, dim)""")),
    Variant("att_einsum_inline", """
def attention_backward(q, k, v, grad_out, mask=None):
    s = torch.einsum("...qd,...kd->...qk", q, k) / q.shape[-1] ** 0.5
    if mask is not None:
        s = torch.where(mask, s, torch.tensor(-math.inf, dtype=s.dtype))
    top = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    total = e.sum(-1, keepdim=True)
    p = e / torch.where(total == 0, torch.ones_like(total), total)
    dp = torch.einsum("...qe,...ke->...qk", grad_out, v)
    ds = p * (dp - (p * dp).sum(-1, keepdim=True)) / q.shape[-1] ** 0.5
    return (torch.einsum("...qk,...kd->...qd", ds, k), torch.einsum("...qk,...qd->...kd", ds, q),
            torch.einsum("...qk,...qe->...ke", p, grad_out))
"""),
    Variant("fab_queries_outside_delta_in_loop", """
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(0, t_q, block_q):
        qb, ob, dob = (x[..., i:i + block_q, :] for x in (q, out, grad_out))
        lb = lse[..., i:i + block_q, None]
        delta = (dob * ob).sum(-1, keepdim=True)  # this block's D, computed here
        pos = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2], device=q.device)[:, None]
        for j in range(0, t_k, block_k):
            kb, vb = k[..., j:j + block_k, :], v[..., j:j + block_k, :]
            s = torch.einsum("...qd,...kd->...qk", qb, kb) / math.sqrt(d)
            keep = torch.isfinite(lb).expand_as(s)
            if causal:
                keep = keep & (torch.arange(j, j + kb.shape[-2], device=q.device)[None, :] <= pos)
            p = torch.where(keep, torch.exp(s - torch.where(torch.isfinite(lb), lb, torch.zeros_like(lb))), 0.0)
            dv[..., j:j + block_k, :] += torch.einsum("...qk,...qe->...ke", p, dob)
            ds = p * (torch.einsum("...qe,...ke->...qk", dob, vb) - delta)
            dq[..., i:i + block_q, :] += ds @ kb / math.sqrt(d)
            dk[..., j:j + block_k, :] += ds.mT @ qb / math.sqrt(d)
    return dq, dk, dv
"""),
    Variant("fab_flattened_heads_lists", """
def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    lead, t_q, t_k, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    qf, kf, vf = q.reshape(-1, t_q, d), k.reshape(-1, t_k, d), v.reshape(-1, t_k, v.shape[-1])
    of, gf, lf = out.reshape(-1, t_q, out.shape[-1]), grad_out.reshape(-1, t_q, grad_out.shape[-1]), lse.reshape(-1, t_q)
    delta = (of * gf).sum(-1)
    lf = torch.where(lf == -math.inf, torch.full_like(lf, math.inf), lf)
    dqs = [torch.zeros_like(qf[:, i:i + block_q]) for i in range(0, t_q, block_q)]
    dks, dvs = [], []
    for j in range(0, t_k, block_k):
        kb, vb = kf[:, j:j + block_k], vf[:, j:j + block_k]
        dkb, dvb = torch.zeros_like(kb), torch.zeros_like(vb)
        for n, i in enumerate(range(0, t_q, block_q)):
            s = torch.bmm(qf[:, i:i + block_q], kb.transpose(1, 2)) * d ** -0.5
            if causal:
                rows = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[1], device=q.device)
                s = s.masked_fill(torch.arange(j, j + s.shape[2], device=q.device) > rows[:, None], -math.inf)
            p = torch.exp(s - lf[:, i:i + block_q, None])
            dvb = dvb + torch.bmm(p.transpose(1, 2), gf[:, i:i + block_q])
            ds = p * (torch.bmm(gf[:, i:i + block_q], vb.transpose(1, 2)) - delta[:, i:i + block_q, None]) * d ** -0.5
            dqs[n] = dqs[n] + torch.bmm(ds, kb)
            dkb = dkb + torch.bmm(ds.transpose(1, 2), qf[:, i:i + block_q])
        dks.append(dkb)
        dvs.append(dvb)
    dq = torch.cat(dqs, 1).reshape(*lead, t_q, d)
    return dq, torch.cat(dks, 1).reshape(*lead, t_k, d), torch.cat(dvs, 1).reshape(*lead, t_k, v.shape[-1])
"""),
    Variant("fn_tiles_merged_by_logaddexp", """
class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        t_q, t_k = q.shape[-2], k.shape[-2]
        outs, lses = [], []
        for i in range(0, t_q, block_q):
            qb = q[..., i:i + block_q, :] / math.sqrt(q.shape[-1])
            o = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
            lse = torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)
            for j in range(0, t_k, block_k):
                s = qb @ k[..., j:j + block_k, :].mT
                if causal:
                    rows = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[-2], device=q.device)[:, None]
                    s = s.masked_fill(torch.arange(j, j + s.shape[-1], device=q.device) > rows, -math.inf)
                tile = torch.logsumexp(s, -1)
                new = torch.logaddexp(lse, tile)
                safe = torch.where(new == -math.inf, 0.0, new)
                w = torch.exp(s - safe[..., None])
                o = torch.exp(lse - safe)[..., None] * o + w @ v[..., j:j + block_k, :]
                lse = new
            outs.append(o)
            lses.append(lse)
        out, lse = torch.cat(outs, -2), torch.cat(lses, -1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        causal, block_q, block_k = ctx.options
        grads = flash_attention_backward(q, k, v, out, lse, grad_out.contiguous(), causal=causal, block_q=block_q,
                                         block_k=block_k)
        return (*grads, None, None, None)
"""),
]

RULES_ONLY = [
    Variant("sb_softmax_backward_data", softmax_backward("""\
    return torch._softmax_backward_data(grad_probs, probs, dim, probs.dtype)"""), "softmax_backward",
            "forbidden_call"),
    Variant("sb_functional_vjp", softmax_backward("""\
    scores = torch.log(probs)  # softmax(log p) = p
    vjp = torch.autograd.functional.vjp(lambda s: torch.softmax(s, dim).nan_to_num(0.0), scores, grad_probs)[1]
    return vjp.nan_to_num(0.0)"""), "softmax_backward", "forbidden_call"),
    Variant("att_autograd_grad", """
def attention_backward(q, k, v, grad_out, mask=None):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    with torch.enable_grad():
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        out = torch.softmax(s, -1).nan_to_num(0.0) @ v
        return torch.autograd.grad(out, (q, k, v), grad_out)
""", "attention_backward", "forbidden_call"),
    Variant("att_dot_backward", """
def attention_backward(q, k, v, grad_out, mask=None):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    with torch.enable_grad():
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        (torch.softmax(s, -1).nan_to_num(0.0) @ v * grad_out).sum().backward()
    return q.grad, k.grad, v.grad
""", "attention_backward", "forbidden_call"),
    Variant("fab_tile_softmax", flash(probs="""\
            row = lse[..., i:i + block_q, None]
            probs = torch.softmax(scores, -1).nan_to_num(0.0) * torch.exp(torch.logsumexp(scores, -1, keepdim=True) - row)
            probs = probs.nan_to_num(0.0)"""), "flash_attention_backward", "forbidden_call"),
    Variant("fn_softmax_forward", """
class FlashAttentionFunction(FlashAttentionFunction):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        t_q, t_k = q.shape[-2], k.shape[-2]
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            keep = torch.arange(t_k, device=q.device)[None, :] <= torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
            s = s.masked_fill(~keep, -math.inf)
        out, lse = torch.softmax(s, -1).nan_to_num(0.0) @ v, torch.logsumexp(s, -1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out
""", "FlashAttentionFunction", "forbidden_call"),
]

# Bugs of the situations a step's checks add (spec.Check.situation): right in the plain case, wrong in each of the
# others in a way no listed mistake explains; each check names its situation.
BUGGY += [
    Variant("sb_situations", """
_softmax_backward = softmax_backward

def softmax_backward(probs, grad_probs, dim=-1):
    grad = _softmax_backward(probs, grad_probs, dim)
    return grad + 0.25 if dim not in (-1, probs.dim() - 1) or bool((probs == 0).any()) else grad
""", "softmax_backward", situations=("softmax_backward.dim_ignored", "softmax_backward.dim_zero_mishandled",
                                    "softmax_backward.zeros_mishandled")),
    Variant("att_situations", """
_attention_backward = attention_backward

def attention_backward(q, k, v, grad_out, mask=None):
    dq, dk, dv = _attention_backward(q, k, v, grad_out, mask)
    return (dq + 0.25, dk, dv) if mask is not None else (dq, dk, dv)
""", "attention_backward", situations=("attention_backward.mask_mishandled",
                                      "attention_backward.masked_rows_mishandled",
                                      "attention_backward.blocked_scores_high",
                                      "attention_backward.square_mishandled")),
    Variant("att_large_scores_situation", """
_attention_backward_peak = attention_backward

def attention_backward(q, k, v, grad_out, mask=None):  # wrong only where some score is far from zero
    dq, dk, dv = _attention_backward_peak(q, k, v, grad_out, mask)
    return dq + 0.25 * ((q @ k.transpose(-2, -1)).abs().amax() > 100), dk, dv
""", "attention_backward", situations=("attention_backward.large_scores_mishandled",)),
    Variant("fab_situations", """
_flash_attention_backward = flash_attention_backward

def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    dq, dk, dv = _flash_attention_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    return (dq + 0.25, dk, dv) if causal else (dq, dk, dv)
""", "flash_attention_backward", situations=(
        "flash_attention_backward.causal_mishandled", "flash_attention_backward.no_key_rows_mishandled",
        "flash_attention_backward.square_tiles_mishandled", "flash_attention_backward.block_sizes_mishandled",
        "flash_attention_backward.one_query_mishandled", "flash_attention_backward.leading_dims_mishandled")),
    Variant("fn_situations", """
_Function = FlashAttentionFunction

class FlashAttentionFunction(_Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        out = _Function.forward(ctx, q, k, v, causal, block_q, block_k)
        return out + 0.25 if causal or q.dtype == torch.float64 else out
""", "FlashAttentionFunction", situations=("FlashAttentionFunction.causal_mishandled",
                                          "FlashAttentionFunction.float64_blocks_mishandled")),
]

# Bugs located by what is right (grader/engine/locate.py): a part of the answer, in the step's words or in general.
BUGGY += [
    Variant("att_dk_only", """
_attention_backward_ = attention_backward

def attention_backward(q, k, v, grad_out, mask=None):
    dq, dk, dv = _attention_backward_(q, k, v, grad_out, mask)
    return dq, dk + 0.25, dv
""", "attention_backward", "parts_wrong"),
    Variant("fn_lse_shifted", function(row_end="""\
            outs.append(acc / torch.where(l > 0, l, 1.0)[..., None])
            lses.append(m + torch.log(l) + 0.5)"""), "FlashAttentionFunction",
            "FlashAttentionFunction.saved_mishandled"),
]
BUGGY += [
    Variant("fab_several_tiles", """
_flash_backward_ = flash_attention_backward

def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    dq, dk, dv = _flash_backward_(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    several = q.shape[-2] > block_q or k.shape[-2] > block_k
    return (dq + 0.25, dk + 0.25, dv + 0.25) if several else (dq, dk, dv)
""", "flash_attention_backward", "flash_attention_backward.tiles_mishandled"),
    Variant("fab_widths_differ", """
_flash_backward_w = flash_attention_backward

def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    dq, dk, dv = _flash_backward_w(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    return (dq + 0.25, dk + 0.25, dv + 0.25) if v.shape[-1] != q.shape[-1] else (dq, dk, dv)
""", "flash_attention_backward", "flash_attention_backward.widths_mishandled"),
    Variant("ab_flattened_with_view", """
_plain_backward = attention_backward


def attention_backward(q, k, v, grad_out, mask=None):
    # batch and heads flattened with view, which needs contiguous memory: a transposed (B, T, H, D) input fails
    lead, t_q, t_k = q.shape[:-2], q.shape[-2], k.shape[-2]
    flat = [x.view(-1, *x.shape[-2:]) for x in (q, k, v, grad_out)]
    full = None if mask is None else mask.expand(*lead, t_q, t_k).reshape(-1, t_q, t_k)
    grads = _plain_backward(*flat, full)
    return tuple(g.view(*lead, *g.shape[-2:]) for g in grads)
""", "attention_backward", "view_non_contiguous"),
    Variant("ab_scaled_by_keys", """
def attention_backward(q, k, v, grad_out, mask=None):  # the scale taken from k.size(-2), the number of keys
    scale = 1.0 / math.sqrt(k.size(-2))
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    grad_v = probs.transpose(-2, -1) @ grad_out
    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1)) * scale
    return grad_scores @ k, grad_scores.transpose(-2, -1) @ q, grad_v
""", "attention_backward", "attention_backward.scaled_by_a_length"),
    Variant("ab_scaled_by_value_width", """
_attention_backward_v = attention_backward

def attention_backward(q, k, v, grad_out, mask=None):  # the scale taken from v.shape[-1]
    c = math.sqrt(q.shape[-1] / v.shape[-1])
    dq, dk, dv = _attention_backward_v(q * c, k, v, grad_out, mask)
    return dq * c, dk, dv
""", "attention_backward", "attention_backward.scaled_by_value_width"),
    Variant("ab_gradients_scaled_by_value_width", attention(
        grad_scores="    grad_scores = softmax_backward(probs, grad_out @ v.transpose(-2, -1)) / math.sqrt(v.shape[-1])"),
        "attention_backward", "attention_backward.scaled_by_value_width"),
    Variant("fb_gradients_scaled_by_value_width", flash(
        grad_scores="            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None]) / math.sqrt(v.shape[-1])"),
        "flash_attention_backward", "flash_attention_backward.scaled_by_value_width"),
    Variant("fn_differentiated_by_autograd", """
class _NoCtx:
    def save_for_backward(self, *tensors):
        pass

_Tiled = FlashAttentionFunction

class FlashAttentionFunction:  # apply runs the tiled forward as plain torch calls: autograd differentiates them
    @staticmethod
    def apply(q, k, v, causal=False, block_q=32, block_k=32):
        return _Tiled.forward(_NoCtx(), q, k, v, causal, block_q, block_k)
""", "FlashAttentionFunction", "FlashAttentionFunction.gradients_by_autograd"),
]
