"""Exercise: paged attention, vLLM's paged KV cache and flash-attn's packed variable-length batches.

A server decodes many sequences at once, each of its own length, and they start and
finish at any time. kv_cache's contiguous cache, sized for the longest sequence, wastes
most of its memory on them; vLLM's answer is paging: a pool of small fixed-size blocks,
handed to a sequence one at a time, and a block table per sequence that maps its logical
blocks to physical ones, as an operating system's page table does. Write the pool, the
decoding step that reads each sequence's keys through its block table, attention over a
packed batch of sequences of different lengths (flash-attn's varlen API: no padding,
cu_seqlens says where each sequence starts), and a self-attention layer that serves a
batch with them.

Fill in each class and function below in order; each TODO comment marks the one
place to write. Each step is graded on its own, with the grader's inputs, so a bug
in one step does not hide your work on the others. Grade your work with:

    attn-grade exercises/paged_attention.py

Hints come from the grader, not from this file. Shapes are token first with the
heads next: (T, H, Dh) for one sequence's tokens, (B, H, Dh) for one token of each
of B sequences, (num_blocks, block_size, H, Dh) for the pool. Block tables and
cu_seqlens are int32. Every tensor keeps the dtype and device of its inputs (the
pool's: those asked for), and float32 and float64 are computed in their own dtype: a
float64 input taken through .float() loses the precision the checks ask of it (the
half types may be computed in float32). `python exercises/paged_attention.py` prints
what paging saves on a batch of sequences of different lengths.
"""

import math

import torch
from torch import nn


class PagedKVCache:
    """A pool of fixed-size blocks holding the keys and values of many sequences, one attention layer's.

    __init__(num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None)
    preallocates `k_cache` and `v_cache`, each (num_blocks, block_size, H, Dh) of that dtype
    on that device: the pool. Every block starts free.

    append(seq_id, k, v): k and v are (T, H, Dh), T >= 1, the next T tokens of the sequence
    `seq_id` (an int; an id not seen before starts a new sequence). Token t of a sequence
    (counting from 0 over all its appends) lives in slot t % block_size of the physical
    block block_table(seq_id)[t // block_size]. A sequence takes a free block only when its
    last block is full (or it has none): it holds ceil(length / block_size) blocks. Returns
    None. A stored token never moves: neither its block nor its slot changes, and a
    sequence's table only grows at its end.
    Raises RuntimeError when the pool has too few free blocks for the T tokens, and then
    leaves everything as it was (no block taken, nothing written, the length unchanged).

    block_table(seq_id) -> list[int]: the sequence's physical blocks, in logical order.
    seq_len(seq_id) -> int: the tokens the sequence holds.
    num_free_blocks() -> int: the blocks no sequence holds.
    free(seq_id): the sequence is finished: its blocks go back to the free blocks, and its
    id is forgotten.

    Slots no sequence holds may contain anything (the grader fills them with NaN).

    Why: a contiguous cache per sequence (kv_cache's) must be sized for the longest
    sequence it may reach, so most of its memory sits reserved and unused, and the gaps
    between sequences of different lengths fragment the rest. Paging, as an operating
    system pages memory, gives a sequence one small block at a time from a shared pool:
    at most block_size − 1 slots of a sequence are wasted, a finished sequence's blocks
    serve the next one at once, and sequences can share blocks (a common prompt). The
    block table is the page table: logical block i of the sequence is physical block
    table[i], wherever it lies in the pool.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        # TODO
        raise NotImplementedError("PagedKVCache.__init__: not implemented yet")

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write T new tokens' keys and values, (T, H, Dh) each, after the sequence's; take blocks as they fill."""
        # TODO
        raise NotImplementedError("PagedKVCache.append: not implemented yet")

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's physical blocks, in logical order."""
        # TODO
        raise NotImplementedError("PagedKVCache.block_table: not implemented yet")

    def seq_len(self, seq_id: int) -> int:
        """The tokens the sequence holds."""
        # TODO
        raise NotImplementedError("PagedKVCache.seq_len: not implemented yet")

    def num_free_blocks(self) -> int:
        """The blocks no sequence holds."""
        # TODO
        raise NotImplementedError("PagedKVCache.num_free_blocks: not implemented yet")

    def free(self, seq_id: int) -> None:
        """Return the sequence's blocks to the free blocks and forget it."""
        # TODO
        raise NotImplementedError("PagedKVCache.free: not implemented yet")


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """One decoding step of B sequences of different lengths, reading their keys and values from the block pool.

    q: (B, H, Dh), the one new token of each sequence. k_cache and v_cache: the pool,
    (num_blocks, block_size, H, Dh). block_tables: int32 (B, max_blocks), row b the
    physical blocks of sequence b in logical order, padded with −1 after its last block.
    context_lens: int32 (B,), the keys sequence b holds (its new token's included),
    each >= 1. Returns (B, H, Dh): for each sequence, softmax(q · kᵀ / √Dh) · v over its
    own context_lens[b] keys, token t at slot t % block_size of block
    block_tables[b, t // block_size].

    Nothing else of the pool may count: not the slots after a sequence's last token,
    not the blocks of other sequences, not a −1 (the grader fills all of those with
    NaN, and 0 · NaN is NaN: a masked slot must not be multiplied, either).

    Why: each sequence's keys lie scattered over the pool, wherever its blocks were
    free. The block table, like a page table, maps the logical block t // block_size
    to the physical one, and the kernel reads the pool in place: no copy of any
    sequence's keys into a padded batch.
    """
    # TODO
    raise NotImplementedError("paged_decode: not implemented yet")


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
) -> torch.Tensor:
    """Attention over a packed batch of sequences of different lengths: flash-attn's varlen API.

    q: (total_q, H, Dh), the queries of B sequences one after another on the token
    axis; k, v: (total_k, H, Dh) their keys and values, packed the same way.
    cu_seqlens_q: int32 (B + 1,), the cumulative starts: sequence b's queries are rows
    cu_seqlens_q[b] … cu_seqlens_q[b + 1] − 1 of q, and cu_seqlens_q[B] = total_q;
    cu_seqlens_k likewise for k and v. Returns (total_q, H, Dh): each sequence's queries
    attend to its own keys only, softmax(q · kᵀ / √Dh) · v, nothing across a boundary.

    With causal, the mask of each sequence is aligned to the bottom-right, as
    flash-attn's (and kv_cache's decode_mask): with Tq queries and Tk >= Tq keys, query
    i sits at position Tk − Tq + i and sees keys 0 … Tk − Tq + i. Every sequence has
    at least one query, and with causal at least as many keys as queries.

    Why: a batch of sequences of different lengths, padded to the longest, spends its
    work and memory on padding; packed, it holds only real tokens, and cu_seqlens says
    where each sequence starts. The queries may be fewer than the keys: the new tokens
    of a chunked prefill after a cache.
    """
    # TODO
    raise NotImplementedError("varlen_attention: not implemented yet")


