"""Candidates for `triton_attention` made from the reference by redefining one kernel or launcher (Python keeps a
file's last definition, and a launcher finds its kernel by name when it runs).

Each kernel variant is the reference's kernel with one line changed (`changed`), so it differs from the model
answer by exactly its mistake. BUGGY: one mistake each, with the step that must lose points and the named
mistake the grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
RULES_ONLY: a forbidden call in a launcher.
"""

import ast

from tests.conftest import ROOT
from tests.exercises.mha.variants import Variant

REFERENCE = (ROOT / "solutions" / "triton_attention.py").read_text()


def _definition(name: str) -> str:
    """The reference's definition of `name`, decorators included."""
    node = next(n for n in ast.parse(REFERENCE).body if getattr(n, "name", None) == name)
    lines = REFERENCE.splitlines()
    start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
    return "\n".join(lines[start:node.end_lineno]) + "\n"


def changed(name: str, *replacements: tuple[str, str]) -> str:
    """The reference's `name` with each (old, new) replaced: every old must be there, once."""
    text = _definition(name)
    for old, new in replacements:
        assert text.count(old) == 1, f"{name}: {old!r} is not there once"
        text = text.replace(old, new)
    return "\n\n" + text


SOFTMAX_IN_TORCH = """

def softmax(x):
    e = (x.float() - x.float().amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)).to(x.dtype)
"""

FLASH_IN_TORCH = """

def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    t_q, t_k = q.shape[2], k.shape[2]
    s = (q.float()[:, :, :, None, :] * k.float()[:, :, None, :, :]).sum(-1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.arange(t_k)[None, :] > torch.arange(t_q)[:, None] + t_k - t_q, -math.inf)
    m = s.amax(-1, keepdim=True)
    e = (s - m).exp()
    out = (e[..., None] * v.float()[:, :, None, :, :]).sum(-2) / e.sum(-1)[..., None]
    return out.to(q.dtype), (m[..., 0] + e.sum(-1).log())
"""

DECODE_IN_TORCH = """

def decode_attention(q, k_cache, v_cache, lengths, block_n=16):
    outs = []
    for b, n in enumerate(lengths.tolist()):
        s = (q[b].float()[:, None, :] * k_cache[b, :, :n].float()).sum(-1) / math.sqrt(q.shape[-1])
        e = (s - s.amax(-1, keepdim=True)).exp()
        outs.append(((e[..., None] * v_cache[b, :, :n].float()).sum(-2) / e.sum(-1, keepdim=True)).to(q.dtype))
    return torch.stack(outs)
"""

SCORES_BUFFER = changed(
    "flash_attention",
    ("    grid = (", "    scores = torch.empty((batch, heads, t_q, t_k), dtype=torch.float32, device=q.device)\n"
                   "    grid = ("),
)

# the twenty-seventh review's f02, the twenty-ninth's f05 and the thirtieth's f04: flat buffers of the scores, which
# kernels write and read back, two per batch·head (each a shape the record keeps once, each under one head's scores)
FLAT_SCORES_BUFFER = changed(
    "flash_attention",
    ("    grid = (", "    scores = [torch.empty(t_q * t_k // 2 + 1, dtype=torch.float32, device=q.device)\n"
                   "              for _ in range(2 * batch * heads)]\n"
                   "    grid = ("),
)

# the thirty-first review's f03: only the scores a causal mask leaves visible, packed, one buffer per batch·head
PACKED_SCORES_BUFFER = changed(
    "flash_attention",
    ("    grid = (", "    hidden = t_q * (t_q - 1) // 2 if causal and t_q <= t_k else 0\n"
                   "    scores = [torch.empty(t_q * t_k - hidden, dtype=torch.float32, device=q.device)\n"
                   "              for _ in range(batch * heads)]\n"
                   "    grid = ("),
)

