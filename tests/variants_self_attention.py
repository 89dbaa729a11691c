"""Candidates for `self_attention` made from the reference by redefining one thing (Python keeps the last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

import textwrap

from tests.variants_mha import Variant


def module_with(body: str) -> str:
    """A SelfAttention whose forward is `body` after the reference's projections."""
    return f"""
class SelfAttention(SelfAttention):
    def forward(self, x):
        q, k, v = project_qkv(x, self.W_query.weight, self.W_key.weight, self.W_value.weight,
                              self.W_query.bias, self.W_key.bias, self.W_value.bias)
{body}
"""


REFERENCE_BODY = """\
        weights = softmax(scale_scores(attention_scores(q, k), self.d_out), dim=-1)
        return weighted_sum(weights, v)"""

BUGGY = [
    Variant(
        "project_qkv_weight_not_transposed",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    return tuple(x @ w + (0 if b is None else b) for w, b in ((wq, bq), (wk, bk), (wv, bv)))",
        "project_qkv", "project_qkv.weight_not_transposed",
    ),
    Variant(
        "project_qkv_no_bias",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n    return x @ wq.T, x @ wk.T, x @ wv.T",
        "project_qkv", "project_qkv.no_bias",
    ),
    Variant(
        "project_qkv_swapped",
        "_reference_qkv = project_qkv\n"
        "def project_qkv(*args):\n    q, k, v = _reference_qkv(*args)\n    return k, q, v",
        "project_qkv", "project_qkv.swapped",
    ),
    Variant(
        "project_qkv_one_weight",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    q = x @ wq.T + (0 if bq is None else bq)\n    return q, q, q",
        "project_qkv", "project_qkv.one_weight",
    ),
    Variant(
        "project_qkv_bias_none_unhandled",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    return x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv",
        "project_qkv",
    ),
    Variant(
        "project_qkv_assumes_batch",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    B, T, D = x.shape\n"
        "    flat = x.reshape(B * T, D)\n"
        "    return tuple((flat @ w.T + (0 if b is None else b)).reshape(B, T, -1)\n"
        "                 for w, b in ((wq, bq), (wk, bk), (wv, bv)))",
        "project_qkv",
    ),
    Variant(
        "project_qkv_linear",
        "import torch.nn.functional as F\n"
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)",
        "project_qkv",
    ),
    Variant(
        "attention_scores_transposed",
        "def attention_scores(queries, keys):\n    return keys @ queries.transpose(-2, -1)",
        "attention_scores", "attention_scores.transposed",
    ),
    Variant(
        "attention_scores_keys_T",  # the tutorials' 2-D code: right without a batch dim only
        "def attention_scores(queries, keys):\n    return queries @ keys.T",
        "attention_scores",
    ),
    Variant(
        "attention_scores_bmm",  # right with exactly one batch dim only
        "def attention_scores(queries, keys):\n    return torch.bmm(queries, keys.transpose(1, 2))",
        "attention_scores",
    ),
    Variant(
        "scale_scores_multiplied",
        "def scale_scores(scores, d_out):\n    return scores / d_out ** -0.5",
        "scale_scores", "scale_scores.multiplied",
    ),
    Variant(
        "scale_scores_by_d_out",
        "def scale_scores(scores, d_out):\n    return scores / d_out",
        "scale_scores", "scale_scores.by_d_out",
    ),
    Variant(
        "scale_scores_unscaled",
        "def scale_scores(scores, d_out):\n    return scores",
        "scale_scores", "scale_scores.unscaled",
    ),
    Variant(
        "scale_scores_integer_root",  # right for perfect squares only
        "def scale_scores(scores, d_out):\n    return scores / math.isqrt(d_out)",
        "scale_scores",
    ),
    Variant(
        "scale_scores_upcast",
        "def scale_scores(scores, d_out):\n    return scores.double() / math.sqrt(d_out)",
        "scale_scores",
    ),
    Variant(
        "softmax_ignored_dim",
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(-1, keepdim=True))\n"
        "    return e / e.sum(-1, keepdim=True)",
        "softmax", "softmax.ignored_dim",
    ),
    Variant(
        "softmax_naive_dim_0",
        "def softmax(scores, dim=-1):\n    return torch.exp(scores) / torch.exp(scores).sum(dim=0)",
        "softmax", "softmax.dim_0",
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
    Variant("softmax_builtin", "def softmax(scores, dim=-1):\n    return torch.softmax(scores, dim)", "softmax"),
    Variant(
        "weighted_sum_transposed",
        "def weighted_sum(weights, values):\n    return weights.transpose(-2, -1) @ values",
        "weighted_sum", "weighted_sum.transposed_weights",
    ),
    Variant(
        "weighted_sum_bmm",  # right with exactly one batch dim only
        "def weighted_sum(weights, values):\n    return torch.bmm(weights, values)",
        "weighted_sum",
    ),
    Variant(
        "module_scaled_by_d_in",
        module_with(REFERENCE_BODY.replace("self.d_out", "x.shape[-1]")),
        "SelfAttention", "SelfAttention.scaled_by_d_in",
    ),
    Variant(
        "module_unscaled",
        module_with(REFERENCE_BODY.replace("scale_scores(attention_scores(q, k), self.d_out)", "attention_scores(q, k)")),
        "SelfAttention", "SelfAttention.unscaled",
    ),
    Variant(
        "module_softmax_query_axis",
        module_with(REFERENCE_BODY.replace("dim=-1", "dim=-2")),
        "SelfAttention", "SelfAttention.softmax_query_axis",
    ),
    Variant(
        "module_scores_transposed",
        module_with(REFERENCE_BODY.replace("attention_scores(q, k)", "attention_scores(k, q)")),
        "SelfAttention", "SelfAttention.scores_transposed",
    ),
    Variant(
        "module_key_as_value",
        module_with(REFERENCE_BODY.replace("weighted_sum(weights, v)", "weighted_sum(weights, k)")),
        "SelfAttention", "SelfAttention.key_as_value",
    ),
    Variant(
        "module_ignores_qkv_bias",
        """
        class SelfAttention(SelfAttention):
            def __init__(self, d_in, d_out, qkv_bias=False):
                super().__init__(d_in, d_out, qkv_bias=False)
        """,
        "SelfAttention",
    ),
    Variant(
        "module_other_names",
        """
        class SelfAttention(nn.Module):
            def __init__(self, d_in, d_out, qkv_bias=False):
                super().__init__()
                self.query = nn.Linear(d_in, d_out, bias=qkv_bias)
                self.key = nn.Linear(d_in, d_out, bias=qkv_bias)
                self.value = nn.Linear(d_in, d_out, bias=qkv_bias)

            def forward(self, x):
                q, k, v = self.query(x), self.key(x), self.value(x)
                return softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5) @ v
        """,
        "SelfAttention",
    ),
    Variant(
        "module_batched_only",
        module_with("        B, T, _ = x.shape  # no (T, d_in) input\n" + REFERENCE_BODY),
        "SelfAttention",
    ),
    Variant(
        "module_detached_scores",  # right values, but no gradient reaches W_query and W_key
        module_with(REFERENCE_BODY.replace("attention_scores(q, k)", "attention_scores(q, k).detach()")),
        "SelfAttention",
    ),
    Variant(
        "module_sdpa",
        module_with("        import torch.nn.functional as F\n"
                    "        return F.scaled_dot_product_attention(q, k, v)"),
        "SelfAttention",
    ),
]

