"""Candidates for `mla` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.mha.variants import Variant

FORWARD = """
class MultiHeadLatentAttention(MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorbed=False):
        B, T, _ = x.shape
        H, Dn, Dr = self.num_heads, self.nope, self.rope
        past_len = 0 if cache is None else cache.length
        positions = torch.arange(past_len, past_len + T, device=x.device)
        q = self.w_q(x).view(B, T, H, Dn + Dr).transpose(1, 2)
        q_nope, q_rope = q.split([Dn, Dr], dim=-1)
        q_rope = apply_rope(q_rope, positions)
        c_kv, k_rope = compress_kv(x, self.w_dkv.weight, self.w_kr.weight, positions)
        if cache is not None:
            c_kv, k_rope = cache.append(c_kv, k_rope)
        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)
        if absorbed:
            return absorbed_attention(q_nope, q_rope, c_kv, k_rope, self.w_uk.weight, self.w_uv.weight,
                                      self.w_o.weight, mask)
        k_nope, v = expand_kv(c_kv, self.w_uk.weight, self.w_uv.weight, H)
        scores = mla_scores(q_nope, q_rope, k_nope, k_rope).masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.w_o(y.transpose(1, 2).reshape(B, T, H * self.v_dim))
"""


def forward_with(old: str, new: str) -> str:
    """The reference's forward with one piece of it replaced (which must be there)."""
    assert old in FORWARD, old
    return FORWARD.replace(old, new)


def append_with(body: str) -> str:
    return f"""
class LatentCache(LatentCache):
    def append(self, c_kv_new, k_rope_new):
        t = c_kv_new.shape[1]
{body}
"""


def bytes_with(mha: str = "2 * num_heads * head_dim", gqa: str = "2 * num_kv_heads * head_dim",
               mla: str = "kv_lora_rank + qk_rope_head_dim", item: str = "dtype.itemsize") -> str:
    return f"""
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    per_layer = {{"mha": {mha}, "gqa": {gqa}, "mla": {mla}}}[attention]
    return num_layers * per_layer * {item}
"""


def absorbed_with(old: str, new: str) -> str:
    code = """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    R, D = c_kv.shape[-1], w_o.shape[0]
    q_latent = q_nope @ w_uk.view(H, Dn, R)
    latents = c_kv.unsqueeze(1)
    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    scores = scores / math.sqrt(Dn + Dr)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out_latent = torch.softmax(scores, dim=-1) @ latents
    y = out_latent @ w_uv.view(H, -1, R).transpose(-2, -1)
    return y.transpose(1, 2).reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T
"""
    assert old in code, old
    return code.replace(old, new)


def scores_with(expression: str) -> str:
    return f"""
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    nope = q_nope @ k_nope.transpose(-2, -1)
    rope = q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    return {expression}
"""


