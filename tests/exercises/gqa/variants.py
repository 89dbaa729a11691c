"""Candidates for `gqa` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant


def attention_with(middle: str) -> str:
    """A grouped_attention whose softmax and weighted sum are the reference's, with `middle` computing the masked scores."""
    return f"""
def grouped_attention(q, k, v, mask=None):
    Dh, G = q.shape[-1], q.shape[1] // k.shape[1]
{middle}
    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
"""


REFERENCE_SCORES = """\
    k, v = repeat_kv(k, G), repeat_kv(v, G)
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))"""


def module_with(body: str, init: str = "") -> str:
    """A GroupedQueryAttention whose forward projects and splits as the reference does, then runs `body`."""
    return f"""
class GroupedQueryAttention(GroupedQueryAttention):
{init}
    def forward(self, x, mask=None):
        B, T, D = x.shape
        Hq, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.w_q(x).view(B, T, Hq, Dh).transpose(1, 2)
        k = self.w_k(x).view(B, T, Hkv, Dh).transpose(1, 2)
        v = self.w_v(x).view(B, T, Hkv, Dh).transpose(1, 2)
{body}
"""


def init_checking_only(condition: str) -> str:
    """A GroupedQueryAttention whose __init__ raises ValueError for `condition` and for nothing else."""
    return f"""
class GroupedQueryAttention(GroupedQueryAttention):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        if {condition}:
            raise ValueError("invalid head counts")
        nn.Module.__init__(self)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, embed_dim // num_heads
        kv = num_kv_heads * self.head_dim
        self.w_q, self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias), nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_k, self.w_v = nn.Linear(embed_dim, kv, bias=bias), nn.Linear(embed_dim, kv, bias=bias)
"""


REFERENCE_MODULE_END = """\
        y = grouped_attention(q, k, v, mask)
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))"""

