"""Exercise: attention's backward pass, plain and tile by tile, written by hand in PyTorch.

Autograd gives attention's gradients for free, by keeping the Tq × Tk matrix of
probabilities from the forward pass; FlashAttention never held that matrix, so
its backward pass must be written by hand. Write the softmax's vector-Jacobian
product, the gradients of plain attention (recomputing its forward), the same
gradients tile by tile from the forward's saved log-sum-exp, and a
torch.autograd.Function that joins a tiled forward to that backward.

Fill in each function below in order; each TODO comment marks the one place to
write. Each step is graded on its own, with the grader's inputs, so a bug in one
step does not hide your work on the others. Grade your work with:

    attn-grade exercises/attention_backward.py

Hints come from the grader, not from this file. No step may use autograd to get
its gradients (torch.autograd.grad, .backward(), torch.func): the point is to
write them. flash_attention_and_grads at the end is the grader's way of running
your Function: leave it as it is.
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
    # TODO
    raise NotImplementedError("softmax_backward: not implemented yet")


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
    # TODO
    raise NotImplementedError("attention_backward: not implemented yet")


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
    # TODO
    raise NotImplementedError("flash_attention_backward: not implemented yet")


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
        # TODO
        raise NotImplementedError("FlashAttentionFunction.forward: not implemented yet")

    @staticmethod
    def backward(ctx, grad_out):
        """(dq, dk, dv, None, None, None) from grad_out = dL/dout (..., Tq, Dv).

        Read back what forward saved and call flash_attention_backward; return
        one gradient per argument of forward, None for causal, block_q and
        block_k (they are no tensors).
        """
        # TODO
        raise NotImplementedError("FlashAttentionFunction.backward: not implemented yet")


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
