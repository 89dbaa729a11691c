"""Exercise: attention's kernels in Triton, with the Python launchers that start them.

Write three GPU kernels in Triton and the Python functions that launch them: a fused row
softmax, FlashAttention's forward pass (tiles of queries and keys, the online softmax, the
log-sum-exp), and one decoding step against a KV cache. Grade your work with:

    attn-grade exercises/triton_attention.py

Triton's model, for a PyTorch user:

- A kernel is a Python function decorated with @triton.jit. It is compiled for the GPU
  (or, with TRITON_INTERPRET=1, run on the CPU by Triton's interpreter, as the grader
  does where there is no CUDA), and it works on blocks, not on whole tensors.
- A launch, kernel[grid](args...), starts one *program* per point of the grid (a tuple of
  1 to 3 ints): tl.program_id(0) says which one this is. A program owns a piece of the
  output (a row, a block of queries for one batch·head) and computes it in registers.
- Tensors arrive as pointers to their first element; their shapes and strides are plain
  int arguments. Element (i, j) of x is at x_ptr + i * x.stride(0) + j * x.stride(1):
  pass every stride (x.stride() gives them) and a transposed or sliced view works too.
- tl.arange(0, BLOCK) is the vector 0 .. BLOCK-1; BLOCK must be a tl.constexpr (known
  when the kernel is compiled, passed as BLOCK=... by keyword) and a power of two. Blocks
  of offsets broadcast as in torch: rows[:, None] * stride_r + cols[None, :] * stride_c is
  a (len(rows), len(cols)) block of pointers.
- tl.load(pointers, mask=..., other=...) reads a block; lanes where mask is False are not
  read and take the value `other`. tl.store(pointers, values, mask=...) writes only where
  mask is True. A size that is not a multiple of the block (37 columns in 64 lanes) needs
  both masks: an unmasked load reads past the end (another row, or garbage), an unmasked
  store writes there.
- tl.dot(a, b) multiplies an (M, K) block by a (K, N) block; M, N and K must be at least
  16. Accumulate in float32 (tl.zeros(..., dtype=tl.float32)), whatever the inputs' dtype.
- Reductions (tl.max, tl.sum) take an axis; tl.exp, tl.log, tl.where, tl.maximum work
  elementwise; x.to(tl.float32) casts; out_ptr.dtype.element_ty is the type a pointer
  points to (cast before storing).
- A loop `for start in range(0, n, BLOCK_N):` runs inside the kernel, n a runtime value.

The launchers allocate the outputs with torch.empty and launch the kernel; the work is the
kernel's. The grader checks that each launcher launched a @triton.jit function, that it
calls no softmax, matmul, attention or arithmetic of torch's and moves no tensor out of torch
(NumPy, .tolist(), .item()), and that no tensor its torch calls create holds the score matrix.
Every launcher returns its results on the device of its inputs (CUDA, or the CPU under the
interpreter).
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
    # TODO
    pass


def softmax(x: torch.Tensor) -> torch.Tensor:
    """The softmax of each row of x (n_rows, n_cols), by softmax_kernel: one program per row.

    x may have any strides (a transposed view, a slice) and dtype float32, float16 or
    bfloat16; the result is a new (n_rows, n_cols) tensor of x's dtype on x's device,
    computed in float32 inside the kernel. A row of -inf only is NaN, as torch.softmax gives.

    Why: a fused kernel reads each row once and writes it once, where x.exp() / sum
    reads and writes the whole tensor several times; the max is subtracted so that
    e^x never overflows.
    """
    # TODO
    raise NotImplementedError("softmax: not implemented yet")


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
    # TODO
    pass


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
    # TODO
    raise NotImplementedError("flash_attention: not implemented yet")


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
    # TODO
    pass


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
    # TODO
    raise NotImplementedError("decode_attention: not implemented yet")
