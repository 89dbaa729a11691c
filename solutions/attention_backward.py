"""Reference solution: attention's backward pass, plain and tile by tile, in plain PyTorch.

A model answer to exercises/attention_backward.py: the same functions with the same
contracts, each written as the shortest clear code, with the shape of every
broadcast and matmul in a comment. Compare with your own once the grader passes,
or when you are stuck on a step.
"""

import math

import torch


def softmax_backward(probs: torch.Tensor, grad_probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The gradient of the softmax's input from its output and the gradient of its output.

    probs = softmax(scores, dim) (any shape; a slice whose scores were all -inf
    is all 0), grad_probs = dL/dprobs of the same shape. Returns dL/dscores, of
    the same shape and dtype:

        dscores = probs ∘ (grad_probs − Σ_dim (grad_probs ∘ probs))

    the sum taken along `dim` and kept as an axis of size 1, so it broadcasts
    back over that axis. A slice of probs that is all 0 gives 0, never NaN.
    Products and sums only, in torch: no autograd, no complex numbers, no
    NumPy, and no exponential or logarithm (nor a function made of them: the
    softmax is not to be recomputed here).

    Why: the softmax's Jacobian is diag(p) − p pᵀ, so its vector-Jacobian
    product with g is p ∘ g − p (pᵀ g) = p ∘ (g − Σ p ∘ g): one elementwise
    product, one sum along the axis and one broadcast, never the Jacobian
    itself, which holds T² numbers per row. This is the whole of what the
    backward pass of attention adds to three matrix products.
    """
    inner = (grad_probs * probs).sum(dim=dim, keepdim=True)  # (..., 1, ...): size 1 along dim
    return probs * (grad_probs - inner)  # the same shape as probs


def attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients (dq, dk, dv) of out = softmax(q kᵀ / √D + mask) v, recomputing the forward.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), grad_out = dL/dout
    (..., Tq, Dv), any leading dims (batch, heads). mask is None or a bool tensor
    broadcastable to (..., Tq, Tk), True = may attend. Returns dq (..., Tq, D),
    dk (..., Tk, D), dv (..., Tk, Dv), in the inputs' dtype (float32 or float64).
    A row whose keys the mask blocks entirely has zero weights, so it gives zero
    gradients, never NaN.

    Recompute S = q kᵀ / √D (masked: -inf) and P = softmax(S); then

        dv = Pᵀ dO            dP = dO vᵀ            dS = softmax_backward(P, dP)
        dq = dS k / √D        dk = dSᵀ q / √D

    Call softmax_backward for dS. The softmax of the recompute is allowed;
    torch.autograd, .backward() and torch.func are not, nor numerical
    differentiation (complex numbers, or a tensor with one answer per input
    element: no tensor larger than a score matrix as wide as a head), nor
    NumPy or a tensor's values read into Python (.item(), .tolist()).

    Why: autograd would keep P (Tq × Tk per head) from the forward pass to use
    here; recomputing it costs one matrix product and saves that memory. Each
    gradient is a matrix product with the other operand of its forward product,
    transposed: out = P v gives dv = Pᵀ dO and dP = dO vᵀ; S = q kᵀ / √D gives
    dq = dS k / √D and dk = dSᵀ q / √D (the scale is part of the product).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale  # (..., Tq, D) @ (..., D, Tk) -> (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf)  # the mask broadcasts to (..., Tq, Tk)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # (..., Tq, Tk): a row with no key is 0, not NaN
    grad_v = probs.transpose(-2, -1) @ grad_out  # (..., Tk, Tq) @ (..., Tq, Dv) -> (..., Tk, Dv)
    grad_probs = grad_out @ v.transpose(-2, -1)  # (..., Tq, Dv) @ (..., Dv, Tk) -> (..., Tq, Tk)
    grad_scores = softmax_backward(probs, grad_probs, dim=-1) * scale  # (..., Tq, Tk): dS, and the 1/√D of S
    grad_q = grad_scores @ k  # (..., Tq, Tk) @ (..., Tk, D) -> (..., Tq, D)
    grad_k = grad_scores.transpose(-2, -1) @ q  # (..., Tk, Tq) @ (..., Tq, D) -> (..., Tk, D)
    return grad_q, grad_k, grad_v


def flash_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_q: int = 32,
    block_k: int = 32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention's backward pass, tile by tile: (dq, dk, dv) from the forward's out and lse.

    Shapes: q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv), any leading dims;
    out (..., Tq, Dv) and lse (..., Tq) as flash_attention returned them (lse is
    log Σ_j e^(s_ij) of each row's scaled, masked scores; -inf for a row with no
    key); grad_out = dL/dout (..., Tq, Dv). float32 or float64, one dtype.
    Scores are q · k / √D; with causal=True the mask is aligned to the
    bottom-right: query i sits at position Tk − Tq + i and sees the keys
    j <= Tk − Tq + i. Returns dq, dk, dv in the inputs' shapes and dtype; a row
    with no key to see gives zero gradients, never NaN.

    First D = rowsum(dO ∘ O), (..., Tq). Then for each tile of block_q queries
    × block_k keys (the last ones may be shorter): its scores S (masked), its
    probabilities recomputed from the saved lse, P = e^(S − lse), then

        dv += Pᵀ dO      dP = dO vᵀ      dS = P ∘ (dP − D)
        dq += dS k / √D  dk += dSᵀ q / √D

    each tile's part added to the gradients of its query and key blocks. At no
    time may more than one block_q × block_k tile of scores per batch and head
    exist (the grader checks the shapes of the tensors your torch calls
    create). No softmax, no F.scaled_dot_product_attention, no autograd
    (torch.autograd, .backward(), torch.func), no complex numbers, and no
    tensor's values read into Python (int(), float(), .item(), .tolist(),
    NumPy, printing one): bounds come from shapes and block sizes.

    Why: the backward pass needs P, which the forward never held whole. lse
    gives it back one tile at a time, exactly: e^(S − lse) is the softmax of
    the whole row. And softmax_backward's row sum Σ_j P_ij dP_ij is a sum over
    all keys, which one tile does not see; but it equals dO_i · O_i, since
    Σ_j P_ij dP_ij = Σ_j P_ij (dO_i · v_j) = dO_i · Σ_j P_ij v_j: one number per
    query, computed before the loop from what the forward returned.
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    offset = t_k - t_q  # query i sits at position offset + i
    delta = (grad_out * out).sum(dim=-1)  # (..., Tq): D = rowsum(dO ∘ O) = rowsum(P ∘ dP)
    lse = lse.masked_fill(lse == -math.inf, math.inf)  # a row with no key: e^(-inf - inf) = 0, not NaN
    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for j in range(0, t_k, block_k):  # key blocks outside: each one's dk and dv gather over every query block
        kb, vb = k[..., j:j + block_k, :], v[..., j:j + block_k, :]  # (..., bk, D), (..., bk, Dv)
        for i in range(0, t_q, block_q):
            qb, dob = q[..., i:i + block_q, :], grad_out[..., i:i + block_q, :]  # (..., bq, D), (..., bq, Dv)
            scores = qb @ kb.transpose(-2, -1) * scale  # (..., bq, D) @ (..., D, bk) -> (..., bq, bk)
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2], device=q.device)[:, None]  # (bq, 1)
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]  # (1, bk)
                scores = scores.masked_fill(cols > rows, -math.inf)  # (bq, bk) broadcasts over the leading dims
            probs = torch.exp(scores - lse[..., i:i + block_q, None])  # (..., bq, bk) - (..., bq, 1)
            grad_v[..., j:j + block_k, :] += probs.transpose(-2, -1) @ dob  # (..., bk, bq) @ (..., bq, Dv)
            grad_probs = dob @ vb.transpose(-2, -1)  # (..., bq, Dv) @ (..., Dv, bk) -> (..., bq, bk)
            grad_scores = probs * (grad_probs - delta[..., i:i + block_q, None]) * scale  # (..., bq, bk)
            grad_q[..., i:i + block_q, :] += grad_scores @ kb  # (..., bq, bk) @ (..., bk, D) -> (..., bq, D)
            grad_k[..., j:j + block_k, :] += grad_scores.transpose(-2, -1) @ qb  # (..., bk, bq) @ (..., bq, D)
    return grad_q, grad_k, grad_v


class FlashAttentionFunction(torch.autograd.Function):
    """Tiled attention as an autograd.Function: a tiled forward that saves lse, and flash_attention_backward.

    FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k) returns out
    (..., Tq, Dv), and out's gradients reach q, k and v through backward. Torch
    then never records the forward's operations: the graph holds one node, and
    memory holds q, k, v, out and lse, never a Tq × Tk matrix.

    Why: this is how a fused kernel joins autograd (FlashAttention's own
    Python binding is such a Function): the forward saves what the backward
    needs, and the backward says, by hand, what the gradients are.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        """out for q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv): attention computed tile by tile.

        Write the tiled forward here (the online softmax of flash_attention,
        block_q queries × block_k keys at a time, causal bottom-right), getting
        out (..., Tq, Dv) and lse (..., Tq) (a row with no key: out 0, lse -inf);
        save q, k, v, out and lse with ctx.save_for_backward, keep causal and the
        block sizes on ctx, and return out. float32 or float64; no softmax, and
        no tensor's values read into Python (as flash_attention_backward).
        """
        t_q, t_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        outs, lses = [], []
        for i in range(0, t_q, block_q):
            qb = q[..., i:i + block_q, :] * scale  # (..., bq, D), the scale folded into q
            m = torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype, device=q.device)  # (..., bq): running max
            total = torch.zeros_like(m)  # (..., bq): running sum of e^(s - m), FlashAttention's l
            acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)  # (..., bq, Dv)
            for j in range(0, t_k, block_k):
                scores = qb @ k[..., j:j + block_k, :].transpose(-2, -1)  # (..., bq, bk)
                if causal:
                    rows = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2], device=q.device)[:, None]
                    cols = torch.arange(j, j + scores.shape[-1], device=q.device)[None, :]
                    scores = scores.masked_fill(cols > rows, -math.inf)  # (bq, bk) positions, bottom-right
                m_new = torch.maximum(m, scores.amax(dim=-1))  # (..., bq)
                m_safe = torch.where(m_new == -math.inf, 0.0, m_new)  # a row with nothing seen yet subtracts 0
                alpha, p = torch.exp(m - m_safe), torch.exp(scores - m_safe[..., None])  # (..., bq), (..., bq, bk)
                total = alpha * total + p.sum(dim=-1)  # (..., bq)
                acc = alpha[..., None] * acc + p @ v[..., j:j + block_k, :]  # (..., bq, bk) @ (..., bk, Dv)
                m = m_new
            outs.append(acc / torch.where(total > 0, total, 1.0)[..., None])  # (..., bq, Dv): 0 for a row with no key
            lses.append(m + torch.log(total))  # (..., bq): -inf for a row with no key
        out, lse = torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)  # (..., Tq, Dv), (..., Tq)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        return out

    @staticmethod
    def backward(ctx, grad_out):
        """(dq, dk, dv, None, None, None) from grad_out = dL/dout (..., Tq, Dv).

        Read back what forward saved and call flash_attention_backward; return
        one gradient per argument of forward, None for causal, block_q and
        block_k (they are no tensors).
        """
        q, k, v, out, lse = ctx.saved_tensors
        grad_q, grad_k, grad_v = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_q,
                                                          ctx.block_k)
        return grad_q, grad_k, grad_v, None, None, None


def flash_attention_and_grads(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_q: int = 32,
    block_k: int = 32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Given, not a step: how the grader runs FlashAttentionFunction, forward then backward. Leave it as it is.

    Returns (out, dq, dk, dv): out = FlashAttentionFunction.apply(q, k, v,
    causal, block_q, block_k), and the gradients of Σ out ∘ grad_out with
    respect to q, k and v, as torch.autograd computes them through your
    Function's backward.
    """
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    out = FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k)
    (out * grad_out).sum().backward()  # the same gradients as out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad
