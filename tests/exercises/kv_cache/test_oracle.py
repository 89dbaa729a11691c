"""Check the kv_cache reference (solutions/kv_cache.py) against torch's own attention.

The oracles are outside the project: F.scaled_dot_product_attention with is_causal=True over the
whole sequence (the output every decoding schedule must reproduce), and with an explicit bool
mask, bottom-right aligned, for a chunk of new tokens after a cache. If the reference disagrees
with them, the reference is wrong.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from solutions import kv_cache as ref

B, H, DH, T = 2, 4, 8, 9  # batch, heads, head width, tokens
D = H * DH
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.float64: dict(atol=1e-10, rtol=1e-10)}


def module(dtype, seed=0, bias=True):
    torch.manual_seed(seed)
    return ref.CachedSelfAttention(D, H, bias=bias).to(dtype).eval()


def sdpa_forward(mod, x, attn_mask=None, is_causal=False, past=None):
    """The module's forward with SDPA for the attention; `past` = (k, v) of earlier tokens, prepended."""
    b, t, _ = x.shape
    q, k, v = (w(x).view(b, t, H, DH).transpose(1, 2) for w in (mod.w_q, mod.w_k, mod.w_v))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return mod.w_o(y.transpose(1, 2).reshape(b, t, D))


def decode(mod, x, splits, dtype, nan=True):
    """x fed to the module in chunks of `splits` with one cache (unused slots NaN), the outputs concatenated."""
    cache = ref.KVCache(B, H, DH, max_len=T + 3, dtype=dtype)
    if nan:
        cache.k.fill_(float("nan"))
        cache.v.fill_(float("nan"))
    outs, start = [], 0
    for t in splits:
        outs.append(mod(x[:, start:start + t], cache))
        start += t
    assert cache.length == T
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_without_a_cache_the_module_is_sdpa_causal(dtype):
    mod = module(dtype)
    x = torch.randn(B, T, D, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), sdpa_forward(mod, x, is_causal=True), **TOL[dtype])


@pytest.mark.parametrize("split", range(1, T))
def test_a_prefill_then_one_token_a_call_is_the_full_forward_at_every_split(split):
    mod = module(torch.float64, seed=split)
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        expected = sdpa_forward(mod, x, is_causal=True)
        got = decode(mod, x, (split,) + (1,) * (T - split), torch.float64)
    torch.testing.assert_close(got, expected, **TOL[torch.float64])


@pytest.mark.parametrize("splits", [(3, 3, 3), (1, 4, 1, 3), (5, 2, 2), (2, 1, 1, 1, 4), (T,)])
def test_any_mix_of_chunks_is_the_full_forward(splits):
    mod = module(torch.float64)
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(decode(mod, x, splits, torch.float64), sdpa_forward(mod, x, is_causal=True),
                                   **TOL[torch.float64])


@pytest.mark.parametrize("t_new, past_len", [(1, 0), (1, 6), (3, 5), (5, 0), (4, 4)])
def test_decode_mask_is_sdpa_bottom_right(t_new, past_len):
    mask = ref.decode_mask(t_new, past_len)
    assert mask.dtype == torch.bool and mask.shape == (t_new, past_len + t_new)
    rows, cols = torch.arange(t_new)[:, None], torch.arange(past_len + t_new)[None, :]
    assert torch.equal(mask, cols <= past_len + rows)  # new token i at position past_len + i
    # a chunk after a cache, with the explicit mask, is the full causal forward at those tokens
    mod = module(torch.float64)
    x = torch.randn(B, past_len + t_new, D, dtype=torch.float64)
    with torch.no_grad():
        q_all, k_all, v_all = (w(x).view(B, -1, H, DH).transpose(1, 2) for w in (mod.w_q, mod.w_k, mod.w_v))
        past = (k_all[:, :, :past_len], v_all[:, :, :past_len])
        chunk = sdpa_forward(mod, x[:, past_len:], attn_mask=mask, past=past)
        torch.testing.assert_close(chunk, sdpa_forward(mod, x, is_causal=True)[:, past_len:], **TOL[torch.float64])
    if t_new > 1 and past_len > 0:  # SDPA's is_causal is aligned to the top-left: not what a chunk after a cache needs
        top_left = torch.ones(t_new, past_len + t_new, dtype=torch.bool).tril()
        assert not torch.equal(mask, top_left)


def test_the_cache_appends_in_place_and_refuses_overflow_unchanged():
    cache = ref.KVCache(B, H, DH, max_len=6, dtype=torch.float16)
    assert cache.k.shape == cache.v.shape == (B, H, 6, DH) and cache.k.dtype == torch.float16 and cache.length == 0
    buffer = cache.k.data_ptr()
    chunks = [torch.randn(B, H, t, DH, dtype=torch.float16) for t in (2, 1, 3)]
    for i, k in enumerate(chunks):
        got_k, got_v = cache.append(k, -k)
        want = torch.cat(chunks[:i + 1], dim=2)
        assert torch.equal(got_k, want) and torch.equal(got_v, -want)
    assert cache.length == 6 and cache.k.data_ptr() == buffer
    before = (cache.k.clone(), cache.v.clone())
    with pytest.raises(ValueError):
        cache.append(chunks[1], chunks[1])
    assert cache.length == 6 and torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])


@pytest.mark.parametrize("b, layers, kv_heads, head_dim, seq_len, dtype", list(itertools.product(
    (1, 3), (2, 32), (1, 8), (64, 128), (7, 8192), (torch.bfloat16, torch.float32, torch.int8))))
def test_kv_cache_bytes_is_the_two_buffers_of_every_layer(b, layers, kv_heads, head_dim, seq_len, dtype):
    size = ref.kv_cache_bytes(b, layers, kv_heads, head_dim, seq_len, dtype)
    one_layer = ref.KVCache(b, kv_heads, head_dim, 1, dtype=dtype, device="meta")  # shapes only, no memory
    per_token = sum(t.nelement() * t.element_size() for t in (one_layer.k, one_layer.v))
    assert type(size) is int and size == layers * seq_len * per_token


def test_kv_cache_bytes_for_a_llama_style_8b_model():
    gib = 2**30
    assert ref.kv_cache_bytes(1, 32, 32, 128, 8192, torch.bfloat16) == 4 * gib  # MHA
    assert ref.kv_cache_bytes(1, 32, 8, 128, 8192, torch.bfloat16) == 1 * gib  # GQA, 8 KV heads
