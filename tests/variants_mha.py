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
        "project_linear",
        "import torch.nn.functional as F\ndef project(x, weight, bias=None):\n    return F.linear(x, weight, bias)",
        "project",
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
        "scale_scores",
    ),
    Variant(
        "apply_mask_none_unhandled",
        "def apply_mask(scores, mask):\n    return scores.masked_fill(~mask, float('-inf'))",
        "apply_mask",
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
    Variant("softmax_builtin", "def softmax(scores, dim=-1):\n    return torch.softmax(scores, dim)", "softmax"),
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
        "merge_heads",
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
        "MultiHeadAttention",
    ),
    Variant(
        "module_sdpa",
        module_with("        import torch.nn.functional as F\n"
                    "        y = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))\n"
                    "        return project(y, self.w_o.weight, self.w_o.bias)"),
        "MultiHeadAttention",
    ),
]

CORRECT = [
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
        "MultiHeadAttention",
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
