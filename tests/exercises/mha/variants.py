"""Candidates made from the reference by redefining one thing: Python keeps a file's last definition.

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    name: str
    code: str
    step: str | None = None  # the step that must lose points (buggy variants)
    mistake: str | None = None  # the named mistake it must show
    # more it must show in the same step, each in its own check: a bug of several situations (spec.Check.situation)
    situations: tuple[str, ...] = ()

    @property
    def shows(self) -> tuple[str, ...]:
        return ((self.mistake,) if self.mistake else ()) + self.situations

    def __str__(self) -> str:
        return self.name


def module_with(body: str, value_default: str = "key") -> str:
    """A MultiHeadAttention whose forward is the reference's with `body` in place of the middle."""
    return f"""
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = {value_default} if value is None else value
        H, Dh = self.num_heads, self.head_dim
        q = split_heads(project(query, self.w_q.weight, self.w_q.bias), H)
        k = split_heads(project(key, self.w_k.weight, self.w_k.bias), H)
        v = split_heads(project(value, self.w_v.weight, self.w_v.bias), H)
{body}
"""


REFERENCE_MIDDLE = """\
        att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))
        y = merge_heads(weighted_sum(att, v))
        return project(y, self.w_o.weight, self.w_o.bias)"""

BUGGY = [
    Variant("project_no_bias", "def project(x, weight, bias=None):\n    return x @ weight.T", "project", "project.no_bias"),
    Variant(
        "project_weight_not_transposed",
        "def project(x, weight, bias=None):\n    y = x @ weight\n    return y if bias is None else y + bias",
        "project", "project.weight_not_transposed",
    ),
    Variant(
        "split_heads_view_no_transpose",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.reshape(B, num_heads, T, D // num_heads)",
        "split_heads", "split_heads.view_no_transpose",
    ),
    Variant(
        "split_heads_no_transpose",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.reshape(B, T, num_heads, D // num_heads)",
        "split_heads", "split_heads.no_transpose",
    ),
    Variant(
        "split_heads_interleaved",
        "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
        "    return x.reshape(B, T, D // num_heads, num_heads).permute(0, 3, 1, 2)",
        "split_heads", "split_heads.interleaved",
    ),
    Variant(
        "attention_scores_transposed",
        "def attention_scores(q, k):\n    return k @ q.transpose(-2, -1)",
        "attention_scores", "attention_scores.transposed",
    ),
    Variant(
        "scale_scores_multiplied",
        "def scale_scores(scores, head_dim):\n    return scores / head_dim ** -0.5",
        "scale_scores", "scale_scores.multiplied",
    ),
    Variant(
        "scale_scores_by_head_dim",
        "def scale_scores(scores, head_dim):\n    return scores / head_dim",
        "scale_scores", "scale_scores.by_head_dim",
    ),
    Variant(
        "scale_scores_unscaled", "def scale_scores(scores, head_dim):\n    return scores", "scale_scores",
        "scale_scores.unscaled",
    ),
    Variant(
        "scale_scores_upcast",
        "def scale_scores(scores, head_dim):\n    return scores.double() / math.sqrt(head_dim)",
        "scale_scores", "dtype_promoted",
    ),
    Variant(
        "apply_mask_none_unhandled",
        "def apply_mask(scores, mask):\n    return scores.masked_fill(~mask, float('-inf'))",
        "apply_mask", "none_unhandled",
    ),
    Variant(
        "apply_mask_selects_allowed",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores[mask.expand_as(scores)]",
        "apply_mask",
    ),
    Variant(
        "apply_mask_inverted",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores.masked_fill(mask, float('-inf'))",
        "apply_mask", "apply_mask.inverted",
    ),
    Variant(
        "apply_mask_zero_fill",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores * mask",
        "apply_mask", "apply_mask.zero_fill",
    ),
    Variant(
        "apply_mask_additive_too_small",
        "def apply_mask(scores, mask):\n    return scores if mask is None else scores - 1000.0 * (~mask)",
        "apply_mask", "apply_mask.additive_too_small",
    ),
    Variant(
        "softmax_ignored_dim",
        "def softmax(scores, dim=-1):\n    m = scores.amax(-1, keepdim=True).clamp_min(-1e30)\n"
        "    e = torch.exp(scores - m)\n    return e / e.sum(-1, keepdim=True).clamp_min(1e-30)",
        "softmax", "softmax.ignored_dim",
    ),
    Variant(
        "softmax_whole_tensor",
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores)\n    return e / e.sum()",
        "softmax", "softmax.whole_tensor",
    ),
    Variant(
        "softmax_no_keepdim",
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores)\n    return e / e.sum(dim)",
        "softmax", "softmax.no_keepdim",
    ),
    Variant(
        "softmax_unstable",
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores)\n    return e / e.sum(dim, keepdim=True)",
        "softmax", "softmax.unstable",
    ),
    Variant(
        "softmax_nan_rows",
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(dim, keepdim=True))\n"
        "    return e / e.sum(dim, keepdim=True)",
        "softmax", "softmax.nan_rows",
    ),
    Variant(
        "weighted_sum_transposed",
        "def weighted_sum(weights, v):\n    return weights.transpose(-2, -1) @ v",
        "weighted_sum", "weighted_sum.transposed_weights",
    ),
    Variant(
        "merge_heads_no_transpose",
        "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.reshape(B, T, H * Dh)",
        "merge_heads", "merge_heads.no_transpose",
    ),
    Variant(
        "merge_heads_flatten_from_1",
        "def merge_heads(x):\n    return x.transpose(1, 2).flatten(1)",
        "merge_heads", "merge_heads.flattened_tokens",
    ),
    Variant(
        "merge_heads_interleaved",
        "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.permute(0, 2, 3, 1).reshape(B, T, H * Dh)",
        "merge_heads", "merge_heads.interleaved",
    ),
    Variant(
        "module_scaled_by_embed_dim",
        module_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)",
                                             "scale_scores(attention_scores(q, k), self.embed_dim)")),
        "MultiHeadAttention", "MultiHeadAttention.scaled_by_embed_dim",
    ),
    Variant(
        "module_unscaled",
        module_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)", "attention_scores(q, k)")),
        "MultiHeadAttention", "MultiHeadAttention.unscaled",
    ),
    Variant(
        "module_softmax_query_axis",
        module_with(REFERENCE_MIDDLE.replace("mask))", "mask), dim=-2)")),
        "MultiHeadAttention", "MultiHeadAttention.softmax_query_axis",
    ),
    Variant(
        "module_mask_inverted",
        module_with(REFERENCE_MIDDLE.replace(", mask))", ", None if mask is None else ~mask))")),
        "MultiHeadAttention", "MultiHeadAttention.mask_inverted",
    ),
    Variant(
        "module_key_as_value",
        module_with("        v = split_heads(project(key, self.w_v.weight, self.w_v.bias), H)\n" + REFERENCE_MIDDLE),
        "MultiHeadAttention", "MultiHeadAttention.key_as_value",
    ),
    Variant(
        "module_no_output_projection",
        module_with(REFERENCE_MIDDLE.replace("return project(y, self.w_o.weight, self.w_o.bias)", "return y")),
        "MultiHeadAttention", "MultiHeadAttention.no_output_projection",
    ),
    Variant(
        "module_value_defaults_to_query",
        module_with(REFERENCE_MIDDLE, value_default="query"),
        "MultiHeadAttention", "MultiHeadAttention.value_defaults_to_query",
    ),
    # -- mistakes real candidates make, one each ------------------------------------------
    Variant("split_heads_head_width_last",
            "def split_heads(x, num_heads):\n    B, T, D = x.shape\n    return x.view(B, T, num_heads, D // num_heads).permute(0, 2, 3, 1)",
            "split_heads", "split_heads.head_width_last"),
    Variant("attention_scores_fixed_axes", "def attention_scores(q, k):\n    return q @ k.transpose(1, 2)  # right for 3-D only",
            "attention_scores", "attention_scores.fixed_axes"),
    Variant("attention_scores_four_dims_only", "def attention_scores(q, k):\n    return q @ k.transpose(2, 3)",
            "attention_scores", "fixed_rank"),
    Variant("attention_scores_dot_T", "def attention_scores(q, k):\n    return q @ k.T", "attention_scores", "transpose_all_axes"),
    Variant("attention_scores_bmm", "def attention_scores(q, k):\n    return torch.bmm(q, k.transpose(1, 2))", "attention_scores", "fixed_rank"),
    Variant("weighted_sum_renormalized",  # "make sure each row is an average": dropout's weights are not
            "def weighted_sum(weights, v):\n    return (weights / weights.sum(-1, keepdim=True)) @ v",
            "weighted_sum", "weighted_sum.renormalized"),
    Variant("split_heads_sequence_first_fold",  # F.multi_head_attention_forward's fold, on batch-first input
            "def split_heads(x, num_heads):\n    B, T, D = x.shape\n"
            "    return x.reshape(T, B * num_heads, D // num_heads).transpose(0, 1).reshape(B, num_heads, T, D // num_heads)",
            "split_heads", "split_heads.sequence_first_fold"),
    Variant("attention_scores_reshape_not_transpose",
            "def attention_scores(q, k):\n    return q @ k.reshape(*k.shape[:-2], k.shape[-1], k.shape[-2])",
            "attention_scores", "attention_scores.reshape_not_transpose"),
    Variant("apply_mask_in_place",  # right values, but the caller's scores are filled too
            "def apply_mask(scores, mask):\n    return scores if mask is None else scores.masked_fill_(~mask, float('-inf'))",
            "apply_mask", "input_changed_in_place"),
    Variant("project_addmm",  # the fused bias-add of a textbook: torch.addmm takes 2-D inputs only
            "def project(x, weight, bias=None):\n    return x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t())",
            "project", "fixed_rank"),
    Variant("scale_scores_precedence", "def scale_scores(scores, head_dim):\n    return scores / head_dim ** 1/2",
            "scale_scores", "scale_scores.precedence"),
    Variant("scale_scores_by_last_axis", "def scale_scores(scores, head_dim):\n    return scores / math.sqrt(scores.size(-1))",
            "scale_scores", "scale_scores.by_last_axis"),
    Variant("apply_mask_where_none", "def apply_mask(scores, mask):\n"
            "    return torch.where(mask if mask is not None else torch.zeros_like(scores, dtype=torch.bool), scores, float('-inf'))",
            "apply_mask", "apply_mask.none_blocks_all"),
    Variant("scale_scores_isqrt", "def scale_scores(scores, head_dim):\n    return scores / math.isqrt(head_dim)",
            "scale_scores", "scale_scores.integer_root"),
    Variant("apply_mask_minus_1e9", "def apply_mask(scores, mask):\n"
            "    return scores if mask is None else scores.masked_fill(mask == 0, -1e9)", "apply_mask", "fill_overflows_half"),
    Variant("apply_mask_added", "def apply_mask(scores, mask):\n    return scores if mask is None else scores + mask",
            "apply_mask", "apply_mask.added_mask"),
    Variant("apply_mask_one_minus", "def apply_mask(scores, mask):\n"
            "    return scores if mask is None else scores + (1 - mask) * -1e9", "apply_mask", "apply_mask.bool_arithmetic"),
    Variant("apply_mask_index_assign", "def apply_mask(scores, mask):\n    if mask is None:\n        return scores\n"
            "    scores = scores.clone()\n    scores[~mask] = float('-inf')\n    return scores", "apply_mask", "apply_mask.index_no_broadcast"),
    Variant("softmax_identity", "def softmax(scores, dim=-1):\n    return scores  # left for later", "softmax", "softmax.identity"),
    Variant("softmax_dim_0", "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(0, keepdim=True))\n"
            "    return e / e.sum(0, keepdim=True)", "softmax", "softmax.dim_0"),
    Variant("softmax_global_max", "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.max())\n"
            "    return e / e.sum(dim, keepdim=True)", "softmax", "softmax.global_max"),
    Variant("softmax_max_namedtuple", "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.max(dim, keepdim=True))\n"
            "    return e / e.sum(dim, keepdim=True)", "softmax", "softmax.max_namedtuple"),
    Variant("softmax_max_no_keepdim", "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(dim))\n"
            "    return e / e.sum(dim, keepdim=True)", "softmax", "softmax.max_no_keepdim"),
    Variant("softmax_sum_over_last_axis", "def softmax(scores, dim=-1):\n"
            "    e = torch.exp(scores - scores.amax(dim, keepdim=True).clamp_min(-1e30))\n"
            "    return e / e.sum(-1, keepdim=True).clamp_min(1e-30)", "softmax", "softmax.sum_over_last_axis"),
    Variant("softmax_max_over_last_axis", "def softmax(scores, dim=-1):\n"
            "    m = scores.amax(-1, keepdim=True).clamp_min(-1e30)\n    e = torch.exp(scores - m)\n"
            "    return e / e.sum(dim, keepdim=True).clamp_min(1e-30)", "softmax", "softmax.max_over_last_axis"),
    Variant("softmax_sum_without_keepdim_raises", "def softmax(scores, dim=-1):\n"
            "    m = scores.amax(dim, keepdim=True).clamp_min(-1e30)\n    e = torch.exp(scores - m)\n    s = e.sum(dim)\n"
            "    return e / s", "softmax", "keepdim_lost"),
    Variant("weighted_sum_over_queries", "def weighted_sum(weights, v):\n"
            "    return (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(dim=-3)", "weighted_sum", "weighted_sum.summed_over_queries"),
    Variant("weighted_sum_broadcast_2d", "def weighted_sum(weights, v):\n    return (v[:, None] * weights[..., None]).sum(1)",
            "weighted_sum", "weighted_sum.broadcast_for_2d"),
    Variant("merge_heads_view", "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.transpose(1, 2).view(B, T, H * Dh)",
            "merge_heads", "view_non_contiguous"),
    Variant("merge_heads_rows_of_tokens", "def merge_heads(x):\n    B, H, T, Dh = x.shape\n    return x.transpose(1, 2).reshape(-1, H * Dh)",
            "merge_heads", "axis_missing"),
    Variant("module_scaled_by_num_heads", module_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)",
                                                                              "scale_scores(attention_scores(q, k), H)")),
            "MultiHeadAttention", "MultiHeadAttention.scaled_by_num_heads"),
    Variant("module_scaled_by_key_count", module_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)",
                                                                              "scale_scores(attention_scores(q, k), k.shape[-2])")),
            "MultiHeadAttention", "MultiHeadAttention.scaled_by_key_count"),
    Variant("module_scaled_after_softmax", module_with(REFERENCE_MIDDLE.replace(
        "att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))",
        "att = scale_scores(softmax(apply_mask(attention_scores(q, k), mask)), Dh)")),
            "MultiHeadAttention", "MultiHeadAttention.scaled_after_softmax"),
    Variant("module_mask_ignored", module_with(REFERENCE_MIDDLE.replace(", mask))", ", None))")),
            "MultiHeadAttention", "MultiHeadAttention.mask_ignored"),
    Variant("module_mask_after_softmax", module_with(REFERENCE_MIDDLE.replace(
        "att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))",
        "att = softmax(scale_scores(attention_scores(q, k), Dh))\n"
        "        att = att if mask is None else att.masked_fill(~mask, 0.0)")),
            "MultiHeadAttention", "MultiHeadAttention.mask_after_softmax"),
    Variant("module_weights_times_keys", module_with(REFERENCE_MIDDLE.replace("weighted_sum(att, v)", "weighted_sum(att, k)")),
            "MultiHeadAttention", "MultiHeadAttention.keys_as_values"),
    Variant("module_w_q_for_keys", module_with("        k = split_heads(project(key, self.w_q.weight, self.w_q.bias), H)\n" + REFERENCE_MIDDLE),
            "MultiHeadAttention", "MultiHeadAttention.w_q_for_keys"),
    Variant("module_one_head", module_with(
        "        q, k, v = (project(x, w.weight, w.bias) for x, w in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))\n"
        "        att = softmax(apply_mask(scale_scores(attention_scores(q, k), Dh), mask))\n"
        "        return project(weighted_sum(att, v), self.w_o.weight, self.w_o.bias)"),
            "MultiHeadAttention", "MultiHeadAttention.one_head"),
    Variant("module_time_first", """
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        # the nn.MultiheadAttention habit: (T, B, D) in and out
        query, key, value = (None if t is None else t.transpose(0, 1) for t in (query, key, value))
        out = super().forward(query, key, value, mask)
        return out.transpose(0, 1)
""", "MultiHeadAttention", "MultiHeadAttention.time_first"),
    Variant("module_x_at_w", module_with(
        "        q, k, v = (split_heads(x @ w.weight + w.bias if w.bias is not None else x @ w.weight, H)\n"
        "                   for x, w in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))\n" + REFERENCE_MIDDLE),
            "MultiHeadAttention", "MultiHeadAttention.weight_not_transposed"),
    Variant("module_bias_dropped", module_with("        v = split_heads(project(value, self.w_v.weight), H)\n" + REFERENCE_MIDDLE),
            "MultiHeadAttention", "MultiHeadAttention.bias_dropped"),
    Variant("module_mask_unsqueezed", module_with(REFERENCE_MIDDLE.replace(", mask))", ", None if mask is None else mask.unsqueeze(1)))")),
            "MultiHeadAttention", "MultiHeadAttention.mask_reshaped"),
    Variant("module_assert_width", """
class MultiHeadAttention(MultiHeadAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        assert embed_dim % num_heads == 0, "embed_dim must be divisible by num_heads"
        nn.Module.__init__(self)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(embed_dim, embed_dim, bias=bias) for _ in range(4))
""", "MultiHeadAttention", "assert_not_valueerror"),
    Variant("module_no_width_check", """
class MultiHeadAttention(MultiHeadAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        nn.Module.__init__(self)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(embed_dim, embed_dim, bias=bias) for _ in range(4))
""", "MultiHeadAttention", "MultiHeadAttention.no_width_check"),
    Variant("module_layers_off_contract", """
class MultiHeadAttention(MultiHeadAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = self.w_q, self.w_k, self.w_v, self.w_o
        del self.w_q, self.w_k, self.w_v, self.w_o

    def forward(self, query, key=None, value=None, mask=None):
        self.w_q, self.w_k, self.w_v, self.w_o = self.q_proj, self.k_proj, self.v_proj, self.out_proj
        return super().forward(query, key, value, mask)
""", "MultiHeadAttention", "layer_names"),
    Variant("module_dropout_at_eval", """
import torch.nn.functional as F

class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        H = self.num_heads
        q, k, v = (split_heads(project(x, w.weight, w.bias), H) for x, w in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))
        att = F.dropout(softmax(apply_mask(scale_scores(attention_scores(q, k), self.head_dim), mask)), p=0.1)
        return project(merge_heads(weighted_sum(att, v)), self.w_o.weight, self.w_o.bias)
""", "MultiHeadAttention", "dropout_at_eval"),
    Variant("module_key_or_query", module_with(REFERENCE_MIDDLE).replace(
        "key = query if key is None else key", "key = key or query"), "MultiHeadAttention", "tensor_truthiness"),
    # -- found by the search (grader/engine/search.py) and the defaults check --------------
    Variant("module_key_value_swapped", """
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        return super().forward(query, value, key, mask)
""", "MultiHeadAttention", "arguments_swapped"),
    Variant("module_value_bias_from_key", """
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        H = self.num_heads
        q = split_heads(project(query, self.w_q.weight, self.w_q.bias), H)
        k = split_heads(project(key, self.w_k.weight, self.w_k.bias), H)
        v = split_heads(project(value, self.w_v.weight, self.w_k.bias), H)
        att = softmax(apply_mask(scale_scores(attention_scores(q, k), self.head_dim), mask), dim=-1)
        return project(merge_heads(weighted_sum(att, v)), self.w_o.weight, self.w_o.bias)
""", "MultiHeadAttention", "argument_duplicated"),
    Variant("module_default_bias_false", """
class MultiHeadAttention(MultiHeadAttention):
    def __init__(self, embed_dim, num_heads, bias=False):
        super().__init__(embed_dim, num_heads, bias)
""", "MultiHeadAttention", "constructor_defaults"),
    Variant("module_keeps_keys_between_calls", """
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):  # a cache kept on the module, never asked for
        key = query if key is None else key
        value = key if value is None else value
        if mask is None and getattr(self, "_keys", None) is not None:
            key, value = torch.cat([self._keys, key], dim=1), torch.cat([self._values, value], dim=1)
        self._keys, self._values = key.detach(), value.detach()
        return super().forward(query, key, value, mask)
""", "MultiHeadAttention", "state_between_calls"),
    Variant("softmax_in_float32", """
def softmax(scores, dim=-1):
    x = scores.float()
    m = x.amax(dim=dim, keepdim=True).masked_fill(x.amax(dim=dim, keepdim=True) == float("-inf"), 0.0)
    e = torch.exp(x - m)
    return (e / e.sum(dim=dim, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)).to(scores.dtype)
""", "softmax", "computed_in_float32"),
]