BUGGY = [
    # every key in one block (review 50's F1): right, and no tile
    Variant("flash_keys_at_once", changed("flash_attention", (
        "BLOCK_N=block_n,", "BLOCK_N=max(16, triton.next_power_of_2(t_k)),")),
            "flash_attention", "flash_attention.keys_not_streamed"),
    Variant("decode_cache_at_once", changed("decode_attention", (
        "BLOCK_N=block_n,", "BLOCK_N=triton.next_power_of_2(k_cache.shape[2]),")),
            "decode_attention", "decode_attention.cache_not_streamed"),
    Variant("decode_block_d_rounded_down", changed(  # 16 lanes for a head of 20
        "decode_attention", ("BLOCK_D=triton.next_power_of_2(d)", "BLOCK_D=2 ** int(math.log2(d))")),
            "decode_attention", "decode_attention.block_d_below_width"),
    # softmax
    Variant("softmax_unmasked_load", changed(
        "softmax_kernel",
        ("x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=inside, other=-float(\"inf\"))",
         "x = tl.load(x_ptr + row * stride_xr + cols * stride_xc)")), "softmax", "softmax.unmasked_load"),
    Variant("softmax_other_zero", changed("softmax_kernel", ('other=-float("inf")', "other=0.0")),
            "softmax", "softmax.other_zero"),
    Variant("softmax_no_max", changed("softmax_kernel", ("e = tl.exp(x - tl.max(x, axis=0))", "e = tl.exp(x)")),
            "softmax", "softmax.no_max"),
    Variant("softmax_block_from_rows", changed(
        "softmax", ("block = triton.next_power_of_2(n_cols)", "block = triton.next_power_of_2(n_rows)")),
        "softmax", "softmax.block_narrower_than_row"),
    Variant("softmax_block_not_power_of_two", changed(
        "softmax", ("block = triton.next_power_of_2(n_cols)", "block = n_cols")),
        "softmax", "softmax.block_not_power_of_two"),
    Variant("softmax_strides_ignored", changed(
        "softmax", ("x.stride(0), x.stride(1), y.stride(0), y.stride(1)", "n_cols, 1, n_cols, 1")),
        "softmax", "softmax.strides_ignored"),
    Variant("softmax_column_stride_ignored", changed(
        "softmax_kernel", ("x_ptr + row * stride_xr + cols * stride_xc", "x_ptr + row * stride_xr + cols")),
        "softmax", "softmax.column_stride_ignored"),
    Variant("softmax_masked_row_zero", changed(  # a guard of attention's kernels, where torch.softmax gives NaN
        "softmax_kernel", ("e = tl.exp(x - tl.max(x, axis=0))",
                           "top = tl.max(x, axis=0)\n    e = tl.exp(x - tl.where(top == -float(\"inf\"), 0.0, top))"),
        ("/ tl.sum(e, axis=0)", "/ tl.maximum(tl.sum(e, axis=0), 1e-30)")),
        "softmax", "softmax.masked_row_not_nan"),
    Variant("softmax_padding_in_max", changed(
        "softmax_kernel", ("e = tl.exp(x - tl.max(x, axis=0))",
                           "e = tl.where(inside, tl.exp(x - tl.max(tl.where(inside, x, 0.0), axis=0)), 0.0)")),
        "softmax", "softmax.padding_in_max"),
    Variant("softmax_output_strides", changed("softmax", ("y.stride(0), y.stride(1)", "x.stride(0), x.stride(1)")),
            "softmax", "softmax.output_strides"),
    Variant("softmax_in_torch", SOFTMAX_IN_TORCH, "softmax", "softmax.no_kernel"),
    Variant("softmax_block_too_small", changed(  # rows of 300 in 64 lanes: the wide check
        "softmax", ("block = triton.next_power_of_2(n_cols)", "block = 64")), "softmax"),
    Variant("softmax_float32_output", changed(  # the half types' checks: the output's dtype
        "softmax", ("y = torch.empty((n_rows, n_cols), dtype=x.dtype", "y = torch.empty((n_rows, n_cols), "
                    "dtype=torch.float32")), "softmax"),
    # flash_attention
    Variant("flash_nan_rows", changed(
        "flash_forward_kernel", ('shift = tl.where(m_new == -float("inf"), 0.0, m_new)', "shift = m_new")),
        "flash_attention", "flash_attention.nan_rows"),
    Variant("flash_top_left", changed("flash_forward_kernel", ("offset = t_k - t_q", "offset = 0")),
            "flash_attention", "flash_attention.top_left"),
    Variant("flash_keys_past_end", changed("flash_forward_kernel", ("visible = cols[None, :] < t_k",
                                                                     "visible = cols[None, :] >= 0")),
            "flash_attention", "flash_attention.keys_past_end"),
    Variant("flash_no_rescale", changed("flash_forward_kernel", ("alpha = tl.exp(m - shift)", "alpha = tl.full((BLOCK_M,), 1.0, tl.float32)")),
            "flash_attention", "flash_attention.no_rescale"),
    Variant("flash_lse_last_block", changed(
        "flash_forward_kernel",
        ("        m = m_new\n", "        m = m_new\n"
         "        block_max = tl.max(s, axis=1)\n"
         '        block_shift = tl.where(block_max == -float("inf"), 0.0, block_max)\n'
         "        last_lse = block_max + tl.log(tl.sum(tl.exp(s - block_shift[:, None]), axis=1))\n"),
        ("    lse = m + tl.log(l)", "    lse = last_lse"),
        ("    end = t_k\n", "    end = t_k\n    last_lse = tl.zeros((BLOCK_M,), dtype=tl.float32)\n")),
        "flash_attention", "flash_attention.lse_last_block"),
    Variant("flash_lse_without_max", changed("flash_forward_kernel", ("lse = m + tl.log(l)", "lse = tl.log(l)")),
            "flash_attention", "flash_attention.lse_without_max"),
    Variant("flash_lse_in_base_two", changed("flash_forward_kernel", ("lse = m + tl.log(l)",
                                                                      "lse = (m + tl.log(l)) * 1.4426950408889634")),
            "flash_attention", "flash_attention.lse_in_base_two"),
    Variant("flash_strides_swapped", changed(
        "flash_forward_kernel",
        ("    block = tl.program_id(0)\n",
         "    block = tl.program_id(0)\n"
         "    stride_qt, stride_qd = stride_qd, stride_qt\n"
         "    stride_kt, stride_kd = stride_kd, stride_kt\n"
         "    stride_vt, stride_vd = stride_vd, stride_vt\n")),
        "flash_attention", "flash_attention.strides_swapped"),
    Variant("flash_program_ids_swapped", changed(
        "flash_forward_kernel", ("    block = tl.program_id(0)\n    bh = tl.program_id(1)",
                                 "    block = tl.program_id(1)\n    bh = tl.program_id(0)")),
        "flash_attention", "flash_attention.program_ids_swapped"),
    Variant("flash_acc_in_half", changed(
        "flash_forward_kernel",
        ("acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)", "acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=q.dtype)"),
        ("acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision=\"ieee\")",
         "acc = (alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision=\"ieee\")).to(q.dtype)")),
        "flash_attention", "flash_attention.acc_in_half"),
    Variant("flash_block_not_power_of_two", changed(
        "flash_attention", ("BLOCK_D=max(16, triton.next_power_of_2(d))", "BLOCK_D=d")),
        "flash_attention", "flash_attention.block_not_power_of_two"),
    Variant("flash_lse_unscaled_max", changed("flash_forward_kernel", ("lse = m + tl.log(l)",
                                                                       "lse = m / scale + tl.log(l)")),
            "flash_attention", "flash_attention.lse_unscaled_max"),
    Variant("flash_acc_not_rescaled", changed("flash_forward_kernel", ("acc = alpha[:, None] * acc +", "acc = acc +")),
            "flash_attention", "flash_attention.acc_not_rescaled"),
    Variant("flash_l_not_rescaled", changed("flash_forward_kernel", ("l = alpha * l +", "l = l +")),
            "flash_attention", "flash_attention.l_not_rescaled"),
    Variant("flash_scale_from_padded_width", changed(
        "flash_attention", ("heads, t_q, t_k, d, 1.0 / math.sqrt(d),",
                            "heads, t_q, t_k, d, 1.0 / math.sqrt(max(16, triton.next_power_of_2(d))),")),
        "flash_attention", "flash_attention.scale_from_padded_width"),
    Variant("flash_grid_rounded_down", changed("flash_attention", ("grid = (triton.cdiv(t_q, block_m), batch * heads)",
                                                                   "grid = (t_q // block_m, batch * heads)")),
            "flash_attention", "flash_attention.grid_rounded_down"),
    Variant("flash_grid_from_keys", changed("flash_attention", ("grid = (triton.cdiv(t_q, block_m), batch * heads)",
                                                                "grid = (triton.cdiv(k.shape[-2], block_m), batch * heads)")),
            "flash_attention", "flash_attention.grid_from_keys"),
    Variant("flash_rescale_sign_flipped", changed("flash_forward_kernel", ("alpha = tl.exp(m - shift)",
                                                                           "alpha = tl.exp(shift - m)")),
            "flash_attention", "flash_attention.rescale_sign_flipped"),
    Variant("flash_score_matrix", SCORES_BUFFER, "flash_attention", "flash_attention.score_matrix"),
    Variant("flash_score_buffers_in_pieces", FLAT_SCORES_BUFFER, "flash_attention", "flash_attention.score_matrix"),
    Variant("flash_causal_scores_packed", PACKED_SCORES_BUFFER, "flash_attention", "flash_attention.score_matrix"),
    Variant("flash_in_torch", FLASH_IN_TORCH, "flash_attention", "flash_attention.no_kernel"),
    Variant("flash_block_m_ignored", changed(  # the grid by block_m, the kernel's tiles of 16: block_sizes
        "flash_attention", ("BLOCK_M=block_m", "BLOCK_M=16")), "flash_attention"),
    Variant("flash_contiguous_assumed", changed(  # the strided check
        "flash_attention", ("*q.stride(), *k.stride(), *v.stride()",
                            "*q.contiguous().stride(), *k.contiguous().stride(), *v.contiguous().stride()")),
        "flash_attention"),
    Variant("flash_v_with_k_strides", changed(  # the layouts check: k contiguous, v as split heads
        "flash_forward_kernel", ("v = tl.load(v_ptr + b * stride_vb + h * stride_vh",
                                 "v = tl.load(v_ptr + b * stride_kb + h * stride_kh")), "flash_attention"),
    Variant("flash_no_diagonal", changed(  # causal with Tq = Tk
        "flash_forward_kernel", ("cols[None, :] <= offset + rows[:, None]", "cols[None, :] < offset + rows[:, None]")),
        "flash_attention", "flash_attention.diagonal_masked"),
    Variant("flash_causal_loop_one_short", changed(  # the causal check: Tk - Tq = 17, key 32 starts a block
        "flash_forward_kernel", ("end = tl.minimum(t_k, offset + (block + 1) * BLOCK_M)",
                                 "end = tl.minimum(t_k, offset + (block + 1) * BLOCK_M - 1)")),
        "flash_attention", "flash_attention.causal_loop_one_short"),
    Variant("flash_batch_offset_one_stride", changed(  # the layouts check: two batches, q and v as split heads
        "flash_forward_kernel", ("q_ptr + b * stride_qb + h * stride_qh", "q_ptr + bh * stride_qh"),
        ("k_ptr + b * stride_kb + h * stride_kh", "k_ptr + bh * stride_kh"),
        ("v_ptr + b * stride_vb + h * stride_vh", "v_ptr + bh * stride_vh")),
        "flash_attention", "flash_attention.batch_offset_one_stride"),
    Variant("flash_lanes_unmasked", changed(  # D = 20 in 32 lanes: the loads read past each row
        "flash_forward_kernel", ("mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)",
                                 "mask=rows[:, None] < t_q, other=0.0)  # (BLOCK_M, BLOCK_D)"),
        ("kv_mask = (cols[:, None] < t_k) & (dims[None, :] < d)", "kv_mask = cols[:, None] < t_k")),
        "flash_attention", "flash_attention.lanes_unmasked"),
    # decode_attention
    Variant("decode_past_length", changed(
        "decode_attention", ("q, k_cache, v_cache, out, lengths,", "q, k_cache, v_cache, out, torch.full_like(lengths, k_cache.shape[2]),")),
        "decode_attention", "decode_attention.past_length"),
    Variant("decode_cache_with_query_strides", changed(
        "decode_attention", ("*q.stride(), *k_cache.stride(), *v_cache.stride(),",
                             "*q.stride(), *q.stride()[:2], *k_cache.stride()[2:], *q.stride()[:2], *v_cache.stride()[2:],")),
        "decode_attention", "decode_attention.cache_with_query_strides"),
    Variant("decode_cache_assumed_contiguous", changed(
        "decode_attention", ("*q.stride(), *k_cache.stride(), *v_cache.stride(),",
                             "*q.stride(), *torch.empty(k_cache.shape).stride(), *torch.empty(v_cache.shape).stride(),")),
        "decode_attention", "decode_attention.cache_assumed_contiguous"),
    Variant("decode_block_not_power_of_two", changed(
        "decode_attention", ("BLOCK_D=triton.next_power_of_2(d)", "BLOCK_D=d")),
        "decode_attention", "decode_attention.block_not_power_of_two"),
    Variant("decode_block_max_not_running", changed(  # the long check: a first key far above every later one
        "decode_kernel", ("m_new = tl.maximum(m, tl.max(s, axis=0))", "m_new = tl.max(s, axis=0)")),
        "decode_attention", "decode_attention.block_max_not_running"),
    Variant("decode_k_with_v_strides", changed(  # the layouts check: k_cache and v_cache laid out differently
        "decode_kernel", ("k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd",
                          "k_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd")),
        "decode_attention", "decode_attention.strides_of_the_other_cache"),
    Variant("decode_key_lanes_unmasked", changed(  # D = 20 in 32 lanes: k's lanes past D read the next slot
        "decode_kernel", ("k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,\n                    mask=mask,",
                          "k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,\n                    mask=cols[:, None] < n,")),
        "decode_attention", "decode_attention.key_lanes_unmasked"),
    Variant("decode_max_started_at_zero", changed(  # the negative check: every score near -150
        "decode_kernel", ('m = tl.max(tl.full((BLOCK_N,), -float("inf"), dtype=tl.float32), axis=0)',
                          "m = tl.max(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)")),
        "decode_attention", "decode_attention.max_started_at_zero"),
    Variant("decode_first_length", changed("decode_kernel", ("n = tl.load(len_ptr + b)", "n = tl.load(len_ptr)")),
            "decode_attention", "decode_attention.first_length"),
    Variant("decode_in_torch", DECODE_IN_TORCH, "decode_attention", "decode_attention.no_kernel"),
    Variant("decode_keys_past_length", changed("decode_kernel", ('s = tl.where(cols < n, s, -float("inf"))', "")),
            "decode_attention", "decode_attention.keys_past_length"),
    Variant("decode_rescale_sign_flipped", changed("decode_kernel", ("alpha = tl.exp(m - m_new)",
                                                                     "alpha = tl.exp(m_new - m)")),
            "decode_attention", "decode_attention.rescale_sign_flipped"),
    Variant("decode_empty_nan", changed("decode_kernel", ("out = acc / tl.where(l > 0, l, 1.0)", "out = acc / l")),
            "decode_attention", "decode_attention.empty_nan"),
    Variant("decode_program_ids_swapped", changed("decode_kernel", ("b, h = bh // n_heads, bh % n_heads",
                                                                    "b, h = bh % n_heads, bh // n_heads")),
            "decode_attention", "decode_attention.program_ids_swapped"),
    Variant("decode_no_rescale", changed("decode_kernel", ("acc = alpha * acc +", "acc = acc +"),
                                         ("l = alpha * l +", "l = l +")),
            "decode_attention", "decode_attention.no_rescale"),
    Variant("decode_acc_not_rescaled", changed("decode_kernel", ("acc = alpha * acc +", "acc = acc +")),
            "decode_attention", "decode_attention.acc_not_rescaled"),
    Variant("decode_l_not_rescaled", changed("decode_kernel", ("l = alpha * l +", "l = l +")),
            "decode_attention", "decode_attention.l_not_rescaled"),
    Variant("decode_scale_from_padded_width", changed(
        "decode_attention", ("heads, d, 1.0 / math.sqrt(d),", "heads, d, 1.0 / math.sqrt(triton.next_power_of_2(d)),")),
        "decode_attention", "decode_attention.scale_from_padded_width"),
    Variant("decode_contiguous_assumed", changed(  # the strided check
        "decode_attention", ("*q.stride(), *k_cache.stride(), *v_cache.stride()",
                             "*q.contiguous().stride(), *k_cache.contiguous().stride(), "
                             "*v_cache.contiguous().stride()")),
        "decode_attention"),
    Variant("decode_batch_head_folded", changed(  # the layouts check: right only where stride_kb = H·stride_kh
        "decode_kernel", ("k = tl.load(k_ptr + b * stride_kb + h * stride_kh", "k = tl.load(k_ptr + bh * stride_kh")),
        "decode_attention"),
    Variant("decode_float32_output", changed(  # the float16 check: the output's dtype
        "decode_attention", ("out = torch.empty((batch, heads, d), dtype=q.dtype", "out = torch.empty((batch, "
                             "heads, d), dtype=torch.float32")), "decode_attention"),
]

