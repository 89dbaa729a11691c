"""Reference solution: multi-head latent attention (MLA), DeepSeek-V2/V3.

A model answer to exercises/mla.py: the same classes and functions with the same contracts,
each written as the shortest clear code, with the shape of every reshape and matmul in a
comment. Compare with your own once the grader passes, or when you are stuck on a step.
"""

import math

import torch
from torch import nn


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Given, not graded (the rope exercise teaches it): RoPE in the half layout on the last axis.

    x: (..., T, Dr), Dr even; positions: an integer tensor (T,), the position of each token.
    Feature j pairs with feature j + Dr/2; the pair i of the token at position m turns by
    m·θᵢ, θᵢ = base^(−2i/Dr). Computed in float32 (float64 for a float64 x), returned in
    x's dtype. Decoding token p rotates with p, its own position, never 0.
    """
    dr = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    theta = 1.0 / base ** (torch.arange(0, dr, 2, dtype=dtype, device=x.device) / dr)  # (Dr/2,)
    angles = positions.to(device=x.device, dtype=dtype)[:, None] * theta[None, :]  # (T, Dr/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, Dr): feature j and j + Dr/2 share an angle
    xf = x.to(dtype)
    half = torch.cat((-xf[..., dr // 2:], xf[..., :dr // 2]), dim=-1)  # rotate_half: each pair turned by 90 degrees
    turned = (xf * angles.cos() + half * angles.sin()).to(x.dtype)
    return turned


def compress_kv(
    x: torch.Tensor, w_dkv: torch.Tensor, w_kr: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token compressed to its latent c_kv and its decoupled RoPE key, c_kv first.

    x: (B, T, D); w_dkv: (kv_lora_rank, D) and w_kr: (qk_rope_head_dim, D), weights as
    nn.Linear keeps them (out, in); positions: an integer tensor (T,).
    c_kv = x @ w_dkvᵀ, (B, T, kv_lora_rank): no RoPE, it is a content summary.
    k_rope = RoPE(x @ w_krᵀ, positions), (B, T, qk_rope_head_dim): one RoPE key per token,
    shared by every head. Both in x's dtype.

    Why: this pair is all an MLA decoder caches per token and layer, kv_lora_rank +
    qk_rope_head_dim numbers, against 2·H·head_dim for MHA. RoPE cannot go on the latent:
    a rotation that depends on the position would sit between the latent and the key
    up-projection, which then could no longer be folded into the query (the absorbed
    decode). So the position lives in a small separate key, one for all heads.
    """
    c_kv = x @ w_dkv.T  # (B, T, D) x (D, R) -> (B, T, R)
    k_rope = apply_rope(x @ w_kr.T, positions)  # (B, T, Dr), rotated by each token's position
    return c_kv, k_rope


