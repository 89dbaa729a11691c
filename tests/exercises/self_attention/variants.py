"""Candidates for `self_attention` made from the reference by redefining one thing (Python keeps the last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (None where the mistake has no name and a plain failure is right).
RULES_ONLY: a step that calls a function its contract forbids: it loses the whole step, and nothing else.
CORRECT: unusual but right ways to write the steps; each must score 100.
"""

import textwrap

from tests.exercises.mha.variants import Variant


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
    # -- project_qkv
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
        "project_qkv_bias_copy_paste",  # the value projection took the key's bias
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    q, k, v = x @ wq.T, x @ wk.T, x @ wv.T\n"
        "    if bq is not None:\n        q, k, v = q + bq, k + bk, v + bk\n"
        "    return q, k, v",
        "project_qkv", "project_qkv.wrong_weight",
    ),
    Variant(
        "project_qkv_bias_none_unhandled",  # qkv_bias=False: the biases are left out, so they default to None
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    return x @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv",
        "project_qkv", "none_unhandled",
    ),
    Variant(
        "project_qkv_assumes_batch",
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    B, T, D = x.shape\n"
        "    flat = x.reshape(B * T, D)\n"
        "    return tuple((flat @ w.T + (0 if b is None else b)).reshape(B, T, -1)\n"
        "                 for w, b in ((wq, bq), (wk, bk), (wv, bv)))",
        "project_qkv", "fixed_rank",
    ),
    # -- attention_scores
    Variant(
        "attention_scores_transposed",
        "def attention_scores(queries, keys):\n    return keys @ queries.transpose(-2, -1)",
        "attention_scores", "attention_scores.transposed",
    ),
    Variant(
        "attention_scores_keys_T",  # the tutorials' 2-D code: right without a batch dim only
        "def attention_scores(queries, keys):\n    return queries @ keys.T",
        "attention_scores", "transpose_all_axes",
    ),
    Variant(
        "attention_scores_bmm",  # right with exactly one batch dim only
        "def attention_scores(queries, keys):\n    return torch.bmm(queries, keys.transpose(1, 2))",
        "attention_scores", "fixed_rank",
    ),
    Variant(
        "attention_scores_fixed_axes",  # (B, T, d) in mind: right with exactly one batch dim
        "def attention_scores(queries, keys):\n    return queries @ keys.transpose(1, 2)",
        "attention_scores", "attention_scores.fixed_axes",
    ),
    # -- scale_scores
    Variant("scale_scores_isqrt", "def scale_scores(scores, d_out):\n    return scores / math.isqrt(d_out)",
            "scale_scores", "scale_scores.integer_root"),
    Variant("scale_scores_by_last_axis", "def scale_scores(scores, d_out):\n    return scores / scores.shape[-1] ** 0.5",
            "scale_scores", "scale_scores.by_last_axis"),
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
        "scale_scores_precedence",  # ** binds tighter than /: this is (d_out ** 1) / 2
        "def scale_scores(scores, d_out):\n    return scores / d_out ** 1/2",
        "scale_scores", "scale_scores.precedence",
    ),
    Variant(
        "scale_scores_by_last_axis",  # the tutorials' keys.shape[-1], taken from the scores instead
        "def scale_scores(scores, d_out):\n    return scores / math.sqrt(scores.shape[-1])",
        "scale_scores", "scale_scores.by_last_axis",
    ),
    Variant(
        "scale_scores_integer_root",  # right for perfect squares only
        "def scale_scores(scores, d_out):\n    return scores / math.isqrt(d_out)",
        "scale_scores",
    ),
    Variant(
        "scale_scores_upcast",
        "def scale_scores(scores, d_out):\n    return scores.double() / math.sqrt(d_out)",
        "scale_scores", "dtype_promoted",
    ),
    # -- softmax
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
    Variant("softmax_identity", "def softmax(scores, dim=-1):\n    return scores", "softmax", "softmax.identity"),
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
        "softmax_global_max",  # one max for the whole tensor: stable, but far rows underflow to 0 / 0
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.max())\n"
        "    return e / e.sum(dim=dim, keepdim=True)",
        "softmax", "softmax.global_max",
    ),
    Variant(
        "softmax_max_namedtuple",  # Tensor.max(dim) is (values, indices)
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.max(dim=dim, keepdim=True))\n"
        "    return e / e.sum(dim=dim, keepdim=True)",
        "softmax", "softmax.max_namedtuple",
    ),
    Variant(
        "softmax_max_no_keepdim",  # the sum keeps its axis, the max does not
        "def softmax(scores, dim=-1):\n    m = scores.amax(dim=dim)\n    e = torch.exp(scores - m)\n"
        "    return e / e.sum(dim=dim, keepdim=True)",
        "softmax", "softmax.max_no_keepdim",
    ),
    Variant(
        "softmax_sum_over_last_axis",  # the shift along dim, the sum from the usual last axis
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(dim, keepdim=True))\n"
        "    return e / e.sum(dim=-1, keepdim=True)",
        "softmax", "softmax.sum_over_last_axis",
    ),
    Variant(
        "softmax_max_over_last_axis",  # the shift from the usual last axis, the sum along dim
        "def softmax(scores, dim=-1):\n    e = torch.exp(scores - scores.amax(-1, keepdim=True))\n"
        "    return e / e.sum(dim=dim, keepdim=True)",
        "softmax", "softmax.max_over_last_axis",
    ),
    Variant("attention_scores_reshape_not_transpose",
            "def attention_scores(queries, keys):\n    return queries @ keys.reshape(*keys.shape[:-2], keys.shape[-1], keys.shape[-2])",
            "attention_scores", "attention_scores.reshape_not_transpose"),
    # -- weighted_sum
    Variant("weighted_sum_renormalized", "def weighted_sum(weights, values):\n    weights = weights / weights.sum(dim=-1, keepdim=True)  # each row an average\n    return weights @ values", "weighted_sum", "weighted_sum.renormalized"),
    Variant(
        "weighted_sum_transposed",
        "def weighted_sum(weights, values):\n    return weights.transpose(-2, -1) @ values",
        "weighted_sum", "weighted_sum.transposed_weights",
    ),
    Variant(
        "weighted_sum_bmm",  # right with exactly one batch dim only
        "def weighted_sum(weights, values):\n    return torch.bmm(weights, values)",
        "weighted_sum", "fixed_rank",
    ),
    Variant(
        "weighted_sum_summed_over_queries",  # the broadcast product, summed over the wrong axis
        "def weighted_sum(weights, values):\n"
        "    return (weights[..., :, :, None] * values[..., None, :, :]).sum(dim=-3)",
        "weighted_sum", "weighted_sum.summed_over_queries",
    ),
    Variant(
        "weighted_sum_broadcast_2d",  # written for (T, T) weights and (T, d) values only
        "def weighted_sum(weights, values):\n    return (weights[:, :, None] * values[None, :, :]).sum(dim=1)",
        "weighted_sum", "weighted_sum.broadcast_for_2d",
    ),
    Variant(
        "weighted_sum_accumulated_in_float32",  # torch.zeros without dtype=: float64 values summed into float32
        "def weighted_sum(weights, values):\n"
        "    out = torch.zeros(*weights.shape[:-1], values.shape[-1], device=values.device)\n"
        "    for j in range(weights.shape[-1]):  # one key at a time\n"
        "        out += weights[..., :, j:j + 1] * values[..., j:j + 1, :]\n"
        "    return out",
        "weighted_sum", "dtype_narrowed",
    ),
    Variant(
        "weighted_sum_einsum_typo",  # the query index dropped from the output: summed over the queries too
        "def weighted_sum(weights, values):\n    return torch.einsum('...qk,...kd->...d', weights, values)",
        "weighted_sum", "axis_missing",
    ),
    # -- SelfAttention
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
        "module_scaled_by_shape_1",  # keys.shape[1] is d_out for the tutorials' (T, d_out) keys, T once batched
        module_with(REFERENCE_BODY.replace("self.d_out", "k.shape[1]")),
        "SelfAttention", "SelfAttention.scaled_by_token_count",
    ),
    Variant(
        "module_scaled_after_softmax",
        module_with("""\
        weights = scale_scores(softmax(attention_scores(q, k), dim=-1), self.d_out)
        return weighted_sum(weights, v)"""),
        "SelfAttention", "SelfAttention.scaled_after_softmax",
    ),
    Variant(
        "module_causal",  # the next section's CausalAttention, a section too early
        module_with("""\
        T = x.shape[-2]
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scale_scores(attention_scores(q, k), self.d_out).masked_fill(future, float("-inf"))
        return weighted_sum(softmax(scores, dim=-1), v)"""),
        "SelfAttention", "SelfAttention.causal",
    ),
    Variant(
        "module_ignores_qkv_bias",
        """
        class SelfAttention(SelfAttention):
            def __init__(self, d_in, d_out, qkv_bias=False):
                super().__init__(d_in, d_out, qkv_bias=False)
        """,
        "SelfAttention", "layer_names",
    ),
    Variant(
        "module_bias_always",  # nn.Linear's default bias=True, whatever qkv_bias says
        """
        class SelfAttention(SelfAttention):
            def __init__(self, d_in, d_out, qkv_bias=False):
                nn.Module.__init__(self)
                self.d_out = d_out
                self.W_query = nn.Linear(d_in, d_out)
                self.W_key = nn.Linear(d_in, d_out)
                self.W_value = nn.Linear(d_in, d_out)
        """,
        "SelfAttention", "parameters_not_loaded",
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
        "SelfAttention", "layer_names",
    ),
    Variant(
        "module_batched_only",
        module_with("        B, T, _ = x.shape  # no (T, d_in) input\n" + REFERENCE_BODY),
        "SelfAttention", "fixed_rank",
    ),
    Variant(
        "module_detached_scores",  # right values, but no gradient reaches W_query and W_key
        module_with(REFERENCE_BODY.replace("attention_scores(q, k)", "attention_scores(q, k).detach()")),
        "SelfAttention",
    ),
    Variant(
        "module_weight_data",  # .data: right values, but the weights get no gradient
        """
        class SelfAttention(SelfAttention):
            def forward(self, x):
                q, k, v = project_qkv(x, self.W_query.weight.data, self.W_key.weight.data, self.W_value.weight.data,
                                      self.W_query.bias, self.W_key.bias, self.W_value.bias)
                weights = softmax(scale_scores(attention_scores(q, k), self.d_out), dim=-1)
                return weighted_sum(weights, v)
        """,
        "SelfAttention", "gradient_cut",
    ),
    Variant(
        "module_functional_dropout",  # F.dropout defaults to training=True: it acts after model.eval() too
        "import torch.nn.functional as F\n" + module_with("""\
        weights = softmax(scale_scores(attention_scores(q, k), self.d_out), dim=-1)
        return weighted_sum(F.dropout(weights, 0.1), v)"""),
        "SelfAttention", "dropout_at_eval",
    ),
    # -- found by the search (grader/engine/search.py) and the defaults check --------------
    Variant("project_qkv_tutorial_order", """
_project_reference = project_qkv


def project_qkv(x, w_query, w_key, w_value, b_query=None, b_key=None, b_value=None):
    queries, keys, values = _project_reference(x, w_query, w_key, w_value, b_query, b_key, b_value)
    return keys, values, queries
""", "project_qkv", "outputs_reordered"),
    Variant("module_keys_from_w_value", """
class SelfAttention(SelfAttention):
    def forward(self, x):
        q, k, v = project_qkv(x, self.W_query.weight, self.W_value.weight, self.W_key.weight,
                              self.W_query.bias, self.W_value.bias, self.W_key.bias)
        return weighted_sum(softmax(scale_scores(attention_scores(q, k), self.d_out), dim=-1), v)
""", "SelfAttention", "arguments_swapped"),
    Variant("project_qkv_key_weight_not_transposed", """
_project_reference = project_qkv


def project_qkv(x, w_query, w_key, w_value, b_query=None, b_key=None, b_value=None):
    queries, _, values = _project_reference(x, w_query, w_key, w_value, b_query, b_key, b_value)
    keys = x @ w_key
    return queries, keys if b_key is None else keys + b_key, values
""", "project_qkv", "project_qkv.weight_not_transposed"),
    Variant("module_value_layer_default_bias", """
class SelfAttention(SelfAttention):
    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__(d_in, d_out, qkv_bias)
        self.W_value = nn.Linear(d_in, d_out)  # bias=True whatever qkv_bias says
""", "SelfAttention", "parameters_not_loaded"),
    Variant("module_default_qkv_bias_true", """
class SelfAttention(SelfAttention):
    def __init__(self, d_in, d_out, qkv_bias=True):
        super().__init__(d_in, d_out, qkv_bias)
""", "SelfAttention", "constructor_defaults"),
]