CORRECT = [
    Variant("decode_lengths_converted", changed(  # conversions the launcher may make (the tenth hostile review's f02)
        "decode_attention", ("out, lengths, *q.stride()", "out, lengths.int().long().contiguous(), *q.stride()"))),
    Variant("softmax_exp2", changed(  # e^x as 2^(x·log2 e), as fast kernels write it
        "softmax_kernel", ("e = tl.exp(x - tl.max(x, axis=0))", "e = tl.exp2((x - tl.max(x, axis=0)) * 1.4426950408889634)"))),
    Variant("flash_blocks_32", changed(  # other default tiles
        "flash_attention", ("causal: bool = False, block_m: int = 16, block_n: int = 16",
                            "causal: bool = False, block_m: int = 32, block_n: int = 32"))),
    Variant("decode_block_32", changed("decode_attention", ("lengths: torch.Tensor, block_n: int = 16",
                                                            "lengths: torch.Tensor, block_n: int = 32"))),
]

RULES_ONLY = [
    Variant("softmax_in_torch_beside_a_kernel", SOFTMAX_IN_TORCH.replace(
        "    return (e / e.sum(-1, keepdim=True)).to(x.dtype)",
        "    y = torch.empty_like(x)\n    softmax_kernel[(1,)](x, y, 0, 1, 1, 1, 1, BLOCK=16)  # launched, does nothing\n"
        "    return (e / e.sum(-1, keepdim=True)).to(x.dtype)"), "softmax"),
    Variant("softmax_in_numpy_beside_a_kernel", """

def softmax(x):
    import numpy as np
    a = x.float().cpu().numpy()
    e = np.exp(a - a.max(-1, keepdims=True))
    y = torch.empty_like(x)
    softmax_kernel[(1,)](x, y, 0, 1, 1, 1, 1, BLOCK=16)  # launched, does nothing
    return torch.from_numpy(e / e.sum(-1, keepdims=True)).to(x.dtype)
""", "softmax"),
    Variant("softmax_checks_with_torch", changed(
        "softmax", ("    return y\n", "    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-3)\n"
                                     "    return y\n")), "softmax"),
    Variant("flash_checks_with_sdpa", changed(
        "flash_attention", ("    return out, lse\n",
                            "    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)\n"
                            "    return out, lse\n")), "flash_attention"),
    Variant("softmax_in_torch_by_names_no_list_forbids", """

def softmax(x):  # the ninth hostile review's a06: torch names a forbidden list missed, beside a kernel
    y = torch.empty_like(x)
    softmax_kernel[(1,)](x, y, 0, 1, 1, 1, 1, BLOCK=16)  # launched, does nothing
    z = torch.subtract(x.float(), x.float().sort(-1).values[..., -1:])
    e = torch.special.exp2(torch.multiply(z, 1.4426950408889634))
    return torch.true_divide(e, torch.nansum(e, -1, keepdim=True)).to(x.dtype)
""", "softmax"),
    Variant("softmax_in_python_from_the_bytes", """

def softmax(x):  # the tenth hostile review's a01: a kernel launched to do nothing, the work done in Python floats
    import math
    import struct
    y = torch.empty_like(x)
    softmax_kernel[(1,)](x, y, 0, 1, 1, 1, 1, BLOCK=16)
    rows, cols = x.shape
    raw = bytes(x.float().contiguous().untyped_storage()) if x.dtype != torch.float32 else bytes(
        x.contiguous().untyped_storage())
    flat = struct.unpack(f"{rows * cols}f", raw[: 4 * rows * cols])
    out = []
    for r in range(rows):
        row = flat[r * cols:(r + 1) * cols]
        top = max(row)
        e = [math.exp(v - top) for v in row]
        out.extend(v / sum(e) for v in e)
    return torch.tensor(out).view(rows, cols).to(x.dtype)
""", "softmax"),
    Variant("decode_checks_with_matmul", changed(
        "decode_attention", ("    return out\n", "    torch.matmul(q[:, :, None, :], k_cache.transpose(-1, -2))\n"
                                               "    return out\n")), "decode_attention"),
]

