"""Candidates for `rope` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant


def module_with(middle: str) -> str:
    """A RotarySelfAttention whose forward projects as the reference does, then runs `middle`, then attends."""
    return f"""
class RotarySelfAttention(RotarySelfAttention):
    def forward(self, x, positions=None, mask=None):
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        if positions is None:
            positions = torch.arange(T, device=x.device)
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
{middle}
        s = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        y = (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v).transpose(1, 2).reshape(B, T, D)
        return self.w_o(y)
"""


SPLIT = """\
        q, k, v = (t.view(B, T, H, Dh).transpose(1, 2) for t in (q, k, v))
"""
REFERENCE_MIDDLE = SPLIT + """\
        cos, sin = rope_cos_sin(positions, Dh, self.base)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)"""

BUGGY = [
    # -- rope_frequencies -----------------------------------------------------------------
    Variant("frequencies_i_over_d", """
def rope_frequencies(head_dim, base=10000.0):
    i = torch.arange(head_dim // 2, dtype=torch.float32)
    return 1.0 / base ** (i / head_dim)
""", "rope_frequencies", "rope_frequencies.i_over_d"),
    Variant("frequencies_positive_exponent", """
def rope_frequencies(head_dim, base=10000.0):
    return base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
""", "rope_frequencies", "rope_frequencies.exponent_sign"),
    Variant("frequencies_integer_division", """
def rope_frequencies(head_dim, base=10000.0):
    exponent = torch.arange(0, head_dim, 2) // head_dim  # integers: 0 for every pair
    return 1.0 / base ** exponent.float()
""", "rope_frequencies", "rope_frequencies.integer_division"),
    Variant("frequencies_full_width", """
def rope_frequencies(head_dim, base=10000.0):
    return 1.0 / base ** (torch.arange(head_dim, dtype=torch.float32) / head_dim)
""", "rope_frequencies", None),
    Variant("frequencies_two_known_bases", """
def rope_frequencies(head_dim, base=10000.0):
    base = 500000.0 if base > 10000.0 else 10000.0  # Llama 2's base or Llama 3's: the two configs we serve
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
""", "rope_frequencies", None),
    # -- rope_cos_sin ---------------------------------------------------------------------
    Variant("cos_sin_repeat_interleave", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    angles = torch.outer(positions.float(), rope_frequencies(head_dim, base)).repeat_interleave(2, dim=-1)
    return angles.cos(), angles.sin()
""", "rope_cos_sin", "rope_cos_sin.interleaved_layout"),
    Variant("cos_sin_not_duplicated", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    angles = positions.float()[:, None] * rope_frequencies(head_dim, base)[None, :]
    return angles.cos(), angles.sin()
""", "rope_cos_sin", "rope_cos_sin.not_duplicated"),
    Variant("cos_sin_arange", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    t = torch.arange(len(positions), dtype=torch.float32)  # the usual cache of Llama, without the positions
    angles = torch.outer(t, rope_frequencies(head_dim, base))
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()
""", "rope_cos_sin", "rope_cos_sin.positions_ignored"),
    Variant("cos_sin_bfloat16_phases", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    theta = rope_frequencies(head_dim, base).to(torch.bfloat16)  # the model's dtype, as in gpt-neox issue 1003
    angles = positions.to(torch.bfloat16)[:, None] * theta[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()
""", "rope_cos_sin", "rope_cos_sin.low_precision_phases"),
    Variant("cos_sin_bfloat16_positions", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    p = positions.to(torch.bfloat16).float()  # "small integers are exact": only up to 256
    angles = p[:, None] * rope_frequencies(head_dim, base)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()
""", "rope_cos_sin", "rope_cos_sin.low_precision_phases"),
    Variant("rotate_half_four_dims", """
def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[:, :, :, half:], x[:, :, :, :half]), dim=-1)
""", "rotate_half", "fixed_rank"),
    Variant("cos_sin_swapped", """
def rope_cos_sin(positions, head_dim, base=10000.0):
    angles = positions.float()[:, None] * rope_frequencies(head_dim, base)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.sin(), angles.cos()
""", "rope_cos_sin", "rope_cos_sin.swapped"),
    # -- rotate_half ----------------------------------------------------------------------
    Variant("rotate_half_sign_flipped", """
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)
""", "rotate_half", "rotate_half.sign_flipped"),
    Variant("rotate_half_no_negation", """
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1)
""", "rotate_half", "rotate_half.no_negation"),
    Variant("rotate_half_every_two", """
def rotate_half(x):
    x1, x2 = x[..., ::2], x[..., 1::2]  # GPT-J's rotate_every_two
    return torch.stack((-x2, x1), dim=-1).flatten(-2)
""", "rotate_half", "rotate_half.interleaved_layout"),
    Variant("rotate_half_stacked", """
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.stack((-x2, x1), dim=-1)
""", "rotate_half", None),
    # -- apply_rope -----------------------------------------------------------------------
    Variant("apply_rope_every_two", """
def apply_rope(x, cos, sin):
    xf = x.float()
    rotated = torch.stack((-xf[..., 1::2], xf[..., ::2]), dim=-1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)
""", "apply_rope", "apply_rope.interleaved_layout"),
    Variant("apply_rope_in_bfloat16", """
def apply_rope(x, cos, sin):
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # the tables cast down: the math runs in x's dtype
    return x * cos + rotate_half(x) * sin
""", "apply_rope", "apply_rope.low_precision_math"),
    Variant("apply_rope_minus", """
def apply_rope(x, cos, sin):
    xf = x.float()
    return (xf * cos - rotate_half(xf) * sin).to(x.dtype)
""", "apply_rope", "apply_rope.sign_flipped"),
    Variant("apply_rope_swapped", """
def apply_rope(x, cos, sin):
    xf = x.float()
    return (xf * sin + rotate_half(xf) * cos).to(x.dtype)
""", "apply_rope", "apply_rope.cos_sin_swapped"),
    Variant("apply_rope_unsqueezed_for_tokens_first", """
def apply_rope(x, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # HF's unsqueeze_dim for (B, T, H, Dh): the heads are axis 1 here
    xf = x.float()
    return (xf * cos + rotate_half(xf) * sin).to(x.dtype)
""", "apply_rope", None),
    # -- apply_rope_interleaved -----------------------------------------------------------
    Variant("interleaved_not_flattened", """
def apply_rope_interleaved(x, positions, base=10000.0):
    angles = positions.float()[:, None] * rope_frequencies(x.shape[-1], base)
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)).to(x.dtype)  # (..., Dh/2, 2)
""", "apply_rope_interleaved", None),
    Variant("interleaved_half_layout", """
def apply_rope_interleaved(x, positions, base=10000.0):
    cos, sin = rope_cos_sin(positions, x.shape[-1], base)
    return apply_rope(x, cos, sin)
""", "apply_rope_interleaved", "apply_rope_interleaved.half_layout"),
    Variant("interleaved_conjugate", """
def apply_rope_interleaved(x, positions, base=10000.0):
    angles = positions.float()[:, None] * rope_frequencies(x.shape[-1], base)
    rot = torch.polar(torch.ones_like(angles), -angles)  # the conjugate: turns the other way
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)
""", "apply_rope_interleaved", "apply_rope_interleaved.sign_flipped"),
    Variant("interleaved_arange", """
def apply_rope_interleaved(x, positions, base=10000.0):
    t = torch.arange(x.shape[-2], device=x.device, dtype=torch.float32)
    angles = t[:, None] * rope_frequencies(x.shape[-1], base)
    cos, sin = angles.cos(), angles.sin()
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
""", "apply_rope_interleaved", "apply_rope_interleaved.positions_ignored"),
    Variant("interleaved_i_over_d", """
def apply_rope_interleaved(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = 1.0 / base ** (torch.arange(d // 2, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * theta
    cos, sin = angles.cos(), angles.sin()
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
""", "apply_rope_interleaved", "apply_rope_interleaved.i_over_d"),
    Variant("interleaved_phases_in_x_dtype", """
def apply_rope_interleaved(x, positions, base=10000.0):
    theta = rope_frequencies(x.shape[-1], base).to(x.dtype)
    angles = positions.to(x.dtype)[:, None] * theta  # bfloat16 angles for a bfloat16 x
    cos, sin = angles.float().cos(), angles.float().sin()
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).to(x.dtype)
""", "apply_rope_interleaved", "apply_rope_interleaved.low_precision_phases"),
    # -- RotarySelfAttention --------------------------------------------------------------
    Variant("module_interleaved", module_with(SPLIT + """\
        q, k = apply_rope_interleaved(q, positions, self.base), apply_rope_interleaved(k, positions, self.base)"""),
            "RotarySelfAttention", "RotarySelfAttention.interleaved_layout"),
    Variant("module_rope_on_v", module_with(REFERENCE_MIDDLE + "\n        v = apply_rope(v, cos, sin)"),
            "RotarySelfAttention", "RotarySelfAttention.rope_on_v"),
    Variant("module_rope_before_split", module_with("""\
        cos, sin = rope_cos_sin(positions, D, self.base)  # over the whole width
        q, k = (apply_rope(t[:, None], cos, sin)[:, 0] for t in (q, k))
""" + SPLIT.rstrip("\n")), "RotarySelfAttention", "RotarySelfAttention.rope_before_head_split"),
    Variant("module_positions_ignored", module_with(SPLIT + """\
        cos, sin = rope_cos_sin(torch.arange(T, device=x.device), Dh, self.base)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)"""), "RotarySelfAttention", "RotarySelfAttention.positions_ignored"),
    Variant("module_rope_on_q_only", module_with(SPLIT + """\
        cos, sin = rope_cos_sin(positions, Dh, self.base)
        q = apply_rope(q, cos, sin)"""), "RotarySelfAttention", "RotarySelfAttention.rope_on_q_only"),
    Variant("module_no_width_check", """
class RotarySelfAttention(RotarySelfAttention):
    def __init__(self, embed_dim, num_heads, base=10000.0, bias=False):
        nn.Module.__init__(self)
        self.num_heads, self.head_dim, self.base = num_heads, embed_dim // num_heads, base
        self.w_q, self.w_k, self.w_v, self.w_o = (nn.Linear(embed_dim, embed_dim, bias=bias) for _ in range(4))
""", "RotarySelfAttention", "RotarySelfAttention.no_width_check"),
    Variant("module_llama_names", """
class RotarySelfAttention(RotarySelfAttention):
    def __init__(self, embed_dim, num_heads, base=10000.0, bias=False):
        super().__init__(embed_dim, num_heads, base, bias)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = self.w_q, self.w_k, self.w_v, self.w_o
        del self.w_q, self.w_k, self.w_v, self.w_o

    def forward(self, x, positions=None, mask=None):
        self.w_q, self.w_k, self.w_v, self.w_o = self.q_proj, self.k_proj, self.v_proj, self.o_proj
        return super().forward(x, positions, mask)
""", "RotarySelfAttention", "layer_names"),
    # -- found by the search (grader/engine/search.py), the defaults check, new names -------
    Variant("frequencies_base_ignored", """
def rope_frequencies(head_dim, base=10000.0):
    return 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
""", "rope_frequencies", "argument_ignored"),
    Variant("frequencies_pair_index_from_one", """
def rope_frequencies(head_dim, base=10000.0):
    return 1.0 / (base ** (torch.arange(2, head_dim + 1, 2, dtype=torch.float32) / head_dim))
""", "rope_frequencies", "rope_frequencies.pair_index_from_one"),
    Variant("frequencies_linspace", """
def rope_frequencies(head_dim, base=10000.0):
    return 1.0 / (base ** torch.linspace(0, 1, head_dim // 2, dtype=torch.float32))
""", "rope_frequencies", "rope_frequencies.linspace_endpoint"),
    Variant("interleaved_pairs_put_back_with_cat", """
def apply_rope_interleaved(x, positions, base=10000.0):
    angles = positions.float()[:, None] * rope_frequencies(x.shape[-1], base)
    cos, sin = angles.cos(), angles.sin()
    a, b = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1).to(x.dtype)
""", "apply_rope_interleaved", "apply_rope_interleaved.pairs_not_interleaved"),
    Variant("module_base_ignored", module_with(SPLIT + """\
        cos, sin = rope_cos_sin(positions, Dh)  # the default base, whatever the module was built with
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)"""), "RotarySelfAttention",
            "RotarySelfAttention.base_ignored"),
    Variant("module_default_bias_true", """
class RotarySelfAttention(RotarySelfAttention):
    def __init__(self, embed_dim, num_heads, base=10000.0, bias=True):
        super().__init__(embed_dim, num_heads, base, bias)
""", "RotarySelfAttention", "constructor_defaults"),
]