# A forbidden call: the step earns nothing, whatever its values.
RULES_ONLY = [
    Variant(
        "project_qkv_linear",
        "import torch.nn.functional as F\n"
        "def project_qkv(x, wq, wk, wv, bq=None, bk=None, bv=None):\n"
        "    return F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)",
        "project_qkv", "forbidden_call",
    ),
    Variant("softmax_builtin", "def softmax(scores, dim=-1):\n    return torch.softmax(scores, dim)", "softmax", "forbidden_call"),
    Variant(
        "softmax_method",  # Tensor.softmax is torch.softmax by another name
        "def softmax(scores, dim=-1):\n    return scores.softmax(dim=dim)",
        "softmax", "forbidden_call",
    ),
    Variant(
        "module_sdpa",
        module_with("        import torch.nn.functional as F\n"
                    "        return F.scaled_dot_product_attention(q, k, v)"),
        "SelfAttention", "forbidden_call",
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
    Variant(
        "lazy_layers_and_buffer",  # nn.LazyLinear learns d_in from the first input; a scale kept as a buffer
        """
        class SelfAttention(nn.Module):
            def __init__(self, d_in, d_out, qkv_bias=False):
                super().__init__()
                self.W_query = nn.LazyLinear(d_out, bias=qkv_bias)
                self.W_key = nn.LazyLinear(d_out, bias=qkv_bias)
                self.W_value = nn.LazyLinear(d_out, bias=qkv_bias)
                self.register_buffer("scale", torch.tensor(d_out ** -0.5))

            def forward(self, x):
                q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
                return weighted_sum(softmax(attention_scores(q * self.scale, k), dim=-1), v)
        """,
    ),
    Variant(
        "unbatched_as_a_batch_of_one",  # (T, d_in) handled by adding the batch axis and taking it off again
        """
        class SelfAttention(SelfAttention):
            def forward(self, x):
                if x.dim() == 2:
                    return self.forward(x.unsqueeze(0)).squeeze(0)
                q, k, v = (layer(x) for layer in (self.W_query, self.W_key, self.W_value))
                scores = torch.baddbmm(torch.zeros(1, 1, 1, dtype=x.dtype, device=x.device), q, k.transpose(1, 2),
                                       alpha=1 / math.sqrt(k.shape[-1]))
                return weighted_sum(softmax(scores, dim=-1), v)
        """,
    ),
    Variant(
        "broadcast_weighted_sum_and_rsqrt",
        """
        def weighted_sum(weights, values):
            return (weights.unsqueeze(-1) * values.unsqueeze(-3)).sum(dim=-2)  # over the keys

        def scale_scores(scores, d_out):
            return scores * torch.rsqrt(torch.tensor(float(d_out), dtype=torch.float64)).item()
        """,
    ),
    Variant(
        "softmax_in_float64",  # computed in float64, handed back in the input's dtype
        """
        def softmax(scores, dim=-1):
            s = scores.double()
            e = (s - s.amax(dim, keepdim=True)).exp()
            return (e / e.sum(dim, keepdim=True)).to(scores.dtype)
        """,
    ),
]

# Graded with the device checks on (the meta device here, CUDA where there is one).
DEVICE_BUGGY = [
    Variant(
        "module_constant_on_cpu",  # the scale is built on the CPU whatever the input's device
        module_with(REFERENCE_BODY.replace("scale_scores(attention_scores(q, k), self.d_out)",
                                           "attention_scores(q, k) / torch.FloatTensor([self.d_out ** 0.5])")),
        "SelfAttention", "tensor_on_cpu",
    ),
    Variant(
        "scale_scores_constant_on_cpu",  # a 1-element tensor without device=: the module composes it, so it loses too
        "def scale_scores(scores, d_out):\n    return scores / torch.tensor([math.sqrt(d_out)], dtype=scores.dtype)",
        "scale_scores", "tensor_on_cpu",
    ),
]