BUGGY = [
    # -- compress_kv --------------------------------------------------------------------------
    Variant("compress_rope_on_latent", """
def compress_kv(x, w_dkv, w_kr, positions):
    return apply_rope(x @ w_dkv.T, positions), apply_rope(x @ w_kr.T, positions)
""", "compress_kv", "compress_kv.rope_on_latent"),
    Variant("compress_fused_split_reversed", """
def compress_kv(x, w_dkv, w_kr, positions):
    fused = x @ torch.cat([w_dkv, w_kr]).T  # one matmul, (B, T, kv_lora_rank + qk_rope_head_dim)
    k_pe, c_kv = fused.split([w_kr.shape[0], w_dkv.shape[0]], dim=-1)
    return c_kv, apply_rope(k_pe, positions)
""", "compress_kv", "compress_kv.fused_split_reversed"),  # the forty-seventh blind set's mla b01
    Variant("compress_rotated_before_projection", """
def compress_kv(x, w_dkv, w_kr, positions):
    return x @ w_dkv.T, apply_rope(x, positions) @ w_kr.T  # the forty-second blind set's b01
""", "compress_kv", "compress_kv.rope_before_projection"),
    Variant("compress_rope_not_applied", """
def compress_kv(x, w_dkv, w_kr, positions):
    return x @ w_dkv.T, x @ w_kr.T  # the rotation is left for later
""", "compress_kv", "compress_kv.rope_not_applied"),
    Variant("compress_positions_repeated_per_row", """
def compress_kv(x, w_dkv, w_kr, positions):
    B, T, D = x.shape
    flat = x.reshape(B * T, D)  # one matmul over every token, batch-major
    k_rope = apply_rope(flat @ w_kr.T, positions.repeat_interleave(B))  # each position B times in a row
    return x @ w_dkv.T, k_rope.view(B, T, -1)
""", "compress_kv", "compress_kv.positions_repeated_per_row"),
    Variant("compress_positions_ignored", """
def compress_kv(x, w_dkv, w_kr, positions):
    steps = torch.arange(x.shape[1], device=x.device)
    return x @ w_dkv.T, apply_rope(x @ w_kr.T, steps)
""", "compress_kv", "compress_kv.positions_ignored"),
    Variant("compress_weight_not_transposed", """
def compress_kv(x, w_dkv, w_kr, positions):
    c_kv = x @ w_dkv
    return c_kv, apply_rope(x @ w_kr.T, positions)
""", "compress_kv", "compress_kv.weight_not_transposed"),
    Variant("compress_positions_in_input_dtype", """
def compress_kv(x, w_dkv, w_kr, positions):
    positions = positions.to(x)  # to x's device, and its dtype too (blind set 56's b09)
    return x @ w_dkv.T, apply_rope(x @ w_kr.T, positions)
""", "compress_kv", "compress_kv.positions_rounded"),
    # -- expand_kv ----------------------------------------------------------------------------
    Variant("expand_flattened_with_view", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, R = c_kv.shape
    flat = c_kv.view(-1, R)  # needs contiguous memory: a cache's slice c_kv[:, :length] is not
    k = (flat @ w_uk.T).view(B, T, num_heads, -1).transpose(1, 2)
    v = (flat @ w_uv.T).view(B, T, num_heads, -1).transpose(1, 2)
    return k, v
""", "expand_kv", "view_non_contiguous"),
    Variant("expand_split_no_transpose", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    return (c_kv @ w_uk.T).reshape(B, num_heads, T, -1), (c_kv @ w_uv.T).reshape(B, num_heads, T, -1)
""", "expand_kv", "expand_kv.split_no_transpose"),
    Variant("expand_weight_viewed_per_head", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    latents = c_kv.unsqueeze(1)  # (B, 1, T, R)
    return latents @ w_uk.view(num_heads, c_kv.shape[-1], -1), latents @ w_uv.view(num_heads, c_kv.shape[-1], -1)
""", "expand_kv", "expand_kv.weight_viewed_per_head"),
    Variant("expand_product_transposed", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    k = (w_uk @ c_kv.transpose(1, 2)).reshape(B, num_heads, T, -1)  # the forty-eighth blind set's b02
    v = (w_uv @ c_kv.transpose(1, 2)).reshape(B, num_heads, T, -1)
    return k, v
""", "expand_kv", "expand_kv.product_transposed"),
    Variant("compress_fused_key_first_split_latent_first", """
def compress_kv(x, w_dkv, w_kr, positions):
    fused = x @ torch.cat([w_kr, w_dkv]).T  # the key's weight stacked first (the forty-eighth blind set's b01)
    c_kv, k_pe = fused.split([w_dkv.shape[0], w_kr.shape[0]], dim=-1)
    return c_kv, apply_rope(k_pe, positions)
""", "compress_kv", "compress_kv.fused_split_reversed"),
    Variant("expand_heads_inner", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    k = (c_kv @ w_uk.T).view(B, T, -1, num_heads).permute(0, 3, 1, 2)
    v = (c_kv @ w_uv.T).view(B, T, -1, num_heads).permute(0, 3, 1, 2)
    return k, v
""", "expand_kv", "expand_kv.heads_inner"),
    Variant("expand_weights_stacked", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    dn = w_uk.shape[0] // num_heads
    kv = (c_kv @ torch.cat([w_uk, w_uv]).T).view(B, T, num_heads, -1).transpose(1, 2)  # DeepSeek's kv_b_proj, stacked
    return kv[..., :dn], kv[..., dn:]
""", "expand_kv", "expand_kv.weights_stacked_not_interleaved"),
    Variant("expand_weight_not_transposed", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    k_nope = (c_kv @ w_uk).view(B, T, num_heads, -1).transpose(1, 2)
    v = (c_kv @ w_uv.T).view(B, T, num_heads, -1).transpose(1, 2)
    return k_nope, v
""", "expand_kv", "expand_kv.weight_not_transposed"),
    Variant("expand_outputs_swapped", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    k_nope = (c_kv @ w_uk.T).view(B, T, num_heads, -1).transpose(1, 2)
    v = (c_kv @ w_uv.T).view(B, T, num_heads, -1).transpose(1, 2)
    return v, k_nope
""", "expand_kv", "expand_kv.outputs_swapped"),
    Variant("expand_value_from_key_weight", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    k_nope = (c_kv @ w_uk.T).view(B, T, num_heads, -1).transpose(1, 2)
    v = (c_kv @ w_uk.T).view(B, T, num_heads, -1).transpose(1, 2)
    return k_nope, v
""", "expand_kv", "expand_kv.value_from_key_weight"),
    # -- mla_scores ---------------------------------------------------------------------------
    Variant("scores_scale_in_float32", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):  # a float32 scale: float64 scores off by 3e-8 of each value
    scores = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    return scores * torch.rsqrt(torch.tensor(float(q_nope.shape[-1] + q_rope.shape[-1])))
""", "mla_scores", "computed_in_float32"),
    Variant("scores_key_rotated_again", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    k_rope = apply_rope(k_rope, torch.arange(k_rope.shape[1]))  # taken for unrotated: rotated twice
    scores = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    return scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
""", "mla_scores", "mla_scores.key_rotated_again"),
    Variant("scores_masked_causal", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    scores = (q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1))
    scores = scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
    t_q, t_k = scores.shape[-2:]  # masked as decoding would: the forty-second blind set's b03
    later = torch.ones(t_q, t_k, dtype=torch.bool, device=scores.device).triu(t_k - t_q + 1)
    return scores.masked_fill(later, float("-inf"))
""", "mla_scores", "causal_unasked"),
    Variant("scores_softmax_applied", scores_with(
        "torch.softmax((nope + rope) / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1]), dim=-1)"),
            "mla_scores", "softmax_applied"),  # the forty-fifth blind set's b03
    Variant("scores_scale_precedence", scores_with("(nope + rope) * (q_nope.shape[-1] + q_rope.shape[-1] ** -0.5)"),
            "mla_scores", "mla_scores.scale_precedence"),
    Variant("scores_yarn_mscale", scores_with("(nope + rope) * (q_nope.shape[-1] + q_rope.shape[-1]) ** -0.5 * "
                                              "(0.1 * math.log(40.0) + 1.0) ** 2"),  # DeepSeek-V3's softmax_scale
            "mla_scores", "mla_scores.scaled_by_a_constant"),
    Variant("scores_scaled_by_nope", scores_with("(nope + rope) / math.sqrt(q_nope.shape[-1])"),
            "mla_scores", "mla_scores.scaled_by_nope"),
    Variant("scores_rope_summed_over_heads", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    rope = torch.einsum("bhqr,bkr->bqk", q_rope, k_rope).unsqueeze(1)  # h dropped: summed over the heads
    return (q_nope @ k_nope.transpose(-2, -1) + rope) / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
""", "mla_scores", "mla_scores.rope_part_summed_over_heads"),  # the forty-seventh blind set's b03
    Variant("scores_scaled_by_a_size", scores_with("(nope + rope) / math.sqrt(q_nope.shape[-1] + k_rope.size(1))"),
            "mla_scores", "mla_scores.scaled_by_a_size"),
    Variant("scores_unscaled", scores_with("nope + rope"), "mla_scores", "mla_scores.unscaled"),
    Variant("scores_rope_part_unscaled",
            scores_with("nope / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1]) + rope"),
            "mla_scores", "mla_scores.rope_part_unscaled"),
    Variant("scores_nope_part_unscaled", scores_with("nope + rope / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])"),
            "mla_scores", "mla_scores.nope_part_unscaled"),
    Variant("scores_scaled_per_part", scores_with("nope / math.sqrt(q_nope.shape[-1]) + rope / math.sqrt(q_rope.shape[-1])"),
            "mla_scores", "mla_scores.scaled_per_part"),
    Variant("scores_rope_part_dropped", scores_with("nope / math.sqrt(q_nope.shape[-1])"),
            "mla_scores", "mla_scores.rope_part_dropped"),
    Variant("scores_rope_key_heads_interleaved", scores_with("(nope + rope) / math.sqrt(q_nope.shape[-1] + "
                                                          "q_rope.shape[-1])").replace(
        "k_rope.unsqueeze(1)", "k_rope.repeat_interleave(q_nope.shape[1], dim=1).view(k_rope.shape[0], -1, "
        "*k_rope.shape[1:])"), "mla_scores", "mla_scores.rope_key_heads_interleaved"),
    Variant("scores_rope_key_not_shared", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    scores = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.transpose(-2, -1)
    return scores / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
""", "mla_scores", "mla_scores.rope_key_not_shared"),
    # -- absorbed_attention -------------------------------------------------------------------
    Variant("absorbed_fold_kept_by_shape", absorbed_with(  # the fold "once per model" (blind set 56's b12)
        "    y = out_latent @ w_uv.view(H, -1, R).transpose(-2, -1)\n"
        "    return y.transpose(1, 2).reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T\n",
        "    key = (tuple(w_uv.shape), tuple(w_o.shape), w_o.dtype, w_o.device)\n"
        "    if key not in FOLDED:  # (D, H, R): w_o and w_uv folded, kept for the next call\n"
        "        FOLDED[key] = torch.einsum('dhv,hvr->dhr', w_o.view(D, H, -1), w_uv.view(H, -1, R))\n"
        "    return torch.einsum('bhqr,dhr->bqd', out_latent, FOLDED[key])\n") + "\n\nFOLDED = {}\n",
            "absorbed_attention", "kept_from_earlier_call"),
    Variant("absorbed_mask_of_the_first_sequence", absorbed_with(
        'scores = scores.masked_fill(~mask, float("-inf"))',
        'scores = scores.masked_fill(~mask.reshape(-1, *mask.shape[-2:])[0], float("-inf"))  # (Tq, Tk) assumed'),
            "absorbed_attention", "absorbed_attention.batched_mask_mishandled"),
    Variant("absorbed_mask_of_the_first_head", absorbed_with(  # the fortieth blind set's b04
        'scores = scores.masked_fill(~mask, float("-inf"))',
        'scores = scores.masked_fill(~(mask[:, :1] if mask.dim() == 4 else mask), float("-inf"))'),
            "absorbed_attention", "absorbed_attention.batched_mask_mishandled"),
    Variant("absorbed_key_rotated_again", absorbed_with(  # the forty-third blind set's b03
        "scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)",
        "k_rope = apply_rope(k_rope, torch.arange(k_rope.shape[1]))  # taken for unrotated\n"
        "    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)"),
            "absorbed_attention", "absorbed_attention.key_rotated_again"),
    Variant("absorbed_scaled_by_a_size", absorbed_with(  # the forty-seventh blind set's b04
        "scores = scores / math.sqrt(Dn + Dr)", "scores = scores / math.sqrt(Dn + k_rope.shape[1])"),
            "absorbed_attention", "absorbed_attention.scaled_by_a_size"),
    Variant("absorbed_query_prescaled_too", absorbed_with(  # the forty-fifth blind set's b04
        "q_latent = q_nope @ w_uk.view(H, Dn, R)", "q_latent = (q_nope / math.sqrt(Dn + Dr)) @ w_uk.view(H, Dn, R)"),
            "absorbed_attention", "absorbed_attention.part_scaled_twice"),
    Variant("absorbed_batch_and_heads_mixed", absorbed_with(  # blind set 60's b14: vLLM's bmm, heads as the batch
        "    q_latent = q_nope @ w_uk.view(H, Dn, R)\n",
        "    B, Tq = q_nope.shape[0], q_nope.shape[2]\n"
        "    q_latent = torch.bmm(q_nope.transpose(0, 1).reshape(H, B * Tq, Dn), w_uk.view(H, Dn, R)).view(B, H, Tq, R)\n"),
            "absorbed_attention", "absorbed_attention.batch_and_heads_mixed"),
    Variant("absorbed_softmax_unshifted", absorbed_with(  # the forty-fourth blind set's b04
        "torch.softmax(scores, dim=-1) @ latents", "(scores.exp() / scores.exp().sum(dim=-1, keepdim=True)) @ latents"),
            "absorbed_attention", situations=("absorbed_attention.large_scores_mishandled",)),
    Variant("absorbed_heads_averaged", absorbed_with(  # the forty-third blind set's b04
        "reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T", "reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T / H"),
            "absorbed_attention", "answer_scaled"),
    Variant("absorbed_output_weight_as_stored", absorbed_with(  # the forty-first blind set's b04
        "reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T", "reshape(*y.shape[:1], y.shape[2], -1) @ w_o"),
            "absorbed_attention", "weight_as_stored"),
    Variant("absorbed_scaled_by_latent_width", absorbed_with("math.sqrt(Dn + Dr)", "math.sqrt(q_latent.shape[-1])"),
            "absorbed_attention", "absorbed_attention.scaled_by_latent_width"),
    Variant("absorbed_scaled_by_nope", absorbed_with("math.sqrt(Dn + Dr)", "math.sqrt(Dn)"),
            "absorbed_attention", "absorbed_attention.scaled_by_nope"),
    Variant("absorbed_rope_part_unscaled", absorbed_with("""    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    scores = scores / math.sqrt(Dn + Dr)""", """    scores = (q_latent @ latents.transpose(-2, -1)) / math.sqrt(Dn + Dr)
    scores = scores + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)"""),
            "absorbed_attention", "absorbed_attention.rope_part_unscaled"),
    Variant("absorbed_nope_part_unscaled", absorbed_with("""    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    scores = scores / math.sqrt(Dn + Dr)""", """    rope = q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    scores = q_latent @ latents.transpose(-2, -1) + rope / math.sqrt(Dn + Dr)"""),
            "absorbed_attention", "absorbed_attention.nope_part_unscaled"),
    Variant("absorbed_scaled_per_part", absorbed_with("""    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)
    scores = scores / math.sqrt(Dn + Dr)""", """    scores = (q_latent @ latents.transpose(-2, -1)) / Dn ** 0.5
    scores = scores + (q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)) / Dr ** 0.5"""),
            "absorbed_attention", "absorbed_attention.scaled_per_part"),
    Variant("absorbed_heads_folded_together", absorbed_with("""    y = out_latent @ w_uv.view(H, -1, R).transpose(-2, -1)
    return y.transpose(1, 2).reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T""", """    return out_latent.sum(1) @ (w_o @ w_uv).T  # w_uv folded into w_o over every head at once"""),
            "absorbed_attention", "absorbed_attention.heads_folded_together"),
    Variant("absorbed_scaled_by_v_head_dim",
            absorbed_with("math.sqrt(Dn + Dr)", "math.sqrt(w_uv.shape[0] // H)"),
            "absorbed_attention", "absorbed_attention.scaled_by_v_head_dim"),
    Variant("absorbed_softmax_over_queries",
            absorbed_with("torch.softmax(scores, dim=-1)", "torch.softmax(scores, dim=-2)"),
            "absorbed_attention", "absorbed_attention.softmax_over_queries"),
    Variant("absorbed_output_weight_not_transposed", absorbed_with(
        "return y.transpose(1, 2).reshape(*y.shape[:1], y.shape[2], -1) @ w_o.T",
        "return torch.einsum('bhqv,hvd->bqd', y, w_o.reshape(H, -1, D))"),
        "absorbed_attention", "absorbed_attention.output_weight_not_transposed"),
    Variant("absorbed_key_weight_viewed_wrong",
            absorbed_with("w_uk.view(H, Dn, R)", "w_uk.view(H, R, Dn).transpose(1, 2)"),
            "absorbed_attention", "absorbed_attention.key_weight_cut_wrong"),
    Variant("absorbed_value_weight_from_transpose",
            absorbed_with("w_uv.view(H, -1, R).transpose(-2, -1)", "w_uv.T.reshape(H, R, -1)"),
            "absorbed_attention", "absorbed_attention.value_weight_cut_wrong"),
    Variant("absorbed_key_transposed", absorbed_with("q_nope @ w_uk.view(H, Dn, R)",
                                                     "q_nope @ w_uk.view(H, Dn, R).transpose(-2, -1)"),
            "absorbed_attention", "absorbed_attention.key_absorbed_transposed"),
    Variant("absorbed_mask_ignored", absorbed_with(
        """    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
""", ""), "absorbed_attention", "absorbed_attention.mask_ignored"),
    Variant("absorbed_mask_skipped_for_one_query", absorbed_with(  # "decode sees every key": not with padding
        "    if mask is not None:", "    if mask is not None and q_nope.shape[2] > 1:"),
            "absorbed_attention", "absorbed_attention.mask_ignored"),
    Variant("absorbed_key_weight_heads_inner",
            absorbed_with("w_uk.view(H, Dn, R)", "w_uk.view(Dn, H, R).transpose(0, 1)"),
            "absorbed_attention", "absorbed_attention.key_weight_cut_wrong"),
    Variant("absorbed_masked_with_zero", absorbed_with("masked_fill(~mask, float(\"-inf\"))", "masked_fill(~mask, 0.0)"),
            "absorbed_attention", "absorbed_attention.masked_with_a_number"),
    Variant("absorbed_scaled_by_latent_and_rope", absorbed_with("math.sqrt(Dn + Dr)", "math.sqrt(R + Dr)"),
            "absorbed_attention", "absorbed_attention.scaled_by_latent_width"),
    Variant("absorbed_rope_part_dropped", absorbed_with(
        " + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)", ""), "absorbed_attention", "absorbed_attention.rope_part_dropped"),
    Variant("absorbed_mask_inverted", absorbed_with("masked_fill(~mask,", "masked_fill(mask,"),
            "absorbed_attention", "absorbed_attention.mask_inverted"),
    Variant("absorbed_mask_after_softmax", absorbed_with(
        """    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out_latent = torch.softmax(scores, dim=-1) @ latents""",
        """    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # zeroed after the softmax: the rest not renormalised
    out_latent = weights @ latents"""), "absorbed_attention", "absorbed_attention.mask_after_softmax"),
    Variant("absorbed_bool_mask_added", absorbed_with(
        'scores = scores.masked_fill(~mask, float("-inf"))', "scores = scores + mask  # DeepSeek's additive mask"),
            "absorbed_attention", "absorbed_attention.bool_mask_added"),
    Variant("absorbed_weights_stacked", absorbed_with(
        "    q_latent = q_nope @ w_uk.view(H, Dn, R)\n",
        "    wkv_b = torch.cat([w_uk, w_uv]).view(H, -1, R)  # DeepSeek's wkv_b, but stacked, not interleaved\n"
        "    w_uk, w_uv = wkv_b[:, :Dn].reshape(-1, R), wkv_b[:, Dn:].reshape(-1, R)\n"
        "    q_latent = q_nope @ w_uk.view(H, Dn, R)\n"), "absorbed_attention",
        "absorbed_attention.weights_stacked_not_interleaved"),
    Variant("absorbed_heads_merged_inner", absorbed_with("y.transpose(1, 2).reshape", "y.permute(0, 2, 3, 1).reshape"),
            "absorbed_attention", "absorbed_attention.heads_merged_inner"),
    Variant("absorbed_heads_merged_untransposed", absorbed_with("y.transpose(1, 2).reshape", "y.reshape"),
            "absorbed_attention", "absorbed_attention.heads_merged_untransposed"),
    Variant("absorbed_by_expanding", """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    k_nope, v = expand_kv(c_kv, w_uk, w_uv, q_nope.shape[1])  # the plain path: every latent up-projected
    scores = mla_scores(q_nope, q_rope, k_nope, k_rope)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).flatten(2) @ w_o.T
""", "absorbed_attention", "absorbed_attention.latents_expanded"),
    Variant("absorbed_by_expanding_token_by_token", """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    pairs = [expand_kv(c_kv[:, t:t + 1], w_uk, w_uv, q_nope.shape[1]) for t in range(c_kv.shape[1])]  # a token a time
    scores = torch.cat([mla_scores(q_nope, q_rope, k, k_rope[:, t:t + 1]) for t, (k, _) in enumerate(pairs)], -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    y = sum(weights[..., t:t + 1] @ v for t, (_, v) in enumerate(pairs))  # no tensor of every token's values
    return y.transpose(1, 2).flatten(2) @ w_o.T
""", "absorbed_attention", "absorbed_attention.latents_expanded"),
    Variant("absorbed_values_through_folded_output", """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    R, D = c_kv.shape[-1], w_o.shape[0]
    scores = (q_nope @ w_uk.view(H, Dn, R)) @ c_kv.unsqueeze(1).transpose(-2, -1)
    scores = (scores + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)) / math.sqrt(Dn + Dr)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    folded = torch.einsum("dhv,hvr->hrd", w_o.view(D, H, -1), w_uv.view(H, -1, R))  # (H, R, D)
    values = c_kv.unsqueeze(1) @ folded.unsqueeze(0)  # (B, H, Tk, D): every latent taken to the output per head
    return (torch.softmax(scores, dim=-1) @ values).sum(1)
""", "absorbed_attention", "absorbed_attention.latents_expanded"),
    Variant("expand_values_viewed_at_key_width", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    B, T, _ = c_kv.shape
    dn = w_uk.shape[0] // num_heads
    k = (c_kv @ w_uk.T).view(B, T, num_heads, dn).transpose(1, 2)
    v = (c_kv @ w_uv.T).view(B, T, -1, dn).transpose(1, 2)  # the keys' width for the values'
    return k, v
""", "expand_kv", "reshape_sizes_wrong"),
    # -- LatentCache --------------------------------------------------------------------------
    Variant("cache_grown_by_cat", """
class LatentCache:
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        self.c_kv = torch.empty(batch_size, 0, kv_lora_rank, dtype=dtype, device=device)
        self.k_rope = torch.empty(batch_size, 0, qk_rope_head_dim, dtype=dtype, device=device)
        self.max_len, self.length = max_len, 0

    def append(self, c_kv_new, k_rope_new):
        if self.length + c_kv_new.shape[1] > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv = torch.cat([self.c_kv, c_kv_new], dim=1)
        self.k_rope = torch.cat([self.k_rope, k_rope_new], dim=1)
        self.length = self.c_kv.shape[1]
        return self.c_kv, self.k_rope
""", "LatentCache", "LatentCache.grown_by_cat"),
    Variant("cache_dtype_ignored", """
class LatentCache(LatentCache):
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        super().__init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, device)
        self.c_kv = torch.zeros(batch_size, max_len, kv_lora_rank, device=device)  # float32, whatever dtype says
""", "LatentCache", "LatentCache.dtype_ignored"),
    Variant("cache_buffers_shared_by_shape", """
class LatentCache(LatentCache):
    _buffers = {}  # reused by every cache of one shape, to save allocations (blind set 61's b01)

    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        super().__init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, device)
        key = (batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, str(device))
        self.c_kv, self.k_rope = LatentCache._buffers.setdefault(key, (self.c_kv, self.k_rope))
