"""Candidates for `local_attention` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant


def mask(body: str) -> str:
    """A sliding_window_mask with p (t_q, 1) and j (1, t_k) as the reference makes them, returning `body`."""
    return f"""
def sliding_window_mask(t_q, t_k, window, device=None):
    p = torch.arange(t_k - t_q, t_k, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return {body}
"""


def slopes(body: str) -> str:
    """An alibi_slopes with powers(n) = [2^(-8h/n) for h = 1 .. n] and p, the largest power of two <= H, computing `body`."""
    return f"""
def alibi_slopes(num_heads):
    def powers(n):
        return [2 ** (-8 * h / n) for h in range(1, n + 1)]
    p = 2 ** int(math.floor(math.log2(num_heads)))
{body}
"""


def bias(body: str) -> str:
    """An alibi_bias with p (t_q, 1) and j (1, t_k) on the slopes' device, returning `body`."""
    return f"""
def alibi_bias(slopes, t_q, t_k):
    p = torch.arange(t_k - t_q, t_k, device=slopes.device)[:, None]
    j = torch.arange(t_k, device=slopes.device)[None, :]
    return {body}
"""


def attention(middle: str, end: str = "    return torch.softmax(scores, dim=-1) @ v") -> str:
    """A local_attention with Tq, Tk and the scaled scores, then `middle` (which masks them), then `end`."""
    return f"""
def local_attention(q, k, v, window=None, slopes=None):
    t_q, t_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
{middle}
{end}
"""


REFERENCE_MIDDLE = """\
    if slopes is not None:
        scores = scores + alibi_bias(slopes, t_q, t_k).to(scores.dtype)
    mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
    scores = scores.masked_fill(~mask, float("-inf"))"""


def inline_mask(condition: str) -> str:
    """local_attention's middle with the mask written inline: p (t_q, 1), j (1, t_k), w the window, mask = `condition`."""
    return f"""\
    if slopes is not None:
        scores = scores + alibi_bias(slopes, t_q, t_k).to(scores.dtype)
    p = torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
    j = torch.arange(t_k, device=q.device)[None, :]
    w = t_k if window is None else window
    scores = scores.masked_fill(~({condition}), float("-inf"))"""


BUGGY = [
    # -- sliding_window_mask --------------------------------------------------------------
    Variant("mask_window_plus_one", mask("(j <= p) & (j >= p - window)"), "sliding_window_mask", "sliding_window_mask.window_plus_one"),
    Variant("mask_triu_off_by_one",  # the two triangles, the far edge one diagonal too low
            "def sliding_window_mask(t_q, t_k, window, device=None):\n"
            "    ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)\n"
            "    return ones.tril(diagonal=t_k - t_q) & ones.triu(diagonal=t_k - t_q - window)",
            "sliding_window_mask", "sliding_window_mask.window_plus_one"),
    Variant("mask_window_minus_one", mask("(j <= p) & (j > p - window + 1)"), "sliding_window_mask",
            "sliding_window_mask.window_minus_one"),
    Variant("mask_bidirectional", mask("(p - j).abs() <= window"), "sliding_window_mask", "sliding_window_mask.bidirectional"),
    Variant("mask_not_causal", mask("j > p - window"), "sliding_window_mask", "sliding_window_mask.not_causal"),
    Variant("mask_top_left",
            "def sliding_window_mask(t_q, t_k, window, device=None):\n"
            "    i = torch.arange(t_q, device=device)[:, None]\n"
            "    j = torch.arange(t_k, device=device)[None, :]\n"
            "    return (j <= i) & (j > i - window)", "sliding_window_mask", "sliding_window_mask.top_left"),
    Variant("mask_inverted", mask("(j > p) | (j <= p - window)"), "sliding_window_mask", "sliding_window_mask.inverted"),
    Variant("mask_float", mask("((j <= p) & (j > p - window)).float()"), "sliding_window_mask", "mask_not_bool"),
    # -- alibi_slopes ---------------------------------------------------------------------
    Variant("slopes_direct_formula",  # right for 8 heads, not for 12 (mlx issue 343)
            "def alibi_slopes(num_heads):\n"
            "    h = torch.arange(1, num_heads + 1, dtype=torch.float32)\n"
            "    return 2 ** (-8 * h / num_heads)", "alibi_slopes", "alibi_slopes.non_power_of_two_formula"),
    Variant("slopes_from_zero",
            "def alibi_slopes(num_heads):\n"
            "    p = 2 ** int(math.floor(math.log2(num_heads)))\n"
            "    powers = lambda n: [2 ** (-8 * h / n) for h in range(n)]\n"
            "    return torch.tensor(powers(p) + powers(2 * p)[0::2][:num_heads - p])", "alibi_slopes", "alibi_slopes.from_zero"),
    Variant("slopes_extra_first", slopes("    return torch.tensor(powers(2 * p)[0::2][:num_heads - p] + powers(p))"),
            "alibi_slopes", "alibi_slopes.extra_first"),
    Variant("slopes_consecutive_extra", slopes("    return torch.tensor(powers(p) + powers(2 * p)[:num_heads - p])"),
            "alibi_slopes", "alibi_slopes.consecutive_extra"),
    Variant("slopes_repeated_extra", slopes("    return torch.tensor(powers(p) + powers(2 * p)[1::2][:num_heads - p])"),
            "alibi_slopes", "alibi_slopes.repeated_extra"),
    Variant("slopes_float64", slopes("    return torch.tensor(powers(p) + powers(2 * p)[0::2][:num_heads - p], dtype=torch.float64)"),
            "alibi_slopes", "dtype_promoted"),
    # -- alibi_bias -----------------------------------------------------------------------
    Variant("bias_wrong_sign", bias("slopes[:, None, None] * (p - j)"), "alibi_bias", "alibi_bias.wrong_sign"),
    Variant("bias_key_minus_query", bias("-slopes[:, None, None] * (j - p)"), "alibi_bias", "alibi_bias.wrong_sign"),
    Variant("bias_top_left",
            "def alibi_bias(slopes, t_q, t_k):\n"
            "    distance = torch.arange(t_q)[:, None] - torch.arange(t_k)[None, :]\n"
            "    return -slopes[:, None, None] * distance.to(slopes.device)", "alibi_bias", "alibi_bias.top_left"),
    Variant("bias_bloom_form",  # BLOOM builds slope·j: right inside attention, but not the contract's bias
            "def alibi_bias(slopes, t_q, t_k):\n"
            "    j = torch.arange(t_k, device=slopes.device, dtype=torch.float32)\n"
            "    return (slopes[:, None, None] * j).expand(-1, t_q, -1)", "alibi_bias", "alibi_bias.shifted_per_row"),
    Variant("bias_from_last_key",  # relative to the last key only: right in the last row, shifted in the others
            "def alibi_bias(slopes, t_q, t_k):\n"
            "    dist = (t_k - 1) - torch.arange(t_k, device=slopes.device, dtype=torch.float32)\n"
            "    return (-slopes[:, None, None] * dist).expand(-1, t_q, -1)", "alibi_bias", "alibi_bias.shifted_per_row"),
    Variant("bias_four_dims", bias("-slopes.view(1, -1, 1, 1) * (p - j)"), "alibi_bias", "axis_extra"),
    # -- local_attention ------------------------------------------------------------------
    Variant("attention_window_plus_one", attention(inline_mask("(j <= p) & (j >= p - w)")),
            "local_attention", "local_attention.window_plus_one"),
    Variant("attention_bidirectional", attention(inline_mask("(p - j).abs() <= w")), "local_attention", "local_attention.bidirectional"),
    Variant("attention_top_left", attention(inline_mask("(j <= p - t_k + t_q) & (j > p - t_k + t_q - w)")),
            "local_attention", "local_attention.top_left"),
    Variant("attention_causal_only_with_window", attention("""\
    if slopes is not None:
        scores = scores + alibi_bias(slopes, t_q, t_k).to(scores.dtype)
    if window is not None:
        scores = scores.masked_fill(~sliding_window_mask(t_q, t_k, window, device=q.device), float("-inf"))"""),
            "local_attention", "local_attention.not_causal"),
    Variant("attention_bias_sign", attention(REFERENCE_MIDDLE.replace("scores + alibi_bias", "scores - alibi_bias")),
            "local_attention", "local_attention.bias_sign"),
    Variant("attention_bias_after_softmax", attention("""\
    mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    if slopes is not None:
        weights = weights + alibi_bias(slopes, t_q, t_k).to(weights.dtype)""", "    return weights @ v"),
            "local_attention", "local_attention.bias_after_softmax"),
    Variant("attention_masked_bias_after_softmax",  # the bias kept to the allowed keys, but added to the weights
            attention("""\
    allowed = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
    weights = torch.softmax(torch.where(allowed, scores, float("-inf")), dim=-1)
    if slopes is not None:
        weights = weights + torch.where(allowed, alibi_bias(slopes, t_q, t_k).to(weights.dtype), 0.0)""", "    return weights @ v"),
            "local_attention", "local_attention.bias_after_softmax"),
    Variant("attention_causal_bias_after_softmax",  # the bias cut to the causal triangle, added to the weights
            attention("""\
    mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    if slopes is not None:
        weights = weights + alibi_bias(slopes, t_q, t_k).to(weights.dtype).tril(t_k - t_q)""", "    return weights @ v"),
            "local_attention", "local_attention.bias_after_softmax"),
    Variant("attention_bias_on_scores_and_weights",  # the bias on the scores, then on the weights again
            attention(REFERENCE_MIDDLE, """\
    weights = torch.softmax(scores, dim=-1)
    if slopes is not None:
        weights = weights + alibi_bias(slopes, t_q, t_k).to(weights.dtype).tril(t_k - t_q)
    return weights @ v"""), "local_attention", "local_attention.bias_added_twice"),
    Variant("attention_scaled_by_key_length", attention(REFERENCE_MIDDLE).replace(
        " / math.sqrt(q.shape[-1])", " / math.sqrt(k.shape[-2])"), "local_attention", "scaled_by_wrong_size"),
    Variant("mask_points_forward", mask("(j >= p) & (j < p + window)"), "sliding_window_mask",
            "sliding_window_mask.points_forward"),
    Variant("attention_unscaled", attention(REFERENCE_MIDDLE).replace(" / math.sqrt(q.shape[-1])", ""),
            "local_attention", "local_attention.unscaled"),
    Variant("attention_window_defaults_to_tq",  # "no window" taken as a window over this call's queries
            attention(REFERENCE_MIDDLE.replace("t_k if window is None else window", "t_q if window is None else window")),
            "local_attention", "local_attention.window_defaults_to_tq"),
    Variant("attention_bias_scaled",  # one division for both: (q @ kᵀ + bias) / √D
            attention(REFERENCE_MIDDLE.replace("    mask =", "    scores = scores / math.sqrt(q.shape[-1])\n    mask =", 1))
            .replace("scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])", "scores = q @ k.transpose(-2, -1)"),
            "local_attention", "local_attention.bias_scaled"),
    Variant("attention_bias_not_cast",  # the float32 bias promotes half-precision scores, which then meet half v
            attention(REFERENCE_MIDDLE.replace("alibi_bias(slopes, t_q, t_k).to(scores.dtype)", "alibi_bias(slopes, t_q, t_k)")),
            "local_attention", "dtype_mismatch"),
    Variant("attention_returns_weights", attention(REFERENCE_MIDDLE, """\
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights"""), "local_attention"),
    # -- found by the search (grader/engine/search.py), new names --------------------------
    Variant("local_window_none_as_zero", """
_local_reference = local_attention


def local_attention(q, k, v, window=None, slopes=None):
    return _local_reference(q, k, v, window or 0, slopes)
""", "local_attention", "none_read_as_zero"),
    Variant("local_window_minus_one", """
_local_reference = local_attention


def local_attention(q, k, v, window=None, slopes=None):
    return _local_reference(q, k, v, None if window is None else window - 1, slopes)
""", "local_attention", "off_by_one"),
    Variant("local_slopes_ignored", """
_local_reference = local_attention


def local_attention(q, k, v, window=None, slopes=None):
    return _local_reference(q, k, v, window)
""", "local_attention", "argument_ignored"),
    Variant("slopes_next_power_of_two", """
def alibi_slopes(num_heads):
    p = 2 ** math.ceil(math.log2(num_heads))
    return torch.tensor([2 ** (-8 * h / p) for h in range(1, p + 1)][:num_heads], dtype=torch.float32)
""", "alibi_slopes", "alibi_slopes.next_power_of_two"),
    Variant("local_window_ignored_with_slopes", """
def local_attention(q, k, v, window=None, slopes=None):
    t_q, t_k = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if slopes is not None:  # ALiBi alone, the window forgotten (named by the probe: window changes nothing)
        scores = scores + alibi_bias(slopes, t_q, t_k).to(scores.dtype)
    else:
        mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
""", "local_attention", "argument_ignored"),
]

RULES_ONLY = [
    Variant("attention_sdpa", """
import torch.nn.functional as F

def local_attention(q, k, v, window=None, slopes=None):
    t_q, t_k = q.shape[-2], k.shape[-2]
    mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
    bias = torch.zeros(t_q, t_k, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    if slopes is not None:
        bias = bias + alibi_bias(slopes, t_q, t_k).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
""", "local_attention", "forbidden_call"),
]

CORRECT = [
    Variant(
        "bias_in_q_dtype",  # ALiBi's bias computed here in q's dtype (float64 for float64 inputs), not alibi_bias's float32
        """
        def local_attention(q, k, v, window=None, slopes=None):
            t_q, t_k = q.shape[-2], k.shape[-2]
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if slopes is not None:
                p = torch.arange(t_k - t_q, t_k, device=q.device, dtype=q.dtype)[:, None]
                j = torch.arange(t_k, device=q.device, dtype=q.dtype)[None, :]
                scores = scores - slopes.to(q.dtype)[:, None, None] * (p - j)
            mask = sliding_window_mask(t_q, t_k, t_k if window is None else window, device=q.device)
            scores = scores.masked_fill(~mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v
        """,
    ),
    Variant(
        "two_triangles",  # the mask as the difference of two triangles, the window clamped to the keys
        """
        def sliding_window_mask(t_q, t_k, window, device=None):
            window = min(window, t_k)
            ones = torch.ones(t_q, t_k, dtype=torch.bool, device=device)
            return ones.tril(diagonal=t_k - t_q) & ~ones.tril(diagonal=t_k - t_q - window)
        """,
    ),
    Variant(
        "geometric_slopes",  # the paper's own start·ratio^i, in torch, recursively for the extra slopes
        """
        def alibi_slopes(num_heads):
            def power_of_2(n):
                start = 2 ** (-(2 ** -(math.log2(n) - 3)))
                return start * start ** torch.arange(n, dtype=torch.float64)
            if math.log2(num_heads).is_integer():
                return power_of_2(num_heads).float()
            p = 2 ** math.floor(math.log2(num_heads))
            return torch.cat([power_of_2(p), alibi_slopes(2 * p).double()[0::2][: num_heads - p]]).float()
        """,
    ),
    Variant(
        "bias_absolute_distance",  # -slope·|p - j|: the same at or before the query, different after it (not graded)
        """
        def alibi_bias(slopes, t_q, t_k):
            p = torch.arange(t_k - t_q, t_k, device=slopes.device, dtype=torch.float32)[:, None]
            j = torch.arange(t_k, device=slopes.device, dtype=torch.float32)
            return -(p - j).abs() * slopes.float().view(-1, 1, 1)
        """,
    ),
    Variant(
        "bias_with_the_causal_mask",  # the future already -inf in the bias (not graded there)
        """
        def alibi_bias(slopes, t_q, t_k):
            p = torch.arange(t_k - t_q, t_k, device=slopes.device)[:, None]
            j = torch.arange(t_k, device=slopes.device)[None, :]
            b = -slopes.float()[:, None, None] * (p - j)
            return b.masked_fill(j > p, float("-inf"))
        """,
    ),
    Variant(
        "bloom_bias_in_attention",  # BLOOM's slope·j, shifted by slope·p per row: the softmax cannot tell; einsum, at least float32 inside
        """
        def local_attention(q, k, v, window=None, slopes=None):
            t_q, t_k = q.shape[-2], k.shape[-2]
            dt = torch.promote_types(q.dtype, torch.float32)
            s = torch.einsum("bhqd,bhkd->bhqk", q.to(dt), k.to(dt)) * q.shape[-1] ** -0.5
            if slopes is not None:
                s = s + slopes.to(dt).view(-1, 1, 1) * torch.arange(t_k, device=q.device, dtype=dt)
            w = t_k if window is None else window
            p = torch.arange(t_k - t_q, t_k, device=q.device)[:, None]
            j = torch.arange(t_k, device=q.device)
            s = torch.where((j <= p) & (p - j < w), s, float("-inf"))
            out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v.to(dt))
            return out.to(q.dtype)
        """,
    ),
]