BUGGY = [
    # -- repeat_kv ------------------------------------------------------------------------
    Variant("repeat_kv_tiled", "def repeat_kv(x, n_rep):\n    return x.repeat(1, n_rep, 1, 1)", "repeat_kv", "repeat_kv.tiled"),
    Variant("repeat_kv_expand_before_heads",  # Llama's expand with the new axis on the wrong side of the heads: a tile
            "def repeat_kv(x, n_rep):\n    B, H, T, Dh = x.shape\n"
            "    return x[:, None].expand(B, n_rep, H, T, Dh).reshape(B, n_rep * H, T, Dh)", "repeat_kv", "repeat_kv.tiled"),
    Variant("repeat_kv_token_axis", "def repeat_kv(x, n_rep):\n    return x.repeat_interleave(n_rep, dim=2)",
            "repeat_kv", "repeat_kv.token_axis"),
    Variant("repeat_kv_batch_axis", "def repeat_kv(x, n_rep):\n    return torch.repeat_interleave(x, n_rep, 0)",
            "repeat_kv", "repeat_kv.batch_axis"),
    Variant("repeat_kv_no_dim", "def repeat_kv(x, n_rep):\n    return x.repeat_interleave(n_rep)", "repeat_kv", "repeat_kv.flattened"),
    Variant("repeat_kv_copies_after_tokens",  # the copies stacked after the token axis: the reshape folds tokens into heads
            "def repeat_kv(x, n_rep):\n    B, H, T, Dh = x.shape\n"
            "    return torch.stack([x] * n_rep, dim=3).reshape(B, H * n_rep, T, Dh)", "repeat_kv", "repeat_kv.copies_after_tokens"),
    Variant("repeat_kv_expand_view",  # view() cannot merge an expanded (stride 0) axis
            "def repeat_kv(x, n_rep):\n    B, H, T, Dh = x.shape\n"
            "    return x[:, :, None].expand(B, H, n_rep, T, Dh).view(B, H * n_rep, T, Dh)", "repeat_kv", "view_non_contiguous"),
    # -- grouped_attention ----------------------------------------------------------------
    Variant("grouped_attention_tiled", attention_with(REFERENCE_SCORES.replace(
        "k, v = repeat_kv(k, G), repeat_kv(v, G)", "k, v = k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1)")),
            "grouped_attention", "grouped_attention.head_mapping"),
    Variant("grouped_attention_groups_first",  # q grouped as (B, G, Hkv, ...): query head h reads KV head h % Hkv
            attention_with("""\
    B, Hq, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scores = (q.view(B, G, Hkv, Tq, Dh) @ k[:, None].transpose(-2, -1)).reshape(B, Hq, Tq, Tk) / math.sqrt(Dh)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    v = v.repeat(1, G, 1, 1)"""), "grouped_attention", "grouped_attention.head_mapping"),
    Variant("grouped_attention_scaled_by_query_width", attention_with(REFERENCE_SCORES.replace(
        "math.sqrt(Dh)", "math.sqrt(q.shape[1] * Dh)")), "grouped_attention", "grouped_attention.scaled_by_query_width"),
    Variant("grouped_attention_scaled_by_kv_width", attention_with("""\
    scores = q @ repeat_kv(k, G).transpose(-2, -1) / math.sqrt(k.shape[1] * Dh)  # k before the repeat: Hkv·Dh wide
    v = repeat_kv(v, G)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))"""), "grouped_attention", "grouped_attention.scaled_by_kv_width"),
    Variant("grouped_attention_unscaled", attention_with(REFERENCE_SCORES.replace(" / math.sqrt(Dh)", "")),
            "grouped_attention", "grouped_attention.unscaled"),
    Variant("grouped_attention_mask_inverted", attention_with(REFERENCE_SCORES.replace("~mask", "mask")),
            "grouped_attention", "grouped_attention.mask_inverted"),
    Variant("grouped_attention_grouped_mask",  # the grouped reshape, with the mask applied to the 5-D scores
            attention_with("""\
    B, Hq, Tq, _ = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    scores = q.view(B, Hkv, G, Tq, Dh) @ k[:, :, None].transpose(-2, -1) / math.sqrt(Dh)  # (B, Hkv, G, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    scores = scores.reshape(B, Hq, Tq, Tk)
    v = repeat_kv(v, G)"""), "grouped_attention", "grouped_attention.mask_misaligned"),
    Variant("grouped_attention_mask_head_order",  # the mask's heads unflattened as (G, Hkv), swapped, flattened again
            attention_with("""\
    k, v = repeat_kv(k, G), repeat_kv(v, G)
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
    if mask is not None:
        B, Hq, Tq, Tk = scores.shape
        m = mask.expand(B, Hq, Tq, Tk).unflatten(1, (G, Hq // G)).transpose(1, 2).flatten(1, 2)
        scores = scores.masked_fill(m.logical_not(), float("-inf"))"""), "grouped_attention", "grouped_attention.mask_head_order"),
    Variant("grouped_attention_softmax_query_axis", attention_with(REFERENCE_SCORES).replace("dim=-1", "dim=-2"),
            "grouped_attention", "grouped_attention.softmax_query_axis"),
    Variant("grouped_attention_minus_1e9", attention_with(REFERENCE_SCORES.replace('float("-inf")', "-1e9")),
            "grouped_attention", "grouped_attention.finite_fill"),
    Variant("grouped_attention_nan_rows", attention_with(REFERENCE_SCORES).replace(".nan_to_num(0.0)", ""),
            "grouped_attention", "grouped_attention.nan_rows"),
    Variant("grouped_attention_values_not_repeated", attention_with(REFERENCE_SCORES.replace(
        "k, v = repeat_kv(k, G), repeat_kv(v, G)", "k = repeat_kv(k, G)")),
            "grouped_attention", "grouped_attention.values_not_repeated"),
    Variant("grouped_attention_left_grouped",  # the grouped reshape, never flattened back to (B, Hq, Tq, Dh)
            """
def grouped_attention(q, k, v, mask=None):
    B, Hq, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    s = q.view(B, Hkv, G, Tq, Dh) @ k[:, :, None].transpose(-2, -1) / math.sqrt(Dh)
    if mask is not None:
        s = s.masked_fill(~mask.expand(B, Hq, Tq, Tk).reshape(B, Hkv, G, Tq, Tk), float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v[:, :, None]
""", "grouped_attention", "axis_extra"),
    # -- GroupedQueryAttention ------------------------------------------------------------
    Variant("module_full_width_kv", """
class GroupedQueryAttention(GroupedQueryAttention):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__(embed_dim, num_heads, num_kv_heads, bias)
        self.w_k = nn.Linear(embed_dim, embed_dim, bias=bias)  # the multi-head habit
        self.w_v = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (w(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        return self.w_o(grouped_attention(q, k, v, mask).transpose(1, 2).reshape(B, T, D))
""", "GroupedQueryAttention", "GroupedQueryAttention.kv_full_width"),
    Variant("module_scaled_by_embed_dim", module_with("""\
        G = Hq // Hkv
        k, v = repeat_kv(k, G), repeat_kv(v, G)
        s = q @ k.transpose(-2, -1) / math.sqrt(D)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        y = torch.softmax(s, -1).nan_to_num(0.0) @ v
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))"""), "GroupedQueryAttention", "GroupedQueryAttention.scaled_by_embed_dim"),
    Variant("module_tiled", module_with(REFERENCE_MODULE_END.replace(
        "y = grouped_attention(q, k, v, mask)",
        "G = Hq // Hkv\n        y = grouped_attention(q, k.repeat(1, G, 1, 1), v.repeat(1, G, 1, 1), mask)")),
            "GroupedQueryAttention", "GroupedQueryAttention.head_mapping"),
    Variant("module_mask_ignored", module_with(REFERENCE_MODULE_END.replace("(q, k, v, mask)", "(q, k, v)")),
            "GroupedQueryAttention", "GroupedQueryAttention.mask_ignored"),
    Variant("module_no_output_projection", module_with(REFERENCE_MODULE_END.replace(
        "return self.w_o(y.transpose(1, 2).reshape(B, T, D))", "return y.transpose(1, 2).reshape(B, T, D)")),
            "GroupedQueryAttention", "GroupedQueryAttention.no_output_projection"),
    Variant("module_split_no_transpose", """
class GroupedQueryAttention(GroupedQueryAttention):
    def forward(self, x, mask=None):
        B, T, D = x.shape
        Hq, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.w_q(x).view(B, Hq, T, Dh)  # straight to (B, H, T, Dh): tokens and heads mixed
        k = self.w_k(x).view(B, Hkv, T, Dh)
        v = self.w_v(x).view(B, Hkv, T, Dh)
        return self.w_o(grouped_attention(q, k, v, mask).transpose(1, 2).reshape(B, T, D))
""", "GroupedQueryAttention", "GroupedQueryAttention.split_no_transpose"),
    Variant("module_merge_no_transpose", module_with(REFERENCE_MODULE_END.replace(
        "y.transpose(1, 2).reshape(B, T, D)", "y.reshape(B, T, -1)")), "GroupedQueryAttention", "GroupedQueryAttention.merge_no_transpose"),
    Variant("module_kv_split_into_query_heads", """
class GroupedQueryAttention(GroupedQueryAttention):
    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (w(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        return self.w_o(grouped_attention(q, k, v, mask).transpose(1, 2).reshape(B, T, D))
""", "GroupedQueryAttention", "GroupedQueryAttention.kv_split_into_query_heads"),
    Variant("module_llama_names", """
class GroupedQueryAttention(GroupedQueryAttention):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__(embed_dim, num_heads, num_kv_heads, bias)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = self.w_q, self.w_k, self.w_v, self.w_o  # Llama's names
        del self.w_q, self.w_k, self.w_v, self.w_o

    def forward(self, x, mask=None):
        self.w_q, self.w_k, self.w_v, self.w_o = self.q_proj, self.k_proj, self.v_proj, self.o_proj
        return super().forward(x, mask)
""", "GroupedQueryAttention", "layer_names"),
    Variant("module_no_width_check", init_checking_only("num_heads % num_kv_heads"),
            "GroupedQueryAttention", "GroupedQueryAttention.no_width_check"),
    Variant("module_no_kv_heads_check", init_checking_only("embed_dim % num_heads"),
            "GroupedQueryAttention", "GroupedQueryAttention.no_kv_heads_check"),
    # -- found by the search (grader/engine/search.py), the defaults check, new names -------
    Variant("repeat_kv_expand_heads", """
def repeat_kv(x, n_rep):
    B, H, T, D = x.shape
    return x.expand(B, H * n_rep, T, D)
""", "repeat_kv", "expand_non_singleton"),
    Variant("grouped_kv_not_repeated", attention_with("""\
    scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))"""), "grouped_attention",
        "grouped_attention.kv_heads_not_lined_up"),
    Variant("grouped_keys_as_values", attention_with(REFERENCE_SCORES).replace("@ v\n", "@ k\n"),
            "grouped_attention", "argument_duplicated"),
    Variant("module_values_from_w_k", module_with("""\
        v = self.w_k(x).view(B, T, Hkv, Dh).transpose(1, 2)
        y = grouped_attention(q, k, v, mask)
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))"""), "GroupedQueryAttention", "argument_duplicated"),
    Variant("grouped_attention_scaled_by_key_length", attention_with(REFERENCE_SCORES.replace(
        "math.sqrt(Dh)", "math.sqrt(k.shape[-2])")), "grouped_attention", "scaled_by_wrong_size"),
    Variant("module_query_layer_default_bias", """
class GroupedQueryAttention(GroupedQueryAttention):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
        super().__init__(embed_dim, num_heads, num_kv_heads, bias)
        self.w_q = nn.Linear(embed_dim, embed_dim)  # bias=True whatever the bias argument says
""", "GroupedQueryAttention", "parameters_not_loaded"),
    Variant("module_default_bias_true", """
class GroupedQueryAttention(GroupedQueryAttention):
    def __init__(self, embed_dim, num_heads, num_kv_heads, bias=True):
        super().__init__(embed_dim, num_heads, num_kv_heads, bias)
""", "GroupedQueryAttention", "constructor_defaults"),
    Variant("grouped_mask_multiplied", attention_with(REFERENCE_SCORES.replace(
        'scores.masked_fill(~mask, float("-inf"))', "scores * mask")), "grouped_attention",
        "grouped_attention.mask_multiplied"),
]

