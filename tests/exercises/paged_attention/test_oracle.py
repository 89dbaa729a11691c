"""Check the paged_attention reference (solutions/paged_attention.py) against torch's own attention.

The oracle is outside the project: F.scaled_dot_product_attention run on each sequence alone, on
plain unpadded (1, H, T, Dh) tensors that never went through a pool or a packed batch, with an
explicit bottom-right mask where the queries are fewer than the keys. If the reference disagrees
with it, the reference is wrong.
"""

import pytest
import torch
import torch.nn.functional as F

from solutions import paged_attention as ref

H, DH, BLOCK = 3, 4, 4
D = H * DH
TOL = dict(atol=1e-10, rtol=1e-10)


def sdpa(q, k, v, causal=False):
    """One sequence's attention: q (Tq, H, Dh), k and v (Tk, H, Dh), causal aligned to the bottom-right."""
    tq, tk = q.shape[0], k.shape[0]
    mask = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq) if causal else None
    heads = lambda x: x.transpose(0, 1)[None]  # noqa: E731  (T, H, Dh) -> (1, H, T, Dh)
    return F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=mask)[0].transpose(0, 1)


def filled_pool(lengths, num_blocks, seed=0):
    """A pool holding sequences of `lengths` in shuffled blocks, every other slot NaN; their keys and values."""
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.full((num_blocks, BLOCK, H, DH), float("nan"), dtype=torch.float64)
    v_cache = k_cache.clone()
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(-(-n // BLOCK) for n in lengths) + 1  # one more column: every row ends in −1
    tables = torch.full((len(lengths), width), -1, dtype=torch.int32)
    keys, values = [], []
    for b, n in enumerate(lengths):
        k, v = torch.randn(2, n, H, DH, generator=gen, dtype=torch.float64)
        for t in range(n):
            if t % BLOCK == 0:
                tables[b, t // BLOCK] = order.pop()
            block = int(tables[b, t // BLOCK])
            k_cache[block, t % BLOCK], v_cache[block, t % BLOCK] = k[t], v[t]
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, tables, torch.tensor(lengths, dtype=torch.int32), keys, values


@pytest.mark.parametrize("lengths", [(5, 8, 1, 11), (4, 4, 4), (1,), (16, 3, 9, 12, 2)])
def test_paged_decode_is_sdpa_on_each_sequence_alone(lengths):
    k_cache, v_cache, tables, context, keys, values = filled_pool(lengths, num_blocks=sum(lengths) // BLOCK + 8)
    q = torch.randn(len(lengths), H, DH, dtype=torch.float64)
    got = ref.paged_decode(q, k_cache, v_cache, tables, context)
    want = torch.stack([sdpa(q[b:b + 1], keys[b], values[b])[0] for b in range(len(lengths))])
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_lens, k_lens", [((3, 5, 1), (3, 5, 1)), ((2, 5, 1), (6, 5, 4)), ((7,), (9,))])
def test_varlen_attention_is_sdpa_on_each_sequence_alone(q_lens, k_lens, causal):
    q, k, v = ([torch.randn(n, H, DH, dtype=torch.float64) for n in lens] for lens in (q_lens, k_lens, k_lens))
    cu = lambda lens: torch.tensor([0, *lens]).cumsum(0).to(torch.int32)  # noqa: E731
    got = ref.varlen_attention(torch.cat(q), torch.cat(k), torch.cat(v), cu(q_lens), cu(k_lens), causal=causal)
    want = torch.cat([sdpa(*parts, causal=causal) for parts in zip(q, k, v, strict=True)])
    torch.testing.assert_close(got, want, **TOL)


def test_the_pool_keeps_tokens_in_place_refuses_when_full_and_frees():
    cache = ref.PagedKVCache(4, BLOCK, H, DH, dtype=torch.float64)
    storage = cache.k_cache.data_ptr()
    k = torch.randn(13, H, DH, dtype=torch.float64)
    cache.append(7, k[:6], -k[:6])
    cache.append(2, k[6:9], -k[6:9])
    first = cache.block_table(7)
    assert len(first) == 2 and len(cache.block_table(2)) == 1 and cache.num_free_blocks() == 1
    before = (cache.k_cache.clone(), cache.v_cache.clone(), cache.block_table(7), cache.seq_len(7))
    with pytest.raises(RuntimeError):
        cache.append(7, k[:7], k[:7])  # 13 tokens need 4 blocks: 2 held, 1 free
    assert torch.equal(cache.k_cache, before[0]) and torch.equal(cache.v_cache, before[1])
    assert (cache.block_table(7), cache.seq_len(7), cache.num_free_blocks()) == (before[2], before[3], 1)
    cache.append(7, k[9:11], -k[9:11])  # 8 tokens: exactly its 2 blocks, no new one
    assert cache.block_table(7) == first and cache.num_free_blocks() == 1
    gathered = cache.k_cache[first].flatten(0, 1)
    assert torch.equal(gathered, torch.cat([k[:6], k[9:11]])) and cache.k_cache.data_ptr() == storage
    cache.free(7)
    assert cache.num_free_blocks() == 3
    cache.append(5, k[:12], k[:12])
    assert cache.num_free_blocks() == 0 and cache.seq_len(5) == 12


def test_the_module_decodes_a_batch_as_one_causal_call_per_sequence():
    torch.manual_seed(0)
    mod = ref.PagedSelfAttention(D, H).double().eval()
    streams = {3: torch.randn(9, D, dtype=torch.float64), 8: torch.randn(6, D, dtype=torch.float64)}
    cache = ref.PagedKVCache(8, BLOCK, H, DH, dtype=torch.float64)
    cache.k_cache.fill_(float("nan"))
    cache.v_cache.fill_(float("nan"))
    schedule = [{3: 5, 8: 2}, {3: 1, 8: 1}, {8: 3}, {3: 1, 8: 0}, {3: 2}]
    done = {3: 0, 8: 0}
    outputs = {3: [], 8: []}
    with torch.no_grad():
        for call in schedule:
            ids = [s for s, t in call.items() if t]
            x = torch.cat([streams[s][done[s]:done[s] + call[s]] for s in ids])
            cu = torch.tensor([0, *(call[s] for s in ids)]).cumsum(0).to(torch.int32)
            y = mod(x, cache, ids, cu)
            for b, s in enumerate(ids):
                outputs[s].append(y[cu[b]:cu[b + 1]])
                done[s] += call[s]
        for s, x in streams.items():
            q, k, v = (w(x).view(-1, H, DH) for w in (mod.w_q, mod.w_k, mod.w_v))
            want = mod.w_o(sdpa(q, k, v, causal=True).reshape(-1, D))
            torch.testing.assert_close(torch.cat(outputs[s]), want, **TOL)