RULES_ONLY = [
    Variant(
        "project_linear",
        "import torch.nn.functional as F\ndef project(x, weight, bias=None):\n    return F.linear(x, weight, bias)",
        "project", "forbidden_call",
    ),
    Variant(
        "module_sdpa",
        module_with("        import torch.nn.functional as F\n"
                    "        y = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))\n"
                    "        return project(y, self.w_o.weight, self.w_o.bias)"),
        "MultiHeadAttention", "forbidden_call",
    ),
    Variant("softmax_builtin", "def softmax(scores, dim=-1):\n    return torch.softmax(scores, dim)", "softmax", "forbidden_call"),
]

CORRECT = [
    Variant(
        "nanogpt_style_module",  # a causal-mask buffer named bias, nn.Dropout (off at eval), nn.LazyLinear for w_o
        """
        class MultiHeadAttention(nn.Module):
            def __init__(self, embed_dim, num_heads, bias=True):
                super().__init__()
                if embed_dim % num_heads:
                    raise ValueError("embed_dim must be divisible by num_heads")
                self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
                self.w_q = nn.Linear(embed_dim, embed_dim, bias=bias)
                self.w_k = nn.Linear(embed_dim, embed_dim, bias=bias)
                self.w_v = nn.Linear(embed_dim, embed_dim, bias=bias)
                self.w_o = nn.LazyLinear(embed_dim, bias=bias)
                self.attn_dropout = nn.Dropout(0.1)
                self.register_buffer("bias", torch.tril(torch.ones(64, 64)).view(1, 1, 64, 64))

            def forward(self, query, key=None, value=None, mask=None):
                key = query if key is None else key
                value = key if value is None else value
                B, T, C = query.size()
                q = self.w_q(query).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
                k = self.w_k(key).view(B, key.size(1), self.num_heads, self.head_dim).transpose(1, 2)
                v = self.w_v(value).view(B, value.size(1), self.num_heads, self.head_dim).transpose(1, 2)
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                if mask is not None:
                    att = att.masked_fill(~mask, float("-inf"))
                att = self.attn_dropout(att.softmax(dim=-1) if False else softmax(att))
                y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
                return self.w_o(y)
        """,
    ),
    Variant(
        "scale_by_tensor_root",  # a 0-dim tensor: fine on a GPU, so fine on the meta device too
        """
        def scale_scores(scores, head_dim):
            return scores / torch.tensor(head_dim, dtype=scores.dtype).sqrt()
        """,
    ),
    Variant(
        "where_mask_and_baddbmm_free_scores",
        """
        def apply_mask(scores, mask):
            if mask is None:
                return scores
            return torch.where(mask, scores, torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device))

        def attention_scores(q, k):
            return torch.matmul(q, k.mT)

        def weighted_sum(weights, v):
            return (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(dim=-2)
        """,
    ),
    Variant(
        "einsum",
        """
        def project(x, weight, bias=None):
            y = torch.einsum("...i,oi->...o", x, weight)
            return y if bias is None else y + bias

        def attention_scores(q, k):
            return torch.einsum("...qd,...kd->...qk", q, k)

        def weighted_sum(weights, v):
            return torch.einsum("...qk,...kd->...qd", weights, v)
        """,
    ),
    Variant(
        "loop_over_heads",
        module_with("""\
        outs = []
        for h in range(H):  # one head at a time, as (B, T, Dh) slices
            s = q[:, h] @ k[:, h].transpose(-2, -1) / math.sqrt(Dh)
            if mask is not None:
                m = mask.expand(q.shape[0], H, q.shape[2], k.shape[2])[:, h]
                s = s.masked_fill(~m, float("-inf"))
            outs.append(softmax(s) @ v[:, h])
        y = torch.cat(outs, dim=-1)
        return project(y, self.w_o.weight, self.w_o.bias)"""),
    ),
    Variant(
        "fused_qkv",
        """
        class MultiHeadAttention(MultiHeadAttention):
            def forward(self, query, key=None, value=None, mask=None):
                key = query if key is None else key
                value = key if value is None else value
                D, H = self.embed_dim, self.num_heads
                w = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # (3D, D)
                b = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
                if key is query and value is query:
                    q, k, v = project(query, w, b).split(D, dim=-1)  # one matmul for all three
                else:
                    q, k, v = (project(x, w[i * D:(i + 1) * D], None if b is None else b[i * D:(i + 1) * D])
                               for i, x in enumerate((query, key, value)))
                q, k, v = (split_heads(t, H) for t in (q, k, v))
                att = softmax(apply_mask(scale_scores(attention_scores(q, k), self.head_dim), mask))
                return self.w_o(merge_heads(weighted_sum(att, v)))
        """,
    ),
    Variant(
        "scale_q_first",
        textwrap.dedent("""
            def scale_scores(scores, head_dim):
                return scores * head_dim ** -0.5
            """) + module_with("""\
        q = q * Dh ** -0.5  # scale the queries instead of the scores
        att = softmax(apply_mask(attention_scores(q, k), mask))
        return project(merge_heads(weighted_sum(att, v)), self.w_o.weight, self.w_o.bias)"""),
    ),
    Variant(
        "finfo_min_mask",
        """
        def apply_mask(scores, mask):
            if mask is None:
                return scores
            return torch.where(mask, scores, torch.finfo(scores.dtype).min)
        """,
    ),
    Variant(
        "logsumexp_softmax",
        """
        def softmax(scores, dim=-1):
            lse = torch.logsumexp(scores, dim=dim, keepdim=True)
            # an all -inf slice has lse = -inf and gives NaN; those slices are all zeros
            return torch.nan_to_num(torch.exp(scores - lse), nan=0.0)
        """,
    ),
    Variant(
        "split_heads_view_of_a_non_contiguous_input",  # splitting the last dim is always a view: no .contiguous() needed
        """
        def split_heads(x, num_heads):
            B, T, D = x.shape
            return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)
        """,
    ),
    Variant(
        "views_and_permutes",
        """
        def split_heads(x, num_heads):
            B, T, D = x.shape
            return x.contiguous().view(B, T, num_heads, -1).permute(0, 2, 1, 3)

        def merge_heads(x):
            B, H, T, Dh = x.shape
            return x.permute(0, 2, 1, 3).contiguous().view(B, T, -1)

        def project(x, weight, bias=None):
            return torch.matmul(x, weight.t()) + (0 if bias is None else bias)
        """,
    ),
]

# Graded with the device checks on (the meta device here, CUDA where there is one).
DEVICE_BUGGY = [
    Variant(
        "module_constant_on_cpu",  # a device bug: the scale is built on the CPU whatever the input's device
        module_with(REFERENCE_MIDDLE.replace("scale_scores(attention_scores(q, k), Dh)",
                                             "attention_scores(q, k) / torch.FloatTensor([Dh ** 0.5])")),
        "MultiHeadAttention", "tensor_on_cpu",
    ),
]

DEVICE_CORRECT = [
    Variant(
        "data_dependent_branch",  # bool() of a tensor has no meta kernel: skipped there, not failed
        """
        def apply_mask(scores, mask):
            if mask is None or bool(mask.all()):
                return scores
            return scores.masked_fill(~mask, float("-inf"))
        """,
    ),
]
