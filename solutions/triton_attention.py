"""Reference solution: attention's kernels in Triton, with their Python launchers.

A model answer to exercises/triton_attention.py: the same kernels and launchers with the
same contracts, each written as the shortest clear code, with the shape of every block in
a comment. Compare with your own once the grader passes, or when you are stuck on a step.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, stride_xr, stride_xc, stride_yr, stride_yc, BLOCK: tl.constexpr):
    """One program per row: y[row] = softmax(x[row]), computed in float32.

    BLOCK is a power of two at least n_cols: the lanes past n_cols are masked, loaded as
    -inf (e^-inf = 0 adds nothing to the sum) and never stored.
    """
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)  # (BLOCK,)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_xr + cols * stride_xc, mask=inside, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))  # the max subtracted: every exponent <= 0, nothing overflows
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride_yr + cols * stride_yc, y.to(y_ptr.dtype.element_ty), mask=inside)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """The softmax of each row of x (n_rows, n_cols), by softmax_kernel: one program per row.

    x may have any strides (a transposed view, a slice) and dtype float32, float16 or
    bfloat16; the result is a new (n_rows, n_cols) tensor of x's dtype on x's device,
    computed in float32 inside the kernel. A row of -inf only is NaN, as torch.softmax gives.

    Why: a fused kernel reads each row once and writes it once, where x.exp() / sum
    reads and writes the whole tensor several times; the max is subtracted so that
    e^x never overflows.
    """
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(n_cols)  # tl.arange needs a power of two
    softmax_kernel[(n_rows,)](x, y, n_cols, x.stride(0), x.stride(1), y.stride(0), y.stride(1), BLOCK=block)
    return y


@triton.jit
def flash_forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    stride_lb, stride_lh, stride_lt,
    n_heads, t_q, t_k, d, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per block of BLOCK_M queries (axis 0) and per batch·head (axis 1).

    The program loads its query block once, streams the key and value blocks through the
    online softmax (running max m, sum l, unnormalised output acc, all float32), and
    stores out = acc / l and lse = m + log l. Causal: query i sits at position
    t_k - t_q + i (bottom-right) and sees keys j <= it; key blocks wholly past the last
    query of the block are never loaded.
    """
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions in q
    dims = tl.arange(0, BLOCK_D)  # (BLOCK_D,) the head's width, padded to a power of two
    q_mask = (rows[:, None] < t_q) & (dims[None, :] < d)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + dims[None, :] * stride_qd,
                mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
    m = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    offset = t_k - t_q  # query i sits at key position offset + i
    end = t_k
    if CAUSAL:  # the block's last query sees keys up to offset + its row: later key blocks are all masked
        end = tl.minimum(t_k, offset + (block + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,) key positions
        kv_mask = (cols[:, None] < t_k) & (dims[None, :] < d)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
        # (BLOCK_M, BLOCK_D) @ (BLOCK_D, BLOCK_N); ieee: float32 inputs multiplied exactly (a GPU's default, TF32,
        # keeps 10 bits of each); the half types use the tensor cores either way
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = cols[None, :] < t_k  # (1, BLOCK_N): keys past the end are no keys
        if CAUSAL:
            visible = visible & (cols[None, :] <= offset + rows[:, None])  # (BLOCK_M, BLOCK_N)
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))  # (BLOCK_M,)
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)  # a row with nothing seen: e^(-inf - 0) = 0, not NaN
        alpha = tl.exp(m - shift)  # (BLOCK_M,): rescales what was summed relative to the old max
        p = tl.exp(s - shift[:, None])  # (BLOCK_M, BLOCK_N)
        l = alpha * l + tl.sum(p, axis=1)
        acc = alpha[:, None] * acc + tl.dot(p.to(v.dtype), v, input_precision="ieee")  # (BLOCK_M, BLOCK_D)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)[:, None]  # a row with no key: acc = 0, out 0
    lse = m + tl.log(l)  # -inf for a row with no key
    tl.store(o_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_ot + dims[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + rows * stride_lt, lse, mask=rows < t_q)


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_m: int = 16, block_n: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention's forward pass by flash_forward_kernel: returns out and lse.

    q (B, H, Tq, D), k and v (B, H, Tk, D), any strides, one dtype among float32,
    float16 and bfloat16. Scores are q · k / sqrt(D); with causal=True the mask is
    aligned to the bottom-right: query i sits at position Tk - Tq + i and sees the keys
    j <= Tk - Tq + i. Returns out (B, H, Tq, D) in q's dtype and lse (B, H, Tq) in
    float32, the log-sum-exp of each row's scaled, masked scores. Any Tq, Tk and D work,
    multiples of the blocks or not; a row with no key (causal, Tq > Tk) gives out 0 and
    lse -inf. block_m queries and block_n keys per tile: powers of two, at least 16
    (tl.dot's smallest). The grid: one program per query block (axis 0) and per batch·head
    (axis 1).

    Why: the Tq × Tk scores never leave the chip: each program holds one
    block_m × block_n tile at a time, so memory traffic is the inputs and outputs only.
    """
    batch, heads, t_q, d = q.shape
    t_k = k.shape[2]
    out = torch.empty((batch, heads, t_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, t_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(t_q, block_m), batch * heads)
    flash_forward_kernel[grid](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        heads, t_q, t_k, d, 1.0 / math.sqrt(d),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
    )
    return out, lse


@triton.jit
def decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, len_ptr,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_od,
    n_heads, d, scale, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per batch·head: one query against the first lengths[b] keys of its cache.

    One query is a vector, too small for tl.dot (at least 16 rows): the scores of a key
    block are a broadcast product summed over the head's width. The online softmax
    carries a scalar max and sum and a (BLOCK_D,) output from block to block.
    """
    bh = tl.program_id(0)
    b, h = bh // n_heads, bh % n_heads
    n = tl.load(len_ptr + b)  # this sequence's keys: the cache past them is unused
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + dims * stride_qd, mask=dims < d, other=0.0).to(tl.float32)
    m = tl.max(tl.full((BLOCK_N,), -float("inf"), dtype=tl.float32), axis=0)  # a float32 scalar, -inf
    l = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < n) & (dims[None, :] < d)  # (BLOCK_N, BLOCK_D)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale  # (BLOCK_N,)
        s = tl.where(cols < n, s, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))  # finite: every block holds at least one key
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)  # (BLOCK_N,)
        l = alpha * l + tl.sum(p, axis=0)
        acc = alpha * acc + tl.sum(p[:, None] * v, axis=0)  # (BLOCK_D,)
        m = m_new
    out = acc / tl.where(l > 0, l, 1.0)  # no key (length 0): 0
    tl.store(o_ptr + b * stride_ob + h * stride_oh + dims * stride_od, out.to(o_ptr.dtype.element_ty), mask=dims < d)


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, block_n: int = 16
) -> torch.Tensor:
    """One new query per sequence against its KV cache, by decode_kernel: returns out (B, H, D).

    q (B, H, D); k_cache and v_cache (B, H, T_max, D), of which sequence b uses the first
    lengths[b] positions (lengths: (B,), int64, on q's device); what lies past them is
    unused, and may hold anything (NaN). Scores are q · k / sqrt(D). out in q's dtype; a
    sequence of length 0 gives 0. One program per batch·head; block_n keys per step, a
    power of two.

    Why: decoding asks one query per step, so the work is reading the cache once; a
    program per batch·head streams it block by block without a matrix product.
    """
    batch, heads, d = q.shape
    out = torch.empty((batch, heads, d), dtype=q.dtype, device=q.device)
    decode_kernel[(batch * heads,)](
        q, k_cache, v_cache, out, lengths, *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        heads, d, 1.0 / math.sqrt(d), BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d),
    )
    return out