# Bugs of the situations a step's checks add (spec.Check.situation): right in the plain case, wrong in each of the
# others in a way no listed mistake explains; each check names its situation.
ODD_SOFTMAX = changed(
    "softmax_kernel",
    ("stride_yc, BLOCK: tl.constexpr):", "stride_yc, BLOCK: tl.constexpr, ODD: tl.constexpr):"),
    ("    y = e / tl.sum(e, axis=0)\n",
     "    y = e / tl.sum(e, axis=0)\n"
     "    extreme = (tl.max(x, axis=0) < -50.0) | (tl.max(x, axis=0) > 50.0)\n"
     "    y = tl.where(extreme | (ODD == 1), y * 1.1, y)\n"),
) + changed(
    "softmax",
    ("BLOCK=block)", "BLOCK=block,\n                                 ODD=int(x.dtype != torch.float32 or x.stride(1) != 1 "
                     "or n_cols > 64))"),
)
ODD_FLASH = changed(
    "flash_attention",
    ("heads, t_q, t_k, d, 1.0 / math.sqrt(d),",
     "heads, t_q, t_k, d, (1.1 if causal or q.dtype != torch.float32 or not q.is_contiguous() else 1.0) / "
     "math.sqrt(d),"),
)
ODD_DECODE = changed(
    "decode_attention",
    ("heads, d, 1.0 / math.sqrt(d),",
     "heads, d, (1.1 if q.dtype != torch.float32 or not (q.is_contiguous() and k_cache.is_contiguous()) "
     "or k_cache.shape[2] in (13, 128) else 1.0) / math.sqrt(d),"),
)
BUGGY += [
    Variant("softmax_situations", ODD_SOFTMAX, "softmax", situations=(
        "softmax.strides_mishandled", "softmax.half_mishandled", "softmax.extreme_rows_mishandled",
        "softmax.wide_rows_mishandled", "softmax.large_scores_mishandled")),
    Variant("flash_situations", ODD_FLASH, "flash_attention", situations=(
        "flash_attention.causal_mishandled", "flash_attention.no_key_rows_mishandled",
        "flash_attention.strides_mishandled", "flash_attention.block_sizes_mishandled",
        "flash_attention.half_mishandled")),
    Variant("decode_situations", ODD_DECODE, "decode_attention", situations=(
        "decode_attention.strides_mishandled", "decode_attention.half_mishandled",
        "decode_attention.lengths_mishandled", "decode_attention.long_sequences_mishandled")),
]

