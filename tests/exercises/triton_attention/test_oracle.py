"""Check the triton_attention reference (solutions/triton_attention.py) against torch's own functions.

The oracle is outside the project: torch.softmax for the row softmax, F.scaled_dot_product_attention with an
explicit bool mask built entry by entry from its definition (query i at position Tk - Tq + i sees key
j <= Tk - Tq + i) and torch.logsumexp of the whole scaled, masked score matrix for FlashAttention, and SDPA
over each sequence's own keys for decoding. The kernels run in Triton's interpreter (TRITON_INTERPRET=1,
set here before triton is imported), on the CPU, at sizes that divide no block. If the reference disagrees
with them, the reference is wrong.
"""

import importlib
import importlib.util
import math
import os

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:
    pytest.skip("the triton extra is not installed: pip install 'attn-grade[triton]'", allow_module_level=True)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton loads and when a kernel is decorated

import triton.language  # noqa: E402  (after the variable)

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRETED and type(triton.language.standard.max).__name__ == "JITFunction":
    pytest.skip("triton was imported in this process before TRITON_INTERPRET=1 was set", allow_module_level=True)
ref = importlib.import_module("solutions.triton_attention")
if INTERPRETED and type(ref.softmax_kernel).__name__ != "InterpretedFunction":
    ref = importlib.reload(ref)  # decorated before the variable was set: again, for the interpreter
DEVICE = "cpu" if INTERPRETED else "cuda"
# lse = m + log(l) is -inf by design for a row with no key: NumPy warns of log(0) under the interpreter
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
TOL = {torch.float32: dict(atol=2e-6, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}


def bottom_right(t_q, t_k):
    mask = torch.zeros(t_q, t_k, dtype=torch.bool)
    for i in range(t_q):
        for j in range(t_k):
            mask[i, j] = j <= t_k - t_q + i
    return mask


def oracle(q, k, v, causal):
    """(out, lse) from SDPA and torch.logsumexp in float64; rows with no key: 0 and -inf."""
    q, k, v = (x.double().cpu() for x in (q, k, v))
    t_q, t_k = q.shape[-2], k.shape[-2]
    mask = bottom_right(t_q, t_k) if causal else torch.ones(t_q, t_k, dtype=torch.bool)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    return out.masked_fill(~mask.any(-1)[:, None], 0.0), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("rows, cols", [(3, 37), (2, 64), (4, 1), (2, 300)])
def test_softmax_is_torch_softmax(rows, cols):
    x = torch.randn(rows, cols, device=DEVICE) * 5
    torch.testing.assert_close(ref.softmax(x), torch.softmax(x, -1), **TOL[torch.float32])
    wide = torch.randn(cols, rows, device=DEVICE).t()  # a transposed view: strides (1, rows)
    torch.testing.assert_close(ref.softmax(wide), torch.softmax(wide, -1), **TOL[torch.float32])


@pytest.mark.parametrize("t_q, t_k, causal", [(21, 37, False), (21, 37, True), (37, 37, True), (46, 21, True),
                                              (1, 37, True)])
def test_flash_attention_is_sdpa_with_logsumexp(t_q, t_k, causal):
    q = torch.randn(2, 2, t_q, 20, device=DEVICE)
    k, v = (torch.randn(2, 2, t_k, 20, device=DEVICE) for _ in range(2))
    out, lse = ref.flash_attention(q, k, v, causal=causal)
    want_out, want_lse = oracle(q, k, v, causal)
    torch.testing.assert_close(out.double().cpu(), want_out, **TOL[torch.float32])
    torch.testing.assert_close(lse.double().cpu(), want_lse, **TOL[torch.float32])
    assert lse.dtype == torch.float32 and out.dtype == q.dtype


def test_flash_attention_takes_strides_blocks_and_float16():
    q = torch.randn(1, 2, 20, 33, device=DEVICE).transpose(-1, -2)  # (1, 2, 33, 20), not contiguous
    k, v = (torch.randn(1, 2, 20, 40, device=DEVICE).transpose(-1, -2) for _ in range(2))
    for block_m, block_n in ((16, 16), (32, 16), (16, 64)):
        out, lse = ref.flash_attention(q, k, v, causal=True, block_m=block_m, block_n=block_n)
        want_out, want_lse = oracle(q, k, v, True)
        torch.testing.assert_close(out.double().cpu(), want_out, **TOL[torch.float32])
        torch.testing.assert_close(lse.double().cpu(), want_lse, **TOL[torch.float32])
    half = [x.half() for x in (q, k, v)]
    out, lse = ref.flash_attention(*half, causal=True)
    want_out, want_lse = oracle(*half, True)
    torch.testing.assert_close(out.double().cpu(), want_out, **TOL[torch.float16])
    torch.testing.assert_close(lse.double().cpu(), want_lse, **TOL[torch.float16])


def test_decode_attention_is_sdpa_over_each_sequence():
    lengths = torch.tensor([29, 1, 40], device=DEVICE)
    q = torch.randn(3, 2, 20, device=DEVICE)
    k_cache, v_cache = (torch.randn(3, 2, 40, 20, device=DEVICE) for _ in range(2))
    for b, n in enumerate(lengths.tolist()):  # what lies past a sequence's length is never read
        k_cache[b, :, n:] = math.nan
        v_cache[b, :, n:] = math.nan
    out = ref.decode_attention(q, k_cache, v_cache, lengths)
    for b, n in enumerate(lengths.tolist()):
        want = F.scaled_dot_product_attention(q[b, :, None].double().cpu(), k_cache[b, :, :n].double().cpu(),
                                              v_cache[b, :, :n].double().cpu())[:, 0]
        torch.testing.assert_close(out[b].double().cpu(), want, **TOL[torch.float32])