DEVICE_BUGGY = [
    Variant("module_default_positions_on_cpu", module_with(REFERENCE_MIDDLE).replace(
        "torch.arange(T, device=x.device)", "torch.arange(T)"), "RotarySelfAttention", None),
]

CORRECT = [
    Variant(
        "exp_log_and_polar",  # θ as exp(−log(base)·2i/d) (differs from 1/base**x by an ulp), cos/sin via torch.polar,
        # and the interleaved layout with view_as_complex, as Meta's Llama writes it
        """
        def rope_frequencies(head_dim, base=10000.0):
            return torch.exp(-math.log(base) * torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)

        def rope_cos_sin(positions, head_dim, base=10000.0):
            angles = torch.outer(positions.to(torch.float32), rope_frequencies(head_dim, base).to(positions.device))
            z = torch.polar(torch.ones_like(angles), angles)
            z = torch.cat((z, z), dim=-1)
            return z.real.contiguous(), z.imag.contiguous()

        def apply_rope_interleaved(x, positions, base=10000.0):
            work = torch.float64 if x.dtype == torch.float64 else torch.float32
            d = x.shape[-1]
            theta = torch.exp(-math.log(base) * torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
            angles = torch.outer(positions.to(device=x.device, dtype=torch.float32), theta).to(work)
            freqs_cis = torch.polar(torch.ones_like(angles), angles)  # (T, Dh/2) complex
            xc = torch.view_as_complex(x.to(work).reshape(*x.shape[:-1], d // 2, 2).contiguous())
            return torch.view_as_real(xc * freqs_cis).flatten(-2).to(x.dtype)
        """,
    ),
    Variant(
        "chunk_and_index",  # rotate_half by index and negation, apply_rope in place on a float copy, a module with
        # one fused projection for q, k and v
        """
        def rotate_half(x):
            h = x.shape[-1] // 2
            index = torch.cat((torch.arange(h, 2 * h), torch.arange(h))).to(x.device)
            sign = torch.cat((-torch.ones(h), torch.ones(h))).to(device=x.device, dtype=x.dtype)
            return x.index_select(-1, index) * sign

        def apply_rope(x, cos, sin):
            out = x.float() if x.dtype != torch.float64 else x.clone()
            out = out * cos.to(out.dtype)
            out.addcmul_(rotate_half(x.to(out.dtype)), sin.to(out.dtype))
            return out.to(x.dtype)

        class RotarySelfAttention(RotarySelfAttention):
            def forward(self, x, positions=None, mask=None):
                B, T, D = x.shape
                H, Dh = self.num_heads, self.head_dim
                if positions is None:
                    positions = torch.arange(T, device=x.device)
                w = torch.cat((self.w_q.weight, self.w_k.weight, self.w_v.weight))
                qkv = x @ w.T
                if self.w_q.bias is not None:
                    qkv = qkv + torch.cat((self.w_q.bias, self.w_k.bias, self.w_v.bias))
                q, k, v = (t.unflatten(-1, (H, Dh)).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
                cos, sin = rope_cos_sin(positions, Dh, self.base)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
                s = torch.einsum("bhqd,bhkd->bhqk", q, k) * Dh ** -0.5
                if mask is not None:
                    s = torch.where(mask, s, float("-inf"))
                return self.w_o(torch.softmax(s, -1).nan_to_num(0.0).matmul(v).transpose(1, 2).flatten(2))
        """,
    ),
    Variant(
        "sdpa_module",  # RoPE by hand, the attention itself by torch (the exercise allows it)
        """
        import torch.nn.functional as F

        class RotarySelfAttention(RotarySelfAttention):
            def forward(self, x, positions=None, mask=None):
                B, T, D = x.shape
                H, Dh = self.num_heads, self.head_dim
                if positions is None:
                    positions = torch.arange(T, device=x.device)
                q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
                cos, sin = rope_cos_sin(positions, Dh, self.base)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                return self.w_o(y.transpose(1, 2).reshape(B, T, D))
        """,
    ),
]
