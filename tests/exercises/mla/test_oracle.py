"""Check the mla reference (solutions/mla.py) against an independent computation.

The oracle is the naive path, written here from the definition: every head's full key
[k_nope; k_rope], the shared RoPE key repeated for each head, and its value materialised, then
torch's own F.scaled_dot_product_attention (is_causal=True over the whole sequence, whose default
scale is 1/√(Dn + Dr), the width of the full key). RoPE is checked as complex multiplication.
If the reference disagrees with them, the reference is wrong.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

from solutions import mla as ref

B, H, R, DN, DR, DV, D, T = 2, 3, 8, 4, 6, 5, 16, 9  # every width different: a swapped one shows
TOL = dict(atol=1e-10, rtol=1e-10)


def module(seed=0):
    torch.manual_seed(seed)
    return ref.MultiHeadLatentAttention(D, H, R, DN, DR, DV).double().eval()


def rope_complex(x, positions, base=10000.0):
    """RoPE in the half layout as complex multiplication: feature j + i·feature j + Dr/2, times e^(i·m·θ)."""
    half = x.shape[-1] // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    turn = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), positions.double()[:, None] * theta)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * turn
    return torch.cat((z.real, z.imag), dim=-1)


def naive(mod, x):
    """The whole sequence, causal: full per-head keys [k_nope; k_rope repeated] and values, then SDPA."""
    b, t, _ = x.shape
    positions = torch.arange(t)
    q = mod.w_q(x).view(b, t, H, DN + DR).transpose(1, 2)
    q = torch.cat((q[..., :DN], rope_complex(q[..., DN:], positions)), dim=-1)  # (B, H, T, Dn + Dr)
    latent = mod.w_dkv(x)
    k_rope = rope_complex(mod.w_kr(x), positions)[:, None].expand(b, H, t, DR)  # one key, every head
    k = torch.cat((mod.w_uk(latent).view(b, t, H, DN).transpose(1, 2), k_rope), dim=-1)
    v = mod.w_uv(latent).view(b, t, H, DV).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/√(Dn + Dr)
    return mod.w_o(y.transpose(1, 2).reshape(b, t, H * DV))


def decode(mod, x, splits, absorbed, nan=True):
    cache = ref.LatentCache(B, T + 3, R, DR, dtype=x.dtype)
    if nan:
        cache.c_kv.fill_(float("nan"))
        cache.k_rope.fill_(float("nan"))
    outs, start = [], 0
    for t in splits:
        outs.append(mod(x[:, start:start + t], cache, absorbed=absorbed))
        start += t
    assert cache.length == T
    return torch.cat(outs, dim=1), cache


def test_apply_rope_is_complex_multiplication():
    x = torch.randn(B, H, 5, DR, dtype=torch.float64)
    positions = torch.tensor([0, 3, 7, 100, 8192])
    torch.testing.assert_close(ref.apply_rope(x, positions), rope_complex(x, positions), **TOL)


@pytest.mark.parametrize("absorbed", [False, True])
def test_without_a_cache_the_module_is_the_naive_path(absorbed):
    mod = module()
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mod(x, absorbed=absorbed), naive(mod, x), **TOL)


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("splits", [(s,) + (1,) * (T - s) for s in range(1, T)] + [(3, 3, 3), (1, 4, 1, 3), (5, 2, 2)])
def test_any_decoding_schedule_is_the_naive_path_and_caches_only_the_latent(splits, absorbed):
    mod = module(seed=len(splits))
    x = torch.randn(B, T, D, dtype=torch.float64)
    with torch.no_grad():
        got, cache = decode(mod, x, splits, absorbed)
        torch.testing.assert_close(got, naive(mod, x), **TOL)
        assert cache.c_kv.shape == (B, T + 3, R) and cache.k_rope.shape == (B, T + 3, DR)  # no head axis
        torch.testing.assert_close(cache.c_kv[:, :T], mod.w_dkv(x), **TOL)
        torch.testing.assert_close(cache.k_rope[:, :T], rope_complex(mod.w_kr(x), torch.arange(T)), **TOL)


def test_the_pieces_are_the_naive_scores_and_the_absorbed_path_is_the_plain_one():
    mod = module(1)
    tq, tk = 3, 7
    c_kv, q_nope = torch.randn(B, tk, R, dtype=torch.float64), torch.randn(B, H, tq, DN, dtype=torch.float64)
    q_rope, k_rope = torch.randn(B, H, tq, DR, dtype=torch.float64), torch.randn(B, tk, DR, dtype=torch.float64)
    w_uk, w_uv, w_o = mod.w_uk.weight.detach(), mod.w_uv.weight.detach(), mod.w_o.weight.detach()
    k_nope, v = ref.expand_kv(c_kv, w_uk, w_uv, H)
    assert k_nope.shape == (B, H, tk, DN) and v.shape == (B, H, tk, DV)
    for h in range(H):  # head h's rows of the weights
        torch.testing.assert_close(k_nope[:, h], c_kv @ w_uk[h * DN:(h + 1) * DN].T, **TOL)
        torch.testing.assert_close(v[:, h], c_kv @ w_uv[h * DV:(h + 1) * DV].T, **TOL)
    q = torch.cat((q_nope, q_rope), -1)
    k = torch.cat((k_nope, k_rope[:, None].expand(B, H, tk, DR)), -1)
    scores = ref.mla_scores(q_nope, q_rope, k_nope, k_rope)
    torch.testing.assert_close(scores, q @ k.mT / (DN + DR) ** 0.5, **TOL)
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    for m in (mask, None):
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        plain = y.transpose(1, 2).reshape(B, tq, H * DV) @ w_o.T
        torch.testing.assert_close(ref.absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, m), plain,
                                   **TOL)


def test_compress_kv_rotates_only_the_rope_key_with_its_positions():
    x = torch.randn(B, 4, D, dtype=torch.float64)
    w_dkv, w_kr = torch.randn(R, D, dtype=torch.float64), torch.randn(DR, D, dtype=torch.float64)
    positions = torch.tensor([5, 6, 11, 30])
    c_kv, k_rope = ref.compress_kv(x, w_dkv, w_kr, positions)
    torch.testing.assert_close(c_kv, x @ w_dkv.T, **TOL)
    torch.testing.assert_close(k_rope, rope_complex(x @ w_kr.T, positions), **TOL)


def test_the_cache_appends_in_place_and_refuses_overflow_unchanged():
    cache = ref.LatentCache(B, 6, R, DR, dtype=torch.float16)
    buffer = cache.c_kv.data_ptr()
    chunks = [(torch.randn(B, t, R).half(), torch.randn(B, t, DR).half()) for t in (2, 1, 3)]
    for i, (c, k) in enumerate(chunks):
        got_c, got_k = cache.append(c, k)
        assert torch.equal(got_c, torch.cat([p[0] for p in chunks[:i + 1]], 1))
        assert torch.equal(got_k, torch.cat([p[1] for p in chunks[:i + 1]], 1))
    assert cache.length == 6 and cache.c_kv.data_ptr() == buffer
    before = cache.c_kv.clone()
    with pytest.raises(ValueError):
        cache.append(*chunks[1])
    assert cache.length == 6 and torch.equal(cache.c_kv, before)


@pytest.mark.parametrize("layers, heads, head_dim, kv_heads, rank, rope, dtype", list(itertools.product(
    (1, 60), (4, 128), (64, 128), (1, 8), (16, 512), (8, 64), (torch.bfloat16, torch.float32))))
def test_cache_bytes_per_token_is_what_the_caches_hold(layers, heads, head_dim, kv_heads, rank, rope, dtype):
    model = (layers, heads, head_dim, kv_heads, rank, rope, dtype)
    item = torch.empty((), dtype=dtype).element_size()
    latent = ref.LatentCache(1, 1, rank, rope, dtype=dtype, device="meta")  # one token of one layer, shapes only
    per_token = sum(t.nelement() * t.element_size() for t in (latent.c_kv, latent.k_rope))
    assert ref.cache_bytes_per_token("mla", *model) == layers * per_token
    assert ref.cache_bytes_per_token("mha", *model) == layers * 2 * heads * head_dim * item
    assert ref.cache_bytes_per_token("gqa", *model) == layers * 2 * kv_heads * head_dim * item
    with pytest.raises(ValueError):
        ref.cache_bytes_per_token("mqa", *model)


def test_deepseek_v2_figures():
    model = (60, 128, 128, 8, 512, 64, torch.bfloat16)
    assert ref.cache_bytes_per_token("mla", *model) == 69_120
    assert ref.cache_bytes_per_token("mha", *model) == 3_932_160
    assert ref.cache_bytes_per_token("gqa", *model) == 245_760
