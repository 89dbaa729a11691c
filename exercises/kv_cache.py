"""Exercise: a KV cache for autoregressive decoding, written from scratch in PyTorch.

A decoder writes one token at a time, and each new token attends to every token
before it. The keys and values of those earlier tokens do not change, so a decoder
keeps them: the KV cache. Write the cache (preallocated, written in place), the
mask the new tokens need (aligned to the bottom-right: the queries are the last
positions), causal self-attention that decodes with the cache, and how many bytes
the cache of a whole model takes.

Fill in each class and function below in order; each TODO comment marks the one
place to write. Each step is graded on its own, with the grader's inputs, so a bug
in one step does not hide your work on the others. Grade your work with:

    attn-grade exercises/kv_cache.py

Hints come from the grader, not from this file. Shapes are batch first with the
heads on axis 1: (B, H, T, Dh), Dh the head width. Masks are bool, True = may
attend. Every tensor keeps the dtype and device asked for (the cache's) or of its
inputs. `python exercises/kv_cache.py` prints how much memory a KV cache takes once
kv_cache_bytes works.
"""

import math

import torch
from torch import nn


class KVCache:
    """The keys and values of every token seen so far, for one attention layer.

    __init__(batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None)
    preallocates `k` and `v`, each (B, H, max_len, Dh) of that dtype on that device,
    and sets `length = 0`: the number of positions filled so far.

    append(k_new, v_new): k_new and v_new are (B, H, T, Dh), T >= 1. Writes them at
    positions [length, length + T) of k and v, advances `length` by T, and returns
    (k, v) for the first `length` positions after the write, each (B, H, length, Dh).
    Raises ValueError when length + T would pass max_len, and then leaves the cache
    as it was (length, k and v unchanged).

    Slots [length, max_len) are unused. Nothing the cache returns may depend on what
    they hold: the grader fills them with NaN.

    Why: a decoder generates one token at a time, and each new token attends to every
    token before it. Without a cache, each step recomputes the keys and values of the
    whole prefix: O(T) work per token for the projections, O(T²) over a sequence. With
    one, each step computes its own key and value once and reads the rest. Preallocating
    once, and writing in place, avoids copying the whole cache at every step (torch.cat
    would copy it: quadratic in the sequence length) and keeps its memory fixed.
    """

    def __init__(
        self,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        # TODO
        raise NotImplementedError("KVCache.__init__: not implemented yet")

    def append(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H, T, Dh) new keys and values after the cached ones; return (k, v) for all `length` positions."""
        # TODO
        raise NotImplementedError("KVCache.append: not implemented yet")


def decode_mask(t_new: int, past_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """A bool (t_new, past_len + t_new) mask, True = may attend, for t_new new tokens after past_len cached ones.

    New token i sits at position past_len + i and sees keys 0 … past_len + i: every
    cached key, and the new ones up to itself. The mask is aligned to the
    bottom-right. With past_len = 0 it is the ordinary causal mask; with t_new = 1
    it is all True.

    Why: with a cache the queries are only the new tokens, but the keys are all of
    them. A causal mask aligned to the top-left (query i sees keys 0 … i) would hide
    the cache from the new tokens.
    """
    # TODO
    raise NotImplementedError("decode_mask: not implemented yet")


class CachedSelfAttention(nn.Module):
    """Causal multi-head self-attention that decodes with a KV cache, batch first, no dropout.

    __init__(embed_dim, num_heads, bias=True) creates w_q, w_k, w_v and w_o, each
    nn.Linear(D, D, bias=bias), D = embed_dim, Dh = D // num_heads (the grader loads
    weights by these names).

    forward(x, cache=None): x holds the new tokens, (B, T, D); returns (B, T, D).
    Without a cache: causal self-attention over x. With a cache (a KVCache of
    (B, H, max_len, Dh)): append this call's keys and values, heads split as
    (B, H, T, Dh), to the cache, and attend from the new tokens to every cached
    position, masked with decode_mask(T, past_len), scores / √Dh.

    The contract, checked: a prefill of any length followed by any mix of one-token
    and several-token calls gives, for each token, exactly the output of one causal
    call over the whole sequence.

    Must not call F.scaled_dot_product_attention: write the attention out.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        # TODO
        raise NotImplementedError("CachedSelfAttention.__init__: not implemented yet")

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """New tokens (B, T, D) -> (B, T, D), attending to the cache's positions too when one is given."""
        # TODO
        raise NotImplementedError("CachedSelfAttention.forward: not implemented yet")


def kv_cache_bytes(
    batch_size: int, num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, dtype: torch.dtype
) -> int:
    """The bytes the KV cache of a whole model takes, as an int.

    Each of the num_layers layers has a cache of its own, holding the keys and
    the values of seq_len tokens of batch_size sequences, for num_kv_heads KV
    heads of head_dim elements; an element of `dtype` takes its item size in
    bytes (2 for bfloat16). The query heads do not count: with grouped-query
    attention there are fewer KV heads than query heads.

    Why: at long contexts the cache, not the weights, bounds how many sequences fit
    on a GPU. A Llama-style 8B model (32 layers, head width 128) at 8k tokens in
    bfloat16 keeps 4 GiB per sequence with 32 KV heads, 1 GiB with 8 (GQA).
    """
    # TODO
    raise NotImplementedError("kv_cache_bytes: not implemented yet")


if __name__ == "__main__":
    # How much memory: a Llama-style 8B model (32 layers, head width 128) at 8k tokens, batch 1, bfloat16.
    try:
        for name, kv_heads in (("MHA, 32 KV heads", 32), ("GQA, 8 KV heads", 8)):
            size = kv_cache_bytes(1, 32, kv_heads, 128, 8192, torch.bfloat16)
            print(f"{name}: {size:,} bytes = {size / 2**30:g} GiB")
    except NotImplementedError:
        print("kv_cache_bytes is not written yet: write it, then run this again to see what the cache "
              "of an 8B model takes.")