def expand_kv(
    c_kv: torch.Tensor, w_uk: torch.Tensor, w_uv: torch.Tensor, num_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The latents up-projected to per-head keys (the no-position part) and values.

    c_kv: (B, T, kv_lora_rank); w_uk: (H·qk_nope_head_dim, kv_lora_rank) and
    w_uv: (H·v_head_dim, kv_lora_rank), as nn.Linear keeps them. Returns
    k_nope (B, H, T, qk_nope_head_dim) and v (B, H, T, v_head_dim): c_kv @ wᵀ, heads split
    as (B, T, H, width) and moved to axis 1. Head h's rows of w_uk are
    h·qk_nope_head_dim … (h + 1)·qk_nope_head_dim − 1.

    Why: the keys and values every head attends with are made from the one latent a token
    keeps; the plain (naive) path makes them for every cached token at every step.
    """
    B, T, _ = c_kv.shape
    k_nope = (c_kv @ w_uk.T).view(B, T, num_heads, -1).transpose(1, 2)  # (B, T, H·Dn) -> (B, H, T, Dn)
    v = (c_kv @ w_uv.T).view(B, T, num_heads, -1).transpose(1, 2)  # (B, T, H·Dv) -> (B, H, T, Dv)
    return k_nope, v


def mla_scores(
    q_nope: torch.Tensor, q_rope: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor
) -> torch.Tensor:
    """The attention scores of MLA: the no-position part plus the RoPE part, over √(Dn + Dr).

    q_nope (B, H, Tq, Dn), q_rope (B, H, Tq, Dr), k_nope (B, H, Tk, Dn) and k_rope
    (B, Tk, Dr), the one RoPE key of each token, shared by the heads (broadcast over them).
    Returns (B, H, Tq, Tk) = (q_nope @ k_nopeᵀ + q_rope @ k_ropeᵀ) / √(Dn + Dr), Dn =
    qk_nope_head_dim, Dr = qk_rope_head_dim. No mask here.

    Why: each head's query and key are [nope, rope] concatenated, of width Dn + Dr, so the
    dot product is the sum of the two parts' and the scale is that of the whole width.
    """
    width = q_nope.shape[-1] + q_rope.shape[-1]  # Dn + Dr: the width of [nope, rope]
    nope = q_nope @ k_nope.transpose(-2, -1)  # (B, H, Tq, Dn) x (B, H, Dn, Tk) -> (B, H, Tq, Tk)
    rope = q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)  # x (B, 1, Dr, Tk): one key for every head
    return (nope + rope) / math.sqrt(width)


def absorbed_attention(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    c_kv: torch.Tensor,
    k_rope: torch.Tensor,
    w_uk: torch.Tensor,
    w_uv: torch.Tensor,
    w_o: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """MLA attended straight over the latents: w_uk folded into the query, w_uv into the output projection.

    q_nope (B, H, Tq, Dn), q_rope (B, H, Tq, Dr) (rotated), c_kv (B, Tk, R) and k_rope
    (B, Tk, Dr) (rotated), as the cache holds them; w_uk (H·Dn, R), w_uv (H·Dv, R) and
    w_o (D, H·Dv) as nn.Linear keeps them; mask: bool, True = may attend, broadcastable to
    (B, H, Tq, Tk), or None. Returns (B, Tq, D): the output after w_o, equal to the plain
    path (expand_kv, mla_scores, softmax, @ v, heads merged, w_o) to the tolerance policy.

    Per head h, with W_h = w_uk's rows of head h (Dn, R): q_nope·k_nopeᵀ = q_nope·(c W_hᵀ)ᵀ
    = (q_nope W_h)·cᵀ, so the query moves into the latent space, (B, H, Tq, R), and the
    scores are taken against c_kv itself, plus the RoPE part, over √(Dn + Dr). Likewise the
    weights times c_kv, (B, H, Tq, R), go through w_uv and w_o, which may be folded into one
    (D, H, R) matrix first.

    Why: decoding reads the whole cache at every token. The plain path expands every cached
    latent into H keys and values first; the absorbed one never does, so it reads
    kv_lora_rank + qk_rope_head_dim numbers per token, and the folded matrices can be
    computed once per model.
    """
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    R, D = c_kv.shape[-1], w_o.shape[0]
    w_uk_heads = w_uk.view(H, Dn, R)  # head h's key up-projection: (Dn, R)
    q_latent = q_nope @ w_uk_heads  # (B, H, Tq, Dn) x (H, Dn, R) -> (B, H, Tq, R)
    latents = c_kv.unsqueeze(1)  # (B, 1, Tk, R): one latent per token, for every head
    scores = q_latent @ latents.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)  # (B, H, Tq, Tk)
    scores = scores / math.sqrt(Dn + Dr)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out_latent = torch.softmax(scores, dim=-1) @ latents  # (B, H, Tq, Tk) x (B, 1, Tk, R) -> (B, H, Tq, R)
    # w_uv folded into w_o: (D, H, Dv) with (H, Dv, R) -> (D, H, R)
    w_ouv = torch.einsum("dhv,hvr->dhr", w_o.view(D, H, -1), w_uv.view(H, -1, R))
    return torch.einsum("bhqr,dhr->bqd", out_latent, w_ouv)  # summed over heads and R: (B, Tq, D)


class LatentCache:
    """The latents and RoPE keys of every token seen so far, for one MLA layer.

    __init__(batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32,
    device=None) preallocates `c_kv` (B, max_len, kv_lora_rank) and `k_rope`
    (B, max_len, qk_rope_head_dim), of that dtype on that device, as plain attributes (the
    grader reads where each one lives, not a property's answer), and sets `length = 0`.

    append(c_kv_new, k_rope_new): (B, T, kv_lora_rank) and (B, T, qk_rope_head_dim), T >= 1.
    Writes them at positions [length, length + T) (axis 1), advances `length` by T, and
    returns c_kv and k_rope cut to the first `length` positions. Raises ValueError when
    length + T would pass max_len, and then leaves the cache as it was.

    Slots [length, max_len) are unused; nothing the cache returns may depend on what they
    hold (the grader fills them with NaN).

    Why: there is no head axis. MLA keeps one latent and one RoPE key per token, shared by
    every head: DeepSeek-V2 caches 512 + 64 numbers per token and layer where MHA with 128
    heads of 128 caches 32768.
    """

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.c_kv = torch.zeros(batch_size, max_len, kv_lora_rank, dtype=dtype, device=device)  # (B, max_len, R)
        self.k_rope = torch.zeros(batch_size, max_len, qk_rope_head_dim, dtype=dtype, device=device)  # (B, max_len, Dr)
        self.max_len = max_len
        self.length = 0

    def append(self, c_kv_new: torch.Tensor, k_rope_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, T, R) latents and (B, T, Dr) RoPE keys after the cached ones; return both for all positions."""
        end = self.length + c_kv_new.shape[1]  # the tokens are axis 1
        if end > self.max_len:  # checked before anything changes
            raise ValueError(f"{self.length} cached + {c_kv_new.shape[1]} new tokens pass max_len {self.max_len}")
        self.c_kv[:, self.length:end] = c_kv_new
        self.k_rope[:, self.length:end] = k_rope_new
        self.length = end
        return self.c_kv[:, :end], self.k_rope[:, :end]  # (B, length, R), (B, length, Dr)


class MultiHeadLatentAttention(nn.Module):
    """Causal multi-head latent attention (MLA) with a latent cache, batch first, no dropout, no biases.

    __init__(embed_dim, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim) creates, each nn.Linear(in, out, bias=False) (the grader loads weights by
    these names), D = embed_dim, H = num_heads, R = kv_lora_rank, Dn, Dr, Dv the widths:
      w_q   D -> H·(Dn + Dr)  each head's query, [nope, rope] in that order (no q_lora_rank)
      w_dkv D -> R            the latent c_kv
      w_kr  D -> Dr           the RoPE key, one per token, shared by the heads
      w_uk  R -> H·Dn         the keys' no-position part
      w_uv  R -> H·Dv         the values
      w_o   H·Dv -> D

    forward(x, cache=None, absorbed=False): x holds the new tokens, (B, T, D); returns
    (B, T, D). The new tokens sit at positions past_len … past_len + T − 1 (past_len = the
    cache's length before this call, 0 without one): q_rope and k_rope rotate with those.
    With a cache (a LatentCache), append this call's c_kv and k_rope (from compress_kv) and
    attend over every cached position, causally (new token i sees keys 0 … past_len + i).
    absorbed=False: expand_kv, mla_scores, softmax, @ v, heads merged, w_o.
    absorbed=True: absorbed_attention over the latents. Both give the same output; with
    absorbed=True nothing the call builds grows faster than the cache (the mask is the new
    tokens' rows, (T, past_len + T), never one over every position).

    The contract, checked: a prefill of any length followed by any mix of one-token and
    several-token calls gives each token the output of one causal call over the whole
    sequence, on either path, and the cache holds c_kv and the rotated k_rope of every token.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
    ) -> None:
        super().__init__()
        self.num_heads, self.nope, self.rope, self.v_dim = num_heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.w_q = nn.Linear(embed_dim, num_heads * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.w_dkv = nn.Linear(embed_dim, kv_lora_rank, bias=False)
        self.w_kr = nn.Linear(embed_dim, qk_rope_head_dim, bias=False)
        self.w_uk = nn.Linear(kv_lora_rank, num_heads * qk_nope_head_dim, bias=False)
        self.w_uv = nn.Linear(kv_lora_rank, num_heads * v_head_dim, bias=False)
        self.w_o = nn.Linear(num_heads * v_head_dim, embed_dim, bias=False)

    def forward(self, x: torch.Tensor, cache: LatentCache | None = None, absorbed: bool = False) -> torch.Tensor:
        """New tokens (B, T, D) -> (B, T, D), attending to the cached positions too when a cache is given."""
        B, T, _ = x.shape
        H, Dn, Dr = self.num_heads, self.nope, self.rope
        past_len = 0 if cache is None else cache.length  # read before the append moves it
        positions = torch.arange(past_len, past_len + T, device=x.device)  # the new tokens' own positions
        q = self.w_q(x).view(B, T, H, Dn + Dr).transpose(1, 2)  # (B, H, T, Dn + Dr)
        q_nope, q_rope = q.split([Dn, Dr], dim=-1)  # (B, H, T, Dn), (B, H, T, Dr)
        q_rope = apply_rope(q_rope, positions)  # only the RoPE part turns
        c_kv, k_rope = compress_kv(x, self.w_dkv.weight, self.w_kr.weight, positions)  # (B, T, R), (B, T, Dr)
        if cache is not None:
            c_kv, k_rope = cache.append(c_kv, k_rope)  # (B, past_len + T, R), (B, past_len + T, Dr)
        # (T, past_len + T), bottom-right: new token i sits at past_len + i
        mask = torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril(diagonal=past_len)
        if absorbed:
            return absorbed_attention(q_nope, q_rope, c_kv, k_rope, self.w_uk.weight, self.w_uv.weight,
                                      self.w_o.weight, mask)
        k_nope, v = expand_kv(c_kv, self.w_uk.weight, self.w_uv.weight, H)  # (B, H, past_len + T, Dn), (…, Dv)
        scores = mla_scores(q_nope, q_rope, k_nope, k_rope).masked_fill(~mask, float("-inf"))  # (B, H, T, past + T)
        y = torch.softmax(scores, dim=-1) @ v  # (B, H, T, Dv)
        return self.w_o(y.transpose(1, 2).reshape(B, T, H * self.v_dim))  # heads merged: (B, T, H·Dv)


def cache_bytes_per_token(
    attention: str,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    dtype: torch.dtype,
) -> int:
    """The bytes one token's cache takes in a whole model, as an int, for attention "mha", "gqa" or "mla".

    The model is described whole (every argument is given), and each kind caches its own:
      "mha": keys and values of num_heads heads of head_dim per layer: 2·L·H·head_dim elements;
      "gqa": the same for num_kv_heads KV heads: 2·L·Hkv·head_dim;
      "mla": one latent and one shared RoPE key per layer: L·(kv_lora_rank + qk_rope_head_dim),
             no factor 2 (keys and values both come from the latent) and no heads.
    An element of `dtype` takes its item size in bytes (2 for bfloat16). Raises ValueError
    for any other attention.

    Why: the cache bounds the batch and the context a GPU can serve. DeepSeek-V2 (60 layers,
    128 heads of 128, kv_lora_rank 512, qk_rope_head_dim 64) in bfloat16 caches 69,120 bytes
    per token with MLA, 3,932,160 with MHA (57 times more) and 245,760 with GQA of 8 KV heads.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()  # bytes per element
    elements = {
        "mha": 2 * num_heads * head_dim,  # keys and values, every head
        "gqa": 2 * num_kv_heads * head_dim,  # keys and values, the KV heads only
        "mla": kv_lora_rank + qk_rope_head_dim,  # the latent and the shared RoPE key
    }
    if attention not in elements:
        raise ValueError(f"unknown attention {attention!r}: expected 'mha', 'gqa' or 'mla'")
    return num_layers * elements[attention] * itemsize


if __name__ == "__main__":
    # DeepSeek-V2's cache per token: 60 layers, 128 heads of 128, kv_lora_rank 512, qk_rope_head_dim 64, bfloat16.
    model = dict(num_layers=60, num_heads=128, head_dim=128, num_kv_heads=8, kv_lora_rank=512, qk_rope_head_dim=64,
                 dtype=torch.bfloat16)
    for kind, name in (("mha", "MHA, 128 heads"), ("gqa", "GQA, 8 KV heads"), ("mla", "MLA")):
        size = cache_bytes_per_token(kind, **model)
        print(f"{name}: {size:,} bytes per token; {size * 128 * 1024 / 2**30:g} GiB for 128k tokens")