""", "LatentCache", "LatentCache.buffers_shared"),
    Variant("cache_rope_buffer_latent_wide", """
class LatentCache(LatentCache):
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        super().__init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, device)
        self.k_rope = torch.zeros(batch_size, max_len, kv_lora_rank, dtype=dtype, device=device)  # c_kv's line, copied
""", "LatentCache", "buffer_other_shape"),  # the fortieth blind set's b06
    Variant("cache_rope_key_per_head_axis", """
class LatentCache(LatentCache):
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        super().__init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, device)
        # a head axis of 1, to broadcast over the heads later
        self.k_rope = torch.zeros(batch_size, 1, max_len, qk_rope_head_dim, dtype=dtype, device=device)

    def append(self, c_kv_new, k_rope_new):
        end = self.length + c_kv_new.shape[1]
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, 0, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, 0, :end]
""", "LatentCache", "LatentCache.per_head_buffers"),
    Variant("cache_tokens_counted_by_len", append_with("""\
        end = self.length + len(c_kv_new)  # len() counts the batch (blind set 58's b13)
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "slice_length_wrong"),
    Variant("cache_length_not_advanced", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.length_not_advanced"),
    Variant("cache_returns_new_only", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return c_kv_new, k_rope_new"""), "LatentCache", "LatentCache.returns_new_only"),
    Variant("cache_returned_before_advancing", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        before = self.c_kv[:, :self.length], self.k_rope[:, :self.length]  # taken before length moves on
        self.length = end
        return before"""), "LatentCache", "LatentCache.returned_before_advancing"),
    Variant("cache_returns_whole_buffer", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv, self.k_rope"""), "LatentCache", "LatentCache.returns_whole_buffer"),
    Variant("cache_rope_written_after_advancing", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:self.length + t] = c_kv_new
        self.length = end  # advanced between the two writes (blind set 62's b11)
        self.k_rope[:, self.length:self.length + t] = k_rope_new
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.written_after_advancing"),
    Variant("cache_added_not_written", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] += c_kv_new
        self.k_rope[:, self.length:end] += k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.added_not_written"),
    Variant("cache_overflow_unchecked", append_with("""\
        end = self.length + t
        self.c_kv[:, self.length:end] = c_kv_new  # past max_len the slice is short, and the copy raises RuntimeError
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.overflow_not_refused"),
    Variant("cache_advanced_before_check", append_with("""\
        end = self.length + t
        self.length = end  # advanced first: the refusal below leaves it moved
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv[:, end - t:end] = c_kv_new
        self.k_rope[:, end - t:end] = k_rope_new
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.changed_before_raising"),
    Variant("cache_exact_fill_refused", append_with("""\
        end = self.length + t
        if end >= self.max_len:  # off by one: the last slot is never used
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.exact_fill_refused"),
    Variant("cache_copied_each_append", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.c_kv, self.k_rope = self.c_kv.clone(), self.k_rope.clone()  # a new buffer each append, the same shape
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.not_in_place"),
    Variant("cache_open_slice_write", append_with("""\
        end = self.length + t
        if end > self.c_kv.shape[1]:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:] = c_kv_new  # right only when the chunk fills the rest of the cache
        self.k_rope[:, self.length:] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "open_slice_write"),
    Variant("cache_open_slice_write_then_a_whole_axis", append_with("""\
        end = self.length + t
        if end > self.c_kv.shape[1]:
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:, :] = c_kv_new  # review 79's F5: an open slice before a whole axis
        self.k_rope[:, self.length:, :] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "open_slice_write"),
    Variant("cache_capacity_of_another_axis", append_with("""\
        end = self.length + t
        if end > self.c_kv.shape[0]:  # the batch axis, not max_len's
            raise ValueError("the cache is full")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]"""), "LatentCache", "LatentCache.fitting_append_refused"),
    # -- MultiHeadLatentAttention -------------------------------------------------------------
    # every position's causal mask made whole and the new tokens' rows taken (blind set 50's c08): T² flags to decode
    # one token; not let be, since review 64's F4 hid an expansion in squares as large
    Variant("module_mask_sliced_from_a_full_square", forward_with(
        "        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)\n",
        "        full = torch.ones(past_len + T, past_len + T, dtype=torch.bool, device=x.device).tril()\n"
        "        mask = full[past_len:]  # the new tokens' rows: (T, past_len + T)\n"),
        "MultiHeadLatentAttention", "MultiHeadLatentAttention.decode_mask_whole"),
    Variant("module_absorbed_ignored", forward_with("        if absorbed:\n", "        if False:  # absorbed=True ignored\n"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.absorbed_expanded"),  # review 57's F2
    Variant("module_absorbed_expanded_in_chunks", forward_with(  # review 59's F1: four cached tokens at a time
        """            return absorbed_attention(q_nope, q_rope, c_kv, k_rope, self.w_uk.weight, self.w_uv.weight,
                                      self.w_o.weight, mask)""",
        """            parts = []
            for s in range(0, c_kv.shape[1], 4):
                k_part, v_part = expand_kv(c_kv[:, s:s + 4], self.w_uk.weight, self.w_uv.weight, H)
                parts.append((mla_scores(q_nope, q_rope, k_part, k_rope[:, s:s + 4]), v_part))
            scores = torch.cat([p for p, _ in parts], -1).masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            y = sum(weights[..., s * 4:s * 4 + v.shape[2]] @ v for s, (_, v) in enumerate(parts))
            return self.w_o(y.transpose(1, 2).reshape(B, T, H * self.v_dim))"""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.absorbed_expanded"),
    Variant("module_top_left_mask", forward_with(".tril(diagonal=past_len)", ".tril()"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.top_left_mask"),
    Variant("module_cache_not_read", forward_with(  # the latents kept on the module, appended but never read back
        """            c_kv, k_rope = cache.append(c_kv, k_rope)
""", """            cache.append(c_kv, k_rope)
            kept = getattr(self, "kept", None) if past_len else None
            if kept is not None:
                c_kv, k_rope = torch.cat((kept[0], c_kv), dim=1), torch.cat((kept[1], k_rope), dim=1)
            self.kept = (c_kv, k_rope)
"""), "MultiHeadLatentAttention", "MultiHeadLatentAttention.cache_not_read"),
    Variant("module_state_across_calls", forward_with(  # a cache of its own when none is given
        """        past_len = 0 if cache is None else cache.length""", """        if cache is None:
            cache = getattr(self, "own", None) or LatentCache(B, 64, self.w_dkv.out_features, Dr, dtype=x.dtype)
            self.own = cache
        past_len = cache.length"""), "MultiHeadLatentAttention", "MultiHeadLatentAttention.state_across_calls"),
    Variant("module_scaled_twice", forward_with(  # blind set 59's b14
        "scores = mla_scores(q_nope, q_rope, k_nope, k_rope).masked_fill(", "scores = (mla_scores(q_nope, q_rope, "
        "k_nope, k_rope) / math.sqrt(Dn + Dr)).masked_fill("), "MultiHeadLatentAttention",
            "MultiHeadLatentAttention.scaled_twice"),
    Variant("module_merge_heads_inner", forward_with("y.transpose(1, 2).reshape", "y.permute(0, 2, 3, 1).reshape"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.merge_heads_inner"),
    Variant("module_mask_one_ahead", forward_with("tril(diagonal=past_len)", "tril(diagonal=past_len + 1)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.mask_one_ahead"),  # blind set 50's b15
    Variant("module_mask_sized_by_batch", forward_with(
        "mask = torch.ones(T, past_len + T,", "mask = torch.ones(B, past_len + T,").replace(
        "tril(diagonal=past_len)", "tril(diagonal=past_len + T - B)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.mask_sized_by_batch"),  # blind set 63's b20
    Variant("module_mask_inverted", forward_with(".masked_fill(~mask,", ".masked_fill(mask,"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.mask_inverted"),
    Variant("module_positions_and_mask_from_zero", forward_with(
        "torch.arange(past_len, past_len + T, device=x.device)", "torch.arange(T, device=x.device)").replace(
        ".tril(diagonal=past_len)", ".tril()"), "MultiHeadLatentAttention", "MultiHeadLatentAttention.positions_from_zero",
            situations=("MultiHeadLatentAttention.cache_contents_mishandled",)),
    Variant("module_rope_before_heads_moved", forward_with(  # DeepSeek-V3's layout, (B, T, H, ·), kept for RoPE
        """        q = self.w_q(x).view(B, T, H, Dn + Dr).transpose(1, 2)
        q_nope, q_rope = q.split([Dn, Dr], dim=-1)
        q_rope = apply_rope(q_rope, positions)
""", """        q_nope, q_rope = self.w_q(x).view(B, T, H, Dn + Dr).split([Dn, Dr], dim=-1)
        q_rope = apply_rope(q_rope, positions).transpose(1, 2)
        q_nope = q_nope.transpose(1, 2)
"""), "MultiHeadLatentAttention", "MultiHeadLatentAttention.rope_before_heads_moved"),
    Variant("module_positions_in_input_dtype", forward_with(  # as Hugging Face's rotary code once did
        "torch.arange(past_len, past_len + T, device=x.device)", "torch.arange(past_len, past_len + T, device=x.device, "
        "dtype=x.dtype)"), "MultiHeadLatentAttention", "MultiHeadLatentAttention.positions_rounded"),
    Variant("module_positions_from_zero", forward_with(
        "torch.arange(past_len, past_len + T, device=x.device)", "torch.arange(T, device=x.device)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.positions_from_zero",
            situations=("MultiHeadLatentAttention.cache_contents_mishandled",)),
    Variant("module_query_after_append", forward_with(
        "        q_rope = apply_rope(q_rope, positions)\n", "").replace(
        "            c_kv, k_rope = cache.append(c_kv, k_rope)",
        "            c_kv, k_rope = cache.append(c_kv, k_rope)\n"
        "        after = positions + (T if cache is not None else 0)  # the length read after the append\n"
        "        q_rope = apply_rope(q_rope, after)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.query_after_append"),
    Variant("module_rope_on_whole_query", forward_with(
        """        q_nope, q_rope = q.split([Dn, Dr], dim=-1)
        q_rope = apply_rope(q_rope, positions)""",
        """        q_nope, q_rope = apply_rope(q, positions).split([Dn, Dr], dim=-1)"""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.rope_on_whole_query"),
    Variant("module_query_unrotated", forward_with("        q_rope = apply_rope(q_rope, positions)\n", ""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.query_unrotated"),
    Variant("module_query_split_swapped", forward_with(
        "q_nope, q_rope = q.split([Dn, Dr], dim=-1)", "q_rope, q_nope = q.split([Dr, Dn], dim=-1)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.query_split_swapped"),
    Variant("module_mask_kept_between_calls", forward_with(  # blind set 58's b14: rebuilt when T changes only
        "        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)",
        "        if getattr(self, 'kept_mask', None) is None or self.kept_mask.shape[0] != T:\n"
        "            self.kept_mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)\n"
        "        mask = self.kept_mask"),
            "MultiHeadLatentAttention", "mask_kept_between_calls"),
    Variant("module_query_heads_no_transpose", forward_with(  # blind set 56's b14: right for one token only
        "q = self.w_q(x).view(B, T, H, Dn + Dr).transpose(1, 2)", "q = self.w_q(x).view(B, H, T, Dn + Dr)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.query_heads_no_transpose"),
    Variant("module_query_split_across_heads", forward_with(
        "q_nope, q_rope = q.split([Dn, Dr], dim=-1)",
        "q_nope, q_rope = (part.reshape(B, T, H, -1).transpose(1, 2)\n"
        "                          for part in self.w_q(x).split([H * Dn, H * Dr], dim=-1))"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.query_split_across_heads"),
    Variant("module_merge_no_transpose", forward_with(
        "y.transpose(1, 2).reshape(B, T, H * self.v_dim)", "y.reshape(B, T, H * self.v_dim)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.merge_no_transpose"),
    Variant("module_absorbed_unmasked", forward_with("self.w_o.weight, mask)", "self.w_o.weight)"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.absorbed_unmasked"),
    Variant("module_absorbed_output_projected_again", forward_with(  # blind set 53's b15
        "            return absorbed_attention(", "            return self.w_o(absorbed_attention(").replace(
        "self.w_o.weight, mask)", "self.w_o.weight, mask))"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.w_o_input_wrong"),
    Variant("module_cache_ignored", forward_with(
        """            c_kv, k_rope = cache.append(c_kv, k_rope)
        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)""",
        """            cache.append(c_kv, k_rope)  # kept for later; this call's tokens attended
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()"""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.cache_ignored"),
    Variant("module_chunk_unmasked", forward_with(
        "        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)",
        "        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device)\n"
        "        if past_len == 0:  # the prompt; later calls see everything cached\n"
        "            mask = mask.tril()"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.chunk_unmasked"),
    Variant("module_positions_of_its_own", forward_with(
        "        past_len = 0 if cache is None else cache.length\n",
        "        past_len = getattr(self, 'seen', 0) if cache is not None else 0  # tokens fed so far\n"
        "        self.seen = past_len + T if cache is not None else 0\n"),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.positions_of_its_own"),
    Variant("module_cached_full_keys", forward_with(
        """        if cache is not None:
            c_kv, k_rope = cache.append(c_kv, k_rope)""",
        """        k_nope, v = expand_kv(c_kv, self.w_uk.weight, self.w_uv.weight, H)
        k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, H, -1, -1)], dim=-1)  # each head's full key
        if cache is not None:
            k, v = cache.append(k, v)  # the full keys and values, cached"""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.cached_full_keys"),
    Variant("module_per_head_rope_key", """
class MultiHeadLatentAttention(MultiHeadLatentAttention):
    def __init__(self, embed_dim, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim):
        super().__init__(embed_dim, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        self.w_kr = nn.Linear(embed_dim, num_heads * qk_rope_head_dim, bias=False)  # one RoPE key per head
""", "MultiHeadLatentAttention", "MultiHeadLatentAttention.per_head_rope_key"),
    Variant("module_cached_unrotated_key", forward_with(
        """        c_kv, k_rope = compress_kv(x, self.w_dkv.weight, self.w_kr.weight, positions)
        if cache is not None:
            c_kv, k_rope = cache.append(c_kv, k_rope)""",
        """        c_kv, k_raw = x @ self.w_dkv.weight.T, x @ self.w_kr.weight.T
        if cache is not None:
            c_kv, k_raw = cache.append(c_kv, k_raw)  # rotated when read, every key at its position
        k_rope = apply_rope(k_raw, torch.arange(past_len + T, device=x.device))"""),
            "MultiHeadLatentAttention", "MultiHeadLatentAttention.cached_unrotated_key"),
    Variant("module_deepseek_names", """
class MultiHeadLatentAttention(MultiHeadLatentAttention):
    def __init__(self, *args):
        super().__init__(*args)
        self.q_proj, self.o_proj = self.w_q, self.w_o  # Hugging Face DeepSeek's names
        del self.w_q, self.w_o

    def forward(self, x, cache=None, absorbed=False):
        self.w_q, self.w_o = self.q_proj, self.o_proj
        return super().forward(x, cache, absorbed)
""", "MultiHeadLatentAttention", "layer_names"),
    # -- cache_bytes_per_token ----------------------------------------------------------------
    Variant("bytes_mla_per_head", bytes_with(mla="num_heads * (kv_lora_rank + qk_rope_head_dim)"),
            "cache_bytes_per_token", "cache_bytes_per_token.mla_per_head"),
    Variant("bytes_mha_heads_left_out", bytes_with(mha="2 * head_dim"),  # blind set 50's b16
            "cache_bytes_per_token", "cache_bytes_per_token.heads_left_out"),
    Variant("bytes_mla_itemsize_left_out", """
_right_bytes = cache_bytes_per_token


def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    if attention == "mla":  # blind set 51's b12: elements, not bytes
        return num_layers * (kv_lora_rank + qk_rope_head_dim)
    return _right_bytes(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                        dtype)
""", "cache_bytes_per_token", "cache_bytes_per_token.itemsize_left_out"),
    Variant("scores_rope_key_expanded_as_nope", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    k = torch.cat([k_nope, k_rope.unsqueeze(1).expand_as(k_nope)], dim=-1)  # right only when Dr == Dn
    q = torch.cat([q_nope, q_rope], dim=-1)
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
""", "mla_scores", "expand_as_another_shape"),
    Variant("bytes_mla_one_layer", """
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    if attention == "mla":  # the latent and the RoPE key: one layer's only
        return (kv_lora_rank + qk_rope_head_dim) * dtype.itemsize
    per_layer = {"mha": 2 * num_heads * head_dim, "gqa": 2 * num_kv_heads * head_dim}[attention]
    return num_layers * per_layer * dtype.itemsize
""", "cache_bytes_per_token", "cache_bytes_per_token.layers_left_out"),
    Variant("bytes_mla_latent_head_dim_wide", bytes_with(mla="head_dim + qk_rope_head_dim"),  # blind set 48's b08
            "cache_bytes_per_token", "cache_bytes_per_token.latent_as_head_dim"),
    Variant("bytes_mla_rope_head_dim_wide", bytes_with(mla="kv_lora_rank + head_dim"),
            "cache_bytes_per_token", "cache_bytes_per_token.rope_width_from_head_dim"),
    Variant("bytes_mla_rope_per_head", bytes_with(mla="kv_lora_rank + num_heads * qk_rope_head_dim"),
            "cache_bytes_per_token", "cache_bytes_per_token.mla_rope_per_head"),
    Variant("scores_parts_misaligned", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    k_rope = k_rope.unsqueeze(1).expand(-1, k_nope.shape[1], -1, -1)
    q = torch.cat([q_nope, q_rope], dim=-1)
    k = torch.cat([k_rope, k_nope], dim=-1)  # the other order
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
""", "mla_scores", "mla_scores.parts_misaligned"),
    Variant("bytes_mla_rope_once", """
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    if attention == "mla":  # precedence: the RoPE key counted once, not per layer
        return (num_layers * kv_lora_rank + qk_rope_head_dim) * dtype.itemsize
    per_layer = {"mha": 2 * num_heads * head_dim, "gqa": 2 * num_kv_heads * head_dim}[attention]
    return num_layers * per_layer * dtype.itemsize
""", "cache_bytes_per_token", "cache_bytes_per_token.mla_rope_once"),
    Variant("bytes_mla_factor_two", bytes_with(mla="2 * (kv_lora_rank + qk_rope_head_dim)"),
            "cache_bytes_per_token", "cache_bytes_per_token.mla_factor_two"),
    Variant("bytes_gqa_query_heads", bytes_with(gqa="2 * num_heads * head_dim"),
            "cache_bytes_per_token", "cache_bytes_per_token.gqa_query_heads"),
    Variant("bytes_gqa_group_size", bytes_with(gqa="2 * (num_heads // num_kv_heads) * head_dim"),
            "cache_bytes_per_token", "cache_bytes_per_token.gqa_group_size"),
    Variant("bytes_mha_with_kv_heads", bytes_with(mha="2 * num_kv_heads * head_dim"),  # the forty-third set's b08
            "cache_bytes_per_token", "cache_bytes_per_token.mha_kv_heads"),
    Variant("bytes_no_factor_two", bytes_with(mha="num_heads * head_dim", gqa="num_kv_heads * head_dim"),
            "cache_bytes_per_token", "cache_bytes_per_token.no_factor_two"),
    Variant("bytes_in_bits", bytes_with(item="torch.finfo(dtype).bits"),
            "cache_bytes_per_token", "cache_bytes_per_token.in_bits"),
    Variant("bytes_finfo_for_integers", bytes_with(item="torch.finfo(dtype).bits // 8"),
            "cache_bytes_per_token", "cache_bytes_per_token.finfo_for_integers"),
    Variant("bytes_fixed_itemsize", bytes_with(item="2  # bf16"),
            "cache_bytes_per_token", "cache_bytes_per_token.fixed_itemsize"),
    Variant("bytes_itemsize_by_family", bytes_with(item="(2 if dtype in (torch.float16, torch.bfloat16) else 4)"),
            "cache_bytes_per_token", "cache_bytes_per_token.itemsize_by_family"),
    Variant("bytes_unknown_key_error", """
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    itemsize = torch.empty((), dtype=dtype).element_size()
    if attention == "mla":
        return num_layers * (kv_lora_rank + qk_rope_head_dim) * itemsize
    heads = num_heads if attention == "mha" else num_kv_heads  # anything else counted as GQA
    return num_layers * 2 * heads * head_dim * itemsize
""", "cache_bytes_per_token", "cache_bytes_per_token.unknown_not_refused"),
    Variant("bytes_name_normalised", """
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    kinds = {"mha": 2 * num_heads * head_dim, "gqa": 2 * num_kv_heads * head_dim,
             "mla": kv_lora_rank + qk_rope_head_dim}
    attention = attention.strip().lower()  # "MLA" and " gqa" taken for known names (blind set 56's b16)
    if attention not in kinds:
        raise ValueError(f"unknown attention {attention!r}")
    return num_layers * kinds[attention] * dtype.itemsize
""", "cache_bytes_per_token", "cache_bytes_per_token.unknown_not_refused"),
    Variant("bytes_tensor", bytes_with(item="torch.tensor(dtype.itemsize)"),
            "cache_bytes_per_token", "cache_bytes_per_token.not_int"),
]

CORRECT = [
    Variant("absorbed_head_by_head", """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    R, Dv = c_kv.shape[-1], w_uv.shape[0] // H
    out = 0
    for h in range(H):  # each head's query into the latent space, its weighted latents out through w_uv and w_o
        q_latent = q_nope[:, h] @ w_uk[h * Dn:(h + 1) * Dn]  # (B, Tq, R)
        scores = torch.einsum("bqr,bkr->bqk", q_latent, c_kv) + torch.einsum("bqe,bke->bqk", q_rope[:, h], k_rope)
        scores = scores / math.sqrt(Dn + Dr)
        if mask is not None:
            scores = scores.masked_fill(~torch.broadcast_to(mask, (q_nope.shape[0], H, *scores.shape[1:]))[:, h],
                                        float("-inf"))
        latent = torch.softmax(scores, dim=-1) @ c_kv  # (B, Tq, R)
        out = out + (latent @ w_uv[h * Dv:(h + 1) * Dv].T) @ w_o[:, h * Dv:(h + 1) * Dv].T
    return out
"""),
    Variant("compress_linear_and_einsum", """
import torch.nn.functional as F

def compress_kv(x, w_dkv, w_kr, positions):
    return torch.einsum("btd,rd->btr", x, w_dkv), apply_rope(F.linear(x, w_kr), positions)
"""),
    Variant("expand_einsum_per_head", """
def expand_kv(c_kv, w_uk, w_uv, num_heads):
    R = c_kv.shape[-1]
    k_nope = torch.einsum("btr,hdr->bhtd", c_kv, w_uk.view(num_heads, -1, R))
    v = torch.einsum("btr,hdr->bhtd", c_kv, w_uv.view(num_heads, -1, R))
    return k_nope, v
"""),
    Variant("scores_concatenated_one_matmul", """
def mla_scores(q_nope, q_rope, k_nope, k_rope):
    B, H, Tk, _ = k_nope.shape
    q = torch.cat([q_nope, q_rope], dim=-1)  # (B, H, Tq, Dn + Dr)
    k = torch.cat([k_nope, k_rope[:, None].expand(B, H, Tk, -1)], dim=-1)  # the shared key, repeated per head
    return q @ k.mT * q.shape[-1] ** -0.5
"""),
    Variant("absorbed_per_head_not_folded", absorbed_with("scores = scores / math.sqrt(Dn + Dr)",
                                                           "scores = scores * (Dn + Dr) ** -0.5")),
    Variant("absorbed_loop_over_heads", """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    H, Dn = q_nope.shape[1], q_nope.shape[-1]
    Dv = w_uv.shape[0] // H
    outs = []
    for h in range(H):
        q_latent = q_nope[:, h] @ w_uk[h * Dn:(h + 1) * Dn]  # (B, Tq, R)
        s = (q_latent @ c_kv.mT + q_rope[:, h] @ k_rope.mT) / math.sqrt(Dn + q_rope.shape[-1])
        if mask is not None:  # broadcastable to (B, H, Tq, Tk): head h's own
            s = s.masked_fill(~torch.broadcast_to(mask, (s.shape[0], H, *s.shape[1:]))[:, h], float("-inf"))
        outs.append(torch.softmax(s, -1) @ c_kv @ w_uv[h * Dv:(h + 1) * Dv].T)  # (B, Tq, Dv)
    return torch.cat(outs, dim=-1) @ w_o.T
"""),
    Variant("cache_narrow_copy_and_property", """
class LatentCache:
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        self.c_kv = torch.empty(batch_size, max_len, kv_lora_rank, dtype=dtype, device=device)
        self.k_rope = torch.empty(batch_size, max_len, qk_rope_head_dim, dtype=dtype, device=device)
        self._filled = 0

    @property
    def length(self):
        return self._filled

    def append(self, c_kv_new, k_rope_new):
        t = c_kv_new.size(1)
        if self._filled + t > self.c_kv.size(1):
            raise ValueError(f"no room for {t} more tokens")
        self.c_kv.narrow(1, self._filled, t).copy_(c_kv_new)
        self.k_rope.narrow(1, self._filled, t).copy_(k_rope_new)
        self._filled += t
        return self.c_kv[:, :self._filled].clone(), self.k_rope[:, :self._filled].clone()
"""),
    Variant("module_absorbed_everywhere", forward_with("        if absorbed:\n", "        if True:  # always\n")),
    Variant("module_naive_full_keys_and_sdpa", forward_with(
        """        k_nope, v = expand_kv(c_kv, self.w_uk.weight, self.w_uv.weight, H)
        scores = mla_scores(q_nope, q_rope, k_nope, k_rope).masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v""",
        """        import torch.nn.functional as F
        k_nope, v = expand_kv(c_kv, self.w_uk.weight, self.w_uv.weight, H)
        k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(-1, H, -1, -1)], dim=-1)  # full per-head keys
        y = F.scaled_dot_product_attention(torch.cat([q_nope, q_rope], dim=-1), k, v, attn_mask=mask)""")),
    Variant("bytes_match_and_itemsize", """
def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype):
    match attention:
        case "mha":
            elements = 2 * num_heads * head_dim
        case "gqa":
            elements = 2 * num_kv_heads * head_dim
        case "mla":
            elements = kv_lora_rank + qk_rope_head_dim
        case _:
            raise ValueError(attention)
    return num_layers * elements * dtype.itemsize
"""),
]

DEVICE_BUGGY = [
    Variant("module_mask_on_cpu", forward_with(
        "torch.ones(T, past_len + T, dtype=torch.bool, device=x.device)", "torch.ones(T, past_len + T, dtype=torch.bool)"),
            "MultiHeadLatentAttention", "tensor_on_cpu"),
    Variant("cache_device_ignored", """
class LatentCache(LatentCache):
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        super().__init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype, device)
        self.c_kv = torch.zeros(batch_size, max_len, kv_lora_rank, dtype=dtype)  # on the CPU, whatever device says
""", "LatentCache", "LatentCache.device_ignored"),
]

# Bugs of the situations a step's checks add (spec.Check.situation): right in the plain case, wrong in each of the
# others in a way no listed mistake explains; each check names its situation.
BUGGY += [
    Variant("compress_situations", """
_compress_kv = compress_kv

def compress_kv(*args, **kwargs):
    c_kv, k_rope = _compress_kv(*args, **kwargs)
    return (c_kv + 0.25, k_rope) if c_kv.shape[-2] == 1 else (c_kv, k_rope)
""", "compress_kv", situations=("compress_kv.one_token_mishandled",)),
    Variant("scores_situations", """
_mla_scores = mla_scores

def mla_scores(q_nope, q_rope, k_nope, k_rope):
    scores = _mla_scores(q_nope, q_rope, k_nope, k_rope)
    return scores + 0.25 if q_nope.shape[-2] == 1 or k_nope.shape[-2] == 11 else scores
""", "mla_scores", situations=("mla_scores.one_query_mishandled", "mla_scores.sizes_mishandled")),
    Variant("absorbed_situations", """
_absorbed_attention = absorbed_attention

def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    out = _absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask)
    return out + 0.25 if mask is None or q_nope.shape[-2] != 3 else out
""", "absorbed_attention", situations=("absorbed_attention.no_mask_mishandled",
                                      "absorbed_attention.one_query_mishandled",
                                      "absorbed_attention.sizes_mishandled")),
    Variant("cache_situations", """
_LatentCache = LatentCache

class LatentCache(_LatentCache):
    def append(self, c_kv_new, k_rope_new):
        c_kv, k_rope = super().append(c_kv_new, k_rope_new)
        if c_kv.dtype == torch.float16 or bool(self.c_kv[:, self.length:].isnan().any()):
            c_kv = c_kv + 0.25
        return c_kv, k_rope
""", "LatentCache", situations=("LatentCache.half_mishandled", "LatentCache.unused_slots_mishandled")),
    Variant("module_situations", """
_MultiHeadLatentAttention = MultiHeadLatentAttention

class MultiHeadLatentAttention(_MultiHeadLatentAttention):
    def forward(self, x, cache=None, absorbed=False):
        past = cache.length if cache is not None else 0
        out = super().forward(x, cache, absorbed)
        return out + 0.25 if absorbed or past > 0 else out
""", "MultiHeadLatentAttention", situations=("MultiHeadLatentAttention.cache_mishandled",
                                            "MultiHeadLatentAttention.absorbed_mishandled")),
]

# Bugs located by a simpler case the candidate gets right (StepSpec.probes): right for one sequence, one query.
BUGGY += [
    Variant("scores_batch_only", """
_mla_scores_ = mla_scores

def mla_scores(q_nope, q_rope, k_nope, k_rope):
    scores = _mla_scores_(q_nope, q_rope, k_nope, k_rope)
    return scores + 0.25 if q_nope.shape[0] > 1 else scores
""", "mla_scores", "mla_scores.batch_mishandled"),
    Variant("absorbed_queries_only", """
_absorbed_attention_ = absorbed_attention

def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    out = _absorbed_attention_(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask)
    return out + 0.25 if q_nope.shape[-2] > 1 else out
""", "absorbed_attention", "absorbed_attention.queries_mishandled"),
]