class PagedSelfAttention(nn.Module):
    """Causal multi-head self-attention serving a batch of sequences from a paged KV cache, no dropout.

    __init__(embed_dim, num_heads, bias=True) creates w_q, w_k, w_v and w_o, each
    nn.Linear(D, D, bias=bias), D = embed_dim, Dh = D // num_heads (the grader loads
    weights by these names).

    forward(x, cache, seq_ids, cu_seqlens): x (N, D) holds the new tokens of the B
    sequences seq_ids (a list of ints), packed: sequence b's are rows cu_seqlens[b] …
    cu_seqlens[b + 1] − 1 (cu_seqlens int32 (B + 1,)). cache: a PagedKVCache of
    (num_blocks, block_size, H, Dh). Projects x and splits the heads, (N, H, Dh);
    appends each sequence's new keys and values to the cache; then each new token
    attends, causally, to every key its sequence holds: with one new token per
    sequence, paged_decode on the pool; else the keys of each sequence gathered from
    the pool by its block table, packed, and varlen_attention with causal=True.
    Returns (N, D), after w_o. Use the cache through its contract only (append, seq_len,
    block_table, k_cache, v_cache): the grader may hand it a pool of its own.

    The contract, checked: any schedule of calls (several sequences prefilled
    together, decoded together, new ones joining) gives each token exactly the output
    of one causal call over its own sequence.
    """

    def __init__(self, embed_dim: int, num_heads: int, bias: bool = True) -> None:
        super().__init__()
        # TODO
        raise NotImplementedError("PagedSelfAttention.__init__: not implemented yet")

    def forward(
        self, x: torch.Tensor, cache: PagedKVCache, seq_ids: list[int], cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """New tokens (N, D) of the sequences seq_ids, packed by cu_seqlens -> (N, D)."""
        # TODO
        raise NotImplementedError("PagedSelfAttention.forward: not implemented yet")


if __name__ == "__main__":
    # What paging saves: 8 sequences of lengths 100 … 3000 tokens, reserved contiguously for 4096 tokens each,
    # against blocks of 16 tokens.
    lengths, block_size, reserved = [100, 250, 700, 1200, 1800, 2300, 2900, 3000], 16, 4096
    paged = sum(-(-n // block_size) * block_size for n in lengths)
    print(f"contiguous: {len(lengths) * reserved:,} slots; paged: {paged:,} slots for {sum(lengths):,} tokens")