RULES_ONLY = [
    Variant("grouped_attention_sdpa", """
import torch.nn.functional as F

def grouped_attention(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
""", "grouped_attention", "forbidden_call"),
    Variant("module_sdpa", module_with("""\
        import torch.nn.functional as F
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))"""), "GroupedQueryAttention", "forbidden_call"),
]

CORRECT = [
    Variant(
        "grouped_reshape",  # no repeat_kv at all: q grouped as (B, Hkv, G, Tq, Dh), each KV head broadcast over its group
        """
        def grouped_attention(q, k, v, mask=None):
            B, Hq, Tq, Dh = q.shape
            Hkv, Tk = k.shape[1], k.shape[2]
            G = Hq // Hkv
            qg = q.reshape(B, Hkv, G, Tq, Dh)  # query head h = (h // G, h % G)
            s = qg @ k.unsqueeze(2).transpose(-2, -1) * Dh ** -0.5  # (B, Hkv, G, Tq, Tk)
            s = s.reshape(B, Hq, Tq, Tk)  # back to one axis of query heads, where the mask lines up
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            w = torch.softmax(s, dim=-1).nan_to_num(0.0).reshape(B, Hkv, G, Tq, Tk)
            return (w @ v.unsqueeze(2)).reshape(B, Hq, Tq, Dh)
        """,
    ),
    Variant(
        "einsum_and_expand",  # Llama's repeat_kv (expand + reshape, x itself for n_rep == 1); einsum over the groups
        """
        def repeat_kv(x, n_rep):
            if n_rep == 1:
                return x
            B, Hkv, T, Dh = x.shape
            return x[:, :, None, :, :].expand(B, Hkv, n_rep, T, Dh).reshape(B, Hkv * n_rep, T, Dh)

        def grouped_attention(q, k, v, mask=None):
            B, Hq, Tq, Dh = q.shape
            Hkv = k.shape[1]
            qg = q.unflatten(1, (Hkv, Hq // Hkv))  # (B, Hkv, G, Tq, Dh)
            s = torch.einsum("bhgqd,bhkd->bhgqk", qg, k).flatten(1, 2) / math.sqrt(Dh)  # (B, Hq, Tq, Tk)
            if mask is not None:
                s = torch.where(mask, s, float("-inf"))
            m = s.amax(-1, keepdim=True)
            e = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
            w = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
            return torch.einsum("bhgqk,bhkd->bhgqd", w.unflatten(1, (Hkv, Hq // Hkv)), v).flatten(1, 2)
        """,
    ),
    Variant(
        "index_select_mapping",  # the mapping written out: KV head index h // G for every query head h
        """
        def repeat_kv(x, n_rep):
            index = torch.arange(x.shape[1] * n_rep, device=x.device) // n_rep
            return x.index_select(1, index)
        """,
    ),
    Variant(
        "lazy_linear_module",  # nn.LazyLinear layers (they are nn.Linear), one matmul for k and v, heads split with unflatten
        """
        class GroupedQueryAttention(nn.Module):
            def __init__(self, embed_dim, num_heads, num_kv_heads, bias=False):
                super().__init__()
                if embed_dim % num_heads or num_heads % num_kv_heads:
                    raise ValueError("num_heads must divide embed_dim and num_kv_heads must divide num_heads")
                self.h, self.h_kv, self.dh = num_heads, num_kv_heads, embed_dim // num_heads
                self.w_q = nn.LazyLinear(embed_dim, bias=bias)
                self.w_k = nn.LazyLinear(num_kv_heads * self.dh, bias=bias)
                self.w_v = nn.LazyLinear(num_kv_heads * self.dh, bias=bias)
                self.w_o = nn.LazyLinear(embed_dim, bias=bias)

            def forward(self, x, mask=None):
                q = self.w_q(x).unflatten(-1, (self.h, self.dh)).transpose(1, 2)
                w = torch.cat([self.w_k.weight, self.w_v.weight])
                kv = x @ w.T
                if self.w_k.bias is not None:
                    kv = kv + torch.cat([self.w_k.bias, self.w_v.bias])
                k, v = (t.unflatten(-1, (self.h_kv, self.dh)).transpose(1, 2) for t in kv.chunk(2, dim=-1))
                return self.w_o(grouped_attention(q, k, v, mask).transpose(1, 2).flatten(2))
        """,
    ),
    Variant(
        "loop_over_kv_heads",  # one KV head at a time, with its group of query heads
        """
        class GroupedQueryAttention(GroupedQueryAttention):
            def forward(self, x, mask=None):
                B, T, D = x.shape
                Hq, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
                G = Hq // Hkv
                q = self.w_q(x).view(B, T, Hq, Dh).transpose(1, 2)
                k = self.w_k(x).view(B, T, Hkv, Dh).transpose(1, 2)
                v = self.w_v(x).view(B, T, Hkv, Dh).transpose(1, 2)
                m = None if mask is None else mask.expand(B, Hq, T, T)
                outs = []
                for j in range(Hkv):
                    group = slice(j * G, (j + 1) * G)
                    s = q[:, group] @ k[:, j:j + 1].transpose(-2, -1) / math.sqrt(Dh)
                    if m is not None:
                        s = s.masked_fill(~m[:, group], float("-inf"))
                    outs.append(torch.softmax(s, -1).nan_to_num(0.0) @ v[:, j:j + 1])
                return self.w_o(torch.cat(outs, dim=1).transpose(1, 2).reshape(B, T, D))
        """,
    ),
]

DEVICE_BUGGY = [
    Variant("grouped_attention_zeros_on_cpu",  # the NaN rows replaced with zeros made without device=
            attention_with(REFERENCE_SCORES).replace(
                "    return torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v",
                "    w = torch.softmax(scores, dim=-1)\n    w = torch.where(torch.isnan(w), torch.zeros(w.shape, dtype=w.dtype), w)\n"
                "    return w @ v"),
            "grouped_attention", "tensor_on_cpu"),
]
