"""Reference solution: paged attention, vLLM's paged KV cache and flash-attn's packed variable-length batches.

A model answer to exercises/paged_attention.py: the same classes and functions with the
same contracts, each written as the shortest clear code, with the shape of every reshape
and matmul in a comment. Compare with your own once the grader passes, or when you are
stuck on a step.
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
        shape = (num_blocks, block_size, num_heads, head_dim)  # (num_blocks, block_size, H, Dh)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))  # the free list
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write T new tokens' keys and values, (T, H, Dh) each, after the sequence's; take blocks as they fill."""
        table = self.tables.get(seq_id, [])
        start = self.lengths.get(seq_id, 0)
        end = start + k.shape[0]
        needed = -(-end // self.block_size) - len(table)  # ceil(end / block_size) blocks in all, minus those held
        if needed > len(self.free_blocks):  # checked before anything changes: a refusal leaves the pool as it was
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more, {len(self.free_blocks)} free")
        table = table + [self.free_blocks.pop() for _ in range(needed)]
        positions = torch.arange(start, end, device=self.k_cache.device)  # (T,) positions in the sequence
        blocks = torch.tensor(table, device=self.k_cache.device)[positions // self.block_size]  # (T,) physical blocks
        slots = positions % self.block_size  # (T,) slots in those blocks
        self.k_cache[blocks, slots] = k  # (T, H, Dh) into T (block, slot) pairs
        self.v_cache[blocks, slots] = v
        self.tables[seq_id], self.lengths[seq_id] = table, end

    def block_table(self, seq_id: int) -> list[int]:
        """The sequence's physical blocks, in logical order."""
        return list(self.tables[seq_id])

    def seq_len(self, seq_id: int) -> int:
        """The tokens the sequence holds."""
        return self.lengths[seq_id]

    def num_free_blocks(self) -> int:
        """The blocks no sequence holds."""
        return len(self.free_blocks)

    def free(self, seq_id: int) -> None:
        """Return the sequence's blocks to the free blocks and forget it."""
        self.free_blocks.extend(self.tables.pop(seq_id))
        del self.lengths[seq_id]


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
    B, H, Dh = q.shape
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        blocks = block_tables[b, : -(-n // block_size)].long()  # (ceil(n / bs),) its blocks: no −1 among them
        k = k_cache[blocks].flatten(0, 1)[:n]  # (nb, bs, H, Dh) -> (nb·bs, H, Dh) -> (n, H, Dh)
        v = v_cache[blocks].flatten(0, 1)[:n]
        scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)  # (H, Dh) x (n, H, Dh) -> (H, n)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)  # (H, n) x (n, H, Dh) -> (H, Dh)
    return out


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
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        qb, kb, vb = q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1)  # (H, T, Dh)
        scores = qb @ kb.transpose(-2, -1) * scale  # (H, Tq, Dh) x (H, Dh, Tk) -> (H, Tq, Tk)
        if causal:
            tq, tk = qe - qs, ke - ks
            allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)  # bottom-right
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)  # (H, Tq, Dh) -> (Tq, H, Dh)
    return out


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
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.w_q = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_k = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_v = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(
        self, x: torch.Tensor, cache: PagedKVCache, seq_ids: list[int], cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        """New tokens (N, D) of the sequences seq_ids, packed by cu_seqlens -> (N, D)."""
        N, D = x.shape
        q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))  # (N, H, Dh)
        starts = cu_seqlens.tolist()
        for b, seq_id in enumerate(seq_ids):
            cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])  # (T_b, H, Dh)
        lens = [cache.seq_len(s) for s in seq_ids]  # after the append: every key, the new ones included
        if N == len(seq_ids):  # one new token per sequence: decode straight from the pool
            width = max(len(cache.block_table(s)) for s in seq_ids)
            tables = torch.full((N, width), -1, dtype=torch.int32, device=x.device)  # (B, max_blocks), −1 padded
            for b, seq_id in enumerate(seq_ids):
                table = cache.block_table(seq_id)
                tables[b, :len(table)] = torch.tensor(table, dtype=torch.int32, device=x.device)
            context = torch.tensor(lens, dtype=torch.int32, device=x.device)  # (B,)
            y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context)  # (B, H, Dh)
        else:  # a prefill, or chunks: each sequence's keys gathered from its blocks, packed
            tables = [torch.tensor(cache.block_table(s), device=x.device) for s in seq_ids]
            k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)])
            v_all = torch.cat([cache.v_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)])
            # (nb, bs, H, Dh) -> (nb·bs, H, Dh) -> (n, H, Dh) a sequence, packed: (sum of n, H, Dh)
            cu_k = torch.tensor([0, *lens], device=x.device).cumsum(0).to(torch.int32)  # (B + 1,)
            y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)  # (N, H, Dh)
        return self.w_o(y.reshape(N, D))  # merge the heads: (N, H·Dh)


if __name__ == "__main__":
    # What paging saves: 8 sequences of lengths 100 … 3000 tokens, reserved contiguously for 4096 tokens each,
    # against blocks of 16 tokens.
    lengths, block_size, reserved = [100, 250, 700, 1200, 1800, 2300, 2900, 3000], 16, 4096
    paged = sum(-(-n // block_size) * block_size for n in lengths)
    print(f"contiguous: {len(lengths) * reserved:,} slots; paged: {paged:,} slots for {sum(lengths):,} tokens")