# Bugs located by what is right (grader/engine/locate.py): one row, one batch·head, one sequence; out or lse alone.
BUGGY += [
    Variant("softmax_rows_off", changed(
        "softmax_kernel",
        ("stride_yc, BLOCK: tl.constexpr):", "stride_yc, BLOCK: tl.constexpr, ODD: tl.constexpr):"),
        ("    y = e / tl.sum(e, axis=0)\n", "    y = e / tl.sum(e, axis=0) * (1.0 + 0.1 * ODD)\n"),
    ) + changed("softmax", ("BLOCK=block)", "BLOCK=block, ODD=int(n_rows > 1))")),
        "softmax", "softmax.rows_mixed"),
    Variant("flash_heads_off", changed(
        "flash_attention", ("heads, t_q, t_k, d, 1.0 / math.sqrt(d),",
                            "heads, t_q, t_k, d, (1.1 if batch * heads > 1 else 1.0) / math.sqrt(d),")),
        "flash_attention", "flash_attention.heads_mixed"),
    Variant("flash_lse_shifted", changed("flash_forward_kernel", ("lse = m + tl.log(l)", "lse = m + tl.log(l) + 0.5")),
            "flash_attention", "flash_attention.lse_mishandled"),
    Variant("flash_out_scaled", changed("flash_forward_kernel", ("out = acc / tl.where(l > 0, l, 1.0)[:, None]",
                                                                 "out = acc / tl.where(l > 0, l, 1.0)[:, None] * 1.1")),
            "flash_attention", "flash_attention.out_mishandled"),
    Variant("decode_sequences_off", changed(
        "decode_attention", ("heads, d, 1.0 / math.sqrt(d),", "heads, d, (1.1 if batch > 1 else 1.0) / math.sqrt(d),")),
        "decode_attention", "decode_attention.sequences_mixed"),
]
BUGGY += [
    Variant("flash_several_blocks", changed(
        "flash_attention", ("heads, t_q, t_k, d, 1.0 / math.sqrt(d),",
                            "heads, t_q, t_k, d, (1.1 if t_k > block_n else 1.0) / math.sqrt(d),")),
        "flash_attention", "flash_attention.blocks_mishandled"),
    Variant("softmax_log_space", changed("softmax_kernel", ("    y = e / tl.sum(e, axis=0)\n",
                                                            "    y = x - tl.max(x, axis=0) - tl.log(tl.sum(e, axis=0))\n")),
            "softmax", "softmax.log_space"),
    Variant("decode_unscaled", changed("decode_kernel", ("s = tl.sum(k * q[None, :], axis=1) * scale",
                                                         "s = tl.sum(k * q[None, :], axis=1)")),
            "decode_attention", "decode_attention.unscaled"),
]