CORRECT = [
    Variant(
        "einsum",
        """
        def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):
            out = []
            for w, b in ((wq, bq), (wk, bk), (wv, bv)):
                y = torch.einsum("...ti,oi->...to", x, w)
                out.append(y if b is None else y + b)
            return tuple(out)

        def attention_scores(queries, keys):
            return torch.einsum("...qd,...kd->...qk", queries, keys)

        def weighted_sum(weights, values):
            return torch.einsum("...qk,...kd->...qd", weights, values)
        """,
    ),
    Variant(
        "tutorial_style_module",  # nn.Linear called directly, keys.transpose, torch.softmax (allowed in the module)
        """
        class SelfAttention(nn.Module):
            def __init__(self, d_in, d_out, qkv_bias=False):
                super().__init__()
                self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
                self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
                self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

            def forward(self, x):
                keys = self.W_key(x)
                queries = self.W_query(x)
                values = self.W_value(x)
                attn_scores = queries @ keys.transpose(-2, -1)
                attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
                return attn_weights @ values
        """,
    ),
    Variant(
        "fused_projection",
        """
        def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):
            w = torch.cat([wq, wk, wv])  # (3 d_out, d_in): one matmul for all three
            y = torch.matmul(x, w.t())
            if bq is not None:
                y = y + torch.cat([bq, bk, bv])
            return tuple(y.chunk(3, dim=-1))
        """,
    ),
    Variant(
        "scale_queries_first",
        textwrap.dedent("""
            def scale_scores(scores, d_out):
                return scores * d_out ** -0.5
            """) + module_with("""\
        q = q * q.shape[-1] ** -0.5  # scale the queries instead of the scores
        return weighted_sum(softmax(attention_scores(q, k)), v)"""),
    ),
    Variant(
        "logsumexp_softmax",
        """
        def softmax(scores, dim=-1):
            return torch.exp(scores - torch.logsumexp(scores, dim=dim, keepdim=True))
        """,
    ),
    Variant(
        "max_values_softmax",
        """
        def softmax(scores, dim=-1):
            shifted = scores - scores.max(dim=dim, keepdim=True).values
            e = shifted.exp()
            return e / e.sum(dim=dim, keepdim=True)
        """,
    ),
]

# Graded with the device checks on (the meta device here, CUDA where there is one).
DEVICE_BUGGY = [
    Variant(
        "module_constant_on_cpu",  # the scale is built on the CPU whatever the input's device
        module_with(REFERENCE_BODY.replace("scale_scores(attention_scores(q, k), self.d_out)",
                                           "attention_scores(q, k) / torch.FloatTensor([self.d_out ** 0.5])")),
        "SelfAttention",
    ),
    Variant(
        "scale_scores_constant_on_cpu",  # a 1-element tensor without device=: the module composes it, so it loses too
        "def scale_scores(scores, d_out):\n    return scores / torch.tensor([math.sqrt(d_out)], dtype=scores.dtype)",
        "scale_scores",
    ),
]
