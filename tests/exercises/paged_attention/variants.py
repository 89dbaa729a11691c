"""Candidates for `paged_attention` made from the reference by redefining one thing (Python keeps a file's last
definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find (the pool's in pool_variants.py). CORRECT: unusual but right ways to write the steps; each
must score 100.
"""

import ast
from pathlib import Path

from tests.exercises.mha.variants import Variant
from tests.exercises.paged_attention.pool_variants import POOL_BUGGY

REFERENCE = (Path(__file__).resolve().parents[3] / "solutions" / "paged_attention.py").read_text()


def changed(name: str, old: str, new: str) -> str:
    """The reference's definition of `name` with `old` (there once) replaced by `new`."""
    node = next(n for n in ast.parse(REFERENCE).body if getattr(n, "name", None) == name)
    text = "\n".join(REFERENCE.splitlines()[node.lineno - 1:node.end_lineno]) + "\n"
    assert text.count(old) == 1, old
    return "\n\n" + text.replace(old, new)


def decode_with(body: str) -> str:
    """A paged_decode that, for each sequence b (n, blocks, table: its context length, its first ceil(n / bs) table
    entries, its whole row), runs `body`, which makes k and v, (n, H, Dh); then attends as the reference does."""
    return f"""
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        blocks = block_tables[b, : -(-n // bs)].long()
        table = block_tables[b].long()
{body}
        scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out
"""


def varlen_with(body: str) -> str:
    """A varlen_attention whose loop body over the sequences is `body`, with qs, qe, ks, ke the reference's bounds."""
    return f"""
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
{body}
    return out
"""


VARLEN_BODY = """\
        qb, kb, vb = q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1)
        scores = qb @ kb.transpose(-2, -1) * scale
        if causal:
            tq, tk = qe - qs, ke - ks
            allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)"""


def dense_varlen(mask: str, arange_device: str = ", device=q.device") -> str:
    """A vectorised varlen_attention: one (total_q, total_k) mask, `mask` written over seq_*, pos_*, len_*."""
    return f"""
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    def where(cu, total):  # each row's sequence, position in it, and that sequence's length
        rows = torch.arange(total{arange_device})
        seq = (rows[:, None] >= cu[None, 1:].long()).sum(-1)
        lengths = (cu[1:] - cu[:-1]).long()
        return seq, rows - cu.long()[seq], lengths[seq]

    seq_q, pos_q, len_q = where(cu_seqlens_q, q.shape[0])
    seq_k, pos_k, len_k = where(cu_seqlens_k, k.shape[0])
    mask = {mask}
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, v)
"""


SAME_SEQUENCE = "seq_q[:, None] == seq_k[None, :]"
BOTTOM_RIGHT = "pos_k[None, :] <= pos_q[:, None] + (len_k[None, :] - len_q[:, None])"


FORWARD_HEAD = """
class PagedSelfAttention(PagedSelfAttention):
    def forward(self, x, cache, seq_ids, cu_seqlens):
        N, D = x.shape
        q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))
        starts = cu_seqlens.tolist()
"""
APPEND = """\
        for b, seq_id in enumerate(seq_ids):
            cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])
        lens = [cache.seq_len(s) for s in seq_ids]
"""
GATHER = """\
        tables = [torch.tensor(cache.block_table(s)) for s in seq_ids]
        k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens)])
        v_all = torch.cat([cache.v_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens)])
        cu_k = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
"""
ATTEND = """\
        y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)
        return self.w_o(y.reshape(N, D))
"""


def forward(*parts: str) -> str:
    """A PagedSelfAttention whose forward is FORWARD_HEAD and `parts`: the gather-and-varlen path for every call."""
    return FORWARD_HEAD + "".join(parts)


BUGGY = [
    *POOL_BUGGY,  # the pool's mistakes (pool_variants.py)
    Variant("module_new_keys_twice", forward(APPEND, GATHER.replace(
        "        cu_k = torch.tensor([0, *lens])", """\
        news = [k[starts[b]:starts[b + 1]] for b in range(len(seq_ids))]
        k_all = torch.cat([part for b, n in enumerate(lens) for part in (k_all[sum(lens[:b]):sum(lens[:b + 1])],
                                                                         news[b])])
        news = [v[starts[b]:starts[b + 1]] for b in range(len(seq_ids))]
        v_all = torch.cat([part for b, n in enumerate(lens) for part in (v_all[sum(lens[:b]):sum(lens[:b + 1])],
                                                                         news[b])])
        lens = [n + starts[b + 1] - starts[b] for b, n in enumerate(lens)]
        cu_k = torch.tensor([0, *lens])"""), ATTEND), "PagedSelfAttention", "PagedSelfAttention.new_keys_twice"),
    Variant("module_ragged_tables", changed("PagedSelfAttention", """\
            tables = torch.full((N, width), -1, dtype=torch.int32, device=x.device)  # (B, max_blocks), −1 padded
            for b, seq_id in enumerate(seq_ids):
                table = cache.block_table(seq_id)
                tables[b, :len(table)] = torch.tensor(table, dtype=torch.int32, device=x.device)""", """\
            tables = torch.tensor([cache.block_table(s) for s in seq_ids], dtype=torch.int32, device=x.device)"""),
            "PagedSelfAttention", "ragged_to_tensor"),
    Variant("module_fused_qkv_without_bias", changed(
        "PagedSelfAttention",
        "q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))",
        "fused = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # the biases left out\n"
        "        q, k, v = (x @ fused.T).view(N, 3, self.num_heads, self.head_dim).unbind(1)"),
            "PagedSelfAttention", "PagedSelfAttention.bias_dropped"),
    # review 57's F3: no decoding path, one-token calls gathered for varlen_attention too. Once counted correct (the
    # outputs are right); the contract says "with one new token per sequence, paged_decode on the pool", and a copy
    # of every sequence's keys at every decoded token is what paging avoids
    Variant("module_gather_and_varlen_always", forward(APPEND, GATHER, ATTEND),
            "PagedSelfAttention", "PagedSelfAttention.decode_path_skipped"),
    Variant("module_fused_qkv_split_per_head", changed(  # the forty-sixth blind set's b08
        "PagedSelfAttention",
        "q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))",
        "fused = torch.cat([w(x) for w in (self.w_q, self.w_k, self.w_v)], -1)  # (N, 3·D)\n"
        "        q, k, v = fused.view(N, self.num_heads, 3, self.head_dim).unbind(2)"),
            "PagedSelfAttention", "PagedSelfAttention.fused_qkv_split_per_head"),
    Variant("module_decode_answer_thrown_away", changed(  # review 58's F4: paged_decode called, its answer not used
        "PagedSelfAttention", "y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context)  # (B, H, Dh)\n"
        "        else:", "paged_decode(q, cache.k_cache, cache.v_cache, tables, context)  # its answer thrown away\n"
        "        if True:"),
            "PagedSelfAttention", "PagedSelfAttention.decode_path_skipped"),
    # review 59's F2: varlen_attention always, plus the answer of paged_decode on a pool of its own, which is 0
    Variant("module_decode_answer_of_a_pool_of_its_own", changed("PagedSelfAttention",
              "y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context)  # (B, H, Dh)\n        else:",
              "z = torch.zeros(1, 1, self.num_heads, self.head_dim)  # one zero key and value: the answer is 0\n"
              "            dummy = paged_decode(q, z, z, torch.zeros(N, 1, dtype=torch.int32), "
              "torch.ones(N, dtype=torch.int32))\n        if True:").replace(
        "y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)  # (N, H, Dh)",
        "y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)\n"
        "            y = y + (dummy if N == len(seq_ids) else 0)"),
            "PagedSelfAttention", "PagedSelfAttention.decode_path_skipped"),
    Variant("module_output_weight_as_stored", changed(  # the forty-fifth blind set's b08
        "PagedSelfAttention", "return self.w_o(y.reshape(N, D))",
        "return y.reshape(N, D) @ self.w_o.weight + (0 if self.w_o.bias is None else self.w_o.bias)"),
            "PagedSelfAttention", "PagedSelfAttention.output_weight_as_stored"),
    # the fortieth blind set's b05 and b06
    Variant("varlen_joined_on_heads", changed("varlen_attention", """\
    out = torch.empty_like(q)
    scale""", """\
    outs = []
    scale""").replace("out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)",
                      "outs.append((torch.softmax(scores, dim=-1) @ vb).transpose(0, 1))").replace(
        "    return out", "    return torch.cat(outs, dim=1)"), "varlen_attention", "cat_wrong_axis"),
    Variant("varlen_keys_padded_to_longest_query", changed("varlen_attention", """\
        scores = qb @ kb.transpose(-2, -1) * scale  # (H, Tq, Dh) x (H, Dh, Tk) -> (H, Tq, Tk)""", """\
        longest = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())  # max_seqlen_q where max_seqlen_k belongs
        kb, vb = kb[:, :longest], vb[:, :longest]
        scores = qb @ kb.transpose(-2, -1) * scale""").replace("tq, tk = qe - qs, ke - ks", "tq, tk = qe - qs, kb.shape[1]"),
            "varlen_attention"),
    Variant("varlen_fast_path_on_queries_only", changed("varlen_attention", """\
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])""", """\
    scale = 1 / math.sqrt(q.shape[-1])
    lengths = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    if not causal and bool((lengths == lengths[0]).all()):  # one length: one batched call (the forty-first set's b06)
        n = len(lengths)
        qb = q.view(n, -1, *q.shape[1:]).transpose(1, 2)  # the keys taken as evenly split as the queries
        kb, vb = (t.view(n, -1, *t.shape[1:]).transpose(1, 2) for t in (k, v))
        return (torch.softmax(qb @ kb.transpose(-2, -1) * scale, dim=-1) @ vb).transpose(1, 2).reshape(q.shape)
    out = torch.empty_like(q)"""), "varlen_attention", situations=("varlen_attention.equal_queries_mishandled",)),
    Variant("varlen_last_sequence_skipped", changed("varlen_attention", """\
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):""", """\
    out = torch.zeros_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 2):  # one short: the last sequence is never computed"""),
            "varlen_attention", "slices_unwritten"),  # the forty-second blind set's b06
    Variant("varlen_output_reshaped", changed(
        "varlen_attention", "out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)",
        "out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).reshape(qe - qs, *q.shape[1:])  # a view, not a transpose"),
            "varlen_attention", "values_rearranged"),
    Variant("varlen_one_token_sequences_skipped", changed("varlen_attention", """\
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])""", """\
    out = torch.zeros_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if qe - qs < 2:  # taken for padding: a sequence of one token is skipped
            continue"""), "varlen_attention", "slices_zeroed"),
    Variant("varlen_inclusive_end", changed("varlen_attention", """\
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])""", """\
    out = torch.zeros_like(q)
    scale = 1 / math.sqrt(q.shape[-1])
    for b in range(len(cu_seqlens_q) - 1):
        qs, qe = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]) - 1  # "rows cu[b] ... cu[b + 1] - 1", as a slice
        ks, ke = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]) - 1"""),
            "varlen_attention", "varlen_attention.last_token_dropped"),
    # -- paged_decode -------------------------------------------------------------------------
    Variant("decode_max_over_heads", changed(  # the fortieth blind set's b04
        "paged_decode", "out[b] = torch.einsum(\"hn,nhd->hd\", torch.softmax(scores, dim=-1), v)",
        "e = torch.exp(scores - scores.amax(dim=0, keepdim=True))  # the max over the heads\n"
        "        out[b] = torch.einsum(\"hn,nhd->hd\", e / e.sum(dim=-1, keepdim=True), v)"),
            "paged_decode", "paged_decode.max_over_heads"),
    Variant("decode_softmax_over_heads", changed(  # the forty-fourth blind set's b03
        "paged_decode", "out[b] = torch.einsum(\"hn,nhd->hd\", torch.softmax(scores, dim=-1), v)",
        "out[b] = torch.einsum(\"hn,nhd->hd\", torch.softmax(scores, dim=0), v)"),
            "paged_decode", "paged_decode.softmax_over_heads"),
    Variant("decode_online_rescale_inverted", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        m, total, acc = torch.full((H,), -math.inf), torch.zeros(H), torch.zeros(H, Dh)
        for j in range(-(-n // bs)):  # a block at a time, with a running max and sum
            block = int(block_tables[b, j])
            k, v = k_cache[block, : min(bs, n - j * bs)], v_cache[block, : min(bs, n - j * bs)]  # (t, H, Dh)
            s = torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(Dh)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.where(torch.isinf(m), 0.0, torch.exp(m_new - m))  # inverted: e^(m_old - m_new)
            total, acc = total * alpha + p.sum(-1), acc * alpha[:, None] + torch.einsum("ht,thd->hd", p, v)
            m = m_new
        out[b] = acc / total[:, None]
    return out
""", "paged_decode", "paged_decode.rescale_inverted"),
    Variant("decode_scores_summed_over_heads", changed(  # the forty-sixth blind set's b03
        "paged_decode", """\
        scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)  # (H, Dh) x (n, H, Dh) -> (H, n)
        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)""", """\
        scores = torch.einsum("hd,nhd->n", q[b], k) / math.sqrt(Dh)  # h summed away
        out[b] = torch.einsum("n,nhd->hd", torch.softmax(scores, dim=-1), v)"""),
            "paged_decode", "paged_decode.scores_summed_over_heads"),
    Variant("decode_scale_precedence", changed(  # the forty-sixth blind set's b04
        "paged_decode", "/ math.sqrt(Dh)  # (H, Dh)", "* Dh ** -1/2  # (H, Dh)"),
            "paged_decode", "paged_decode.scale_precedence"),
    Variant("decode_running_max_from_zero", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        m, total, acc = torch.zeros(H), torch.zeros(H), torch.zeros(H, Dh)  # the max started at 0, not -inf
        for j in range(-(-n // bs)):
            block = int(block_tables[b, j])
            k, v = k_cache[block, : min(bs, n - j * bs)], v_cache[block, : min(bs, n - j * bs)]  # (t, H, Dh)
            s = torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(Dh)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.exp(m - m_new)
            total, acc = total * alpha + p.sum(-1), acc * alpha[:, None] + torch.einsum("ht,thd->hd", p, v)
            m = m_new
        out[b] = acc / total[:, None]
    return out
""", "paged_decode", situations=("paged_decode.far_below_zero_mishandled",)),  # the forty-fifth blind set's b03
    Variant("decode_divided_by_last_block_sum", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        m, total, acc = torch.full((H,), -math.inf), torch.zeros(H), torch.zeros(H, Dh)
        for j in range(-(-n // bs)):  # a block at a time, with a running max and sum
            block = int(block_tables[b, j])
            k, v = k_cache[block, : min(bs, n - j * bs)], v_cache[block, : min(bs, n - j * bs)]  # (t, H, Dh)
            s = torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(Dh)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.where(torch.isinf(m), 0.0, torch.exp(m - m_new))
            total, acc = p.sum(-1), acc * alpha[:, None] + torch.einsum("ht,thd->hd", p, v)  # total not carried
            m = m_new
        out[b] = acc / total[:, None]
    return out
""", "paged_decode", "paged_decode.last_block_sum"),  # the forty-second blind set's b04
    Variant("decode_whole_blocks_read", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1), v_cache[blocks].flatten(0, 1)  # every slot of its blocks"""),
            "paged_decode", "paged_decode.whole_blocks_read"),
    Variant("decode_block_zero_skipped", decode_with("""\
        kept = table[table > 0]  # 0 taken for padding: a sequence holding block 0 loses it
        k, v = k_cache[kept].flatten(0, 1)[:n], v_cache[kept].flatten(0, 1)[:n]"""),
            "paged_decode", "paged_decode.block_zero_skipped"),
    Variant("decode_position_as_slot", decode_with("""\
        slots = [int(table[t // bs]) * bs + t for t in range(n)]  # t, not t % bs
        k, v = k_cache.flatten(0, 1)[slots], v_cache.flatten(0, 1)[slots]"""),
            "paged_decode", "paged_decode.position_as_slot"),
    Variant("decode_padding_read", decode_with("""\
        k, v = k_cache[table].flatten(0, 1), v_cache[table].flatten(0, 1)  # the whole row"""),
            "paged_decode", "paged_decode.padding_read"),
    Variant("decode_logical_block_as_physical", decode_with("""\
        k, v = k_cache[:len(blocks)].flatten(0, 1)[:n], v_cache[:len(blocks)].flatten(0, 1)[:n]"""),
            "paged_decode", "paged_decode.logical_block_as_physical"),
    Variant("decode_block_not_times_block_size", decode_with("""\
        t = torch.arange(n)
        flat = table[t // bs] + t % bs  # the slot in the flattened pool
        k, v = k_cache.flatten(0, 1)[flat], v_cache.flatten(0, 1)[flat]"""),
            "paged_decode", "paged_decode.block_not_times_block_size"),
    Variant("decode_block_stride_from_table_width", decode_with("""\
        t = torch.arange(n)
        flat = table[t // bs] * block_tables.shape[1] + t % bs  # the table's width as the pool's block stride
        k, v = k_cache.flatten(0, 1)[flat], v_cache.flatten(0, 1)[flat]"""),
            "paged_decode", "paged_decode.block_stride_not_block_size"),
    Variant("decode_block_and_slot_swapped", decode_with("""\
        t = torch.arange(n)
        k, v = k_cache[table[t % bs], t // bs], v_cache[table[t % bs], t // bs]  # divmod's two read the wrong way"""),
            "paged_decode", "paged_decode.block_and_slot_swapped"),
    Variant("decode_partial_block_dropped", decode_with("""\
        blocks = block_tables[b, : n // bs].long()  # full blocks only
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]"""),
            "paged_decode", "paged_decode.partial_block_dropped"),
    Variant("decode_last_block_fill_by_remainder", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        nb = -(-n // bs)
        m, total, acc = torch.full((H,), -math.inf), torch.zeros(H), torch.zeros(H, Dh)
        for j in range(nb):
            block = int(block_tables[b, j])
            used = bs if j < nb - 1 else n % bs  # 0 when n fills the last block (blind set 61's b09)
            k, v = k_cache[block, :used], v_cache[block, :used]  # (t, H, Dh)
            s = torch.einsum("hd,thd->ht", q[b], k) / math.sqrt(Dh)
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[:, None])
            alpha = torch.where(torch.isinf(m), 0.0, torch.exp(m - m_new))
            total, acc = total * alpha + p.sum(-1), acc * alpha[:, None] + torch.einsum("ht,thd->hd", p, v)
            m = m_new
        out[b] = acc / total[:, None]
    return out
""", "paged_decode", "paged_decode.full_last_block_read_empty"),
    Variant("decode_last_block_fill_by_remainder_masked", decode_with("""\
        used = (len(blocks) - 1) * bs + n % bs  # the last block's fill as the remainder: 0 when it is full
        k, v = k_cache[blocks].flatten(0, 1)[:used], v_cache[blocks].flatten(0, 1)[:used]"""),
            "paged_decode", "paged_decode.full_last_block_read_empty"),
    Variant("decode_partial_block_dropped_but_one", decode_with("""\
        blocks = block_tables[b, : max(n // bs, 1)].long()  # full blocks only, and at least one
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]"""),
            "paged_decode", "paged_decode.partial_block_dropped"),
    Variant("decode_blocks_assumed_contiguous", decode_with("""\
        first = int(table[0]) * bs  # one run of the pool from the sequence's first block
        k, v = k_cache.flatten(0, 1)[first:first + n], v_cache.flatten(0, 1)[first:first + n]"""),
            "paged_decode", "paged_decode.blocks_assumed_contiguous"),
    Variant("decode_one_key_past_context", decode_with("""\
        t = torch.arange(n + 1)  # positions 0 … n
        k, v = k_cache[table[t // bs], t % bs], v_cache[table[t // bs], t % bs]"""),
            "paged_decode", "paged_decode.one_key_past_context"),
    Variant("decode_valid_mask_one_past", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    tables = block_tables.long().clamp(min=0)
    k, v = k_cache[tables].flatten(1, 2), v_cache[tables].flatten(1, 2)  # (B, slots, H, Dh)
    valid = torch.arange(k.shape[1], device=q.device)[None, :] <= context_lens.long()[:, None]  # <= for <
    k = torch.where(valid[..., None, None], k, torch.zeros_like(k))
    v = torch.where(valid[..., None, None], v, torch.zeros_like(v))
    scores = torch.einsum("bhd,bnhd->bhn", q, k) / math.sqrt(Dh)
    weights = torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1)
    return torch.einsum("bhn,bnhd->bhd", weights, v)
""", "paged_decode", "paged_decode.one_key_past_context"),
    Variant("decode_lengths_not_broadcast", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    tables = block_tables.long().clamp(min=0)
    k, v = k_cache[tables].flatten(1, 2), v_cache[tables].flatten(1, 2)  # (B, slots, H, Dh)
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens.long()  # no axis for the lengths
    scores = torch.einsum("bhd,bnhd->bhn", q, k) / math.sqrt(Dh)
    weights = torch.softmax(scores.masked_fill(~valid[:, None], float("-inf")), dim=-1)
    return torch.einsum("bhn,bnhd->bhd", weights, v)
""", "paged_decode", "paged_decode.lengths_not_broadcast"),
    Variant("decode_one_key_short", decode_with("""\
        t = torch.arange(n - 1)  # the new token's own key left out
        k, v = k_cache[table[t // bs], t % bs], v_cache[table[t // bs], t % bs]"""),
            "paged_decode", "paged_decode.one_key_short"),
    Variant("decode_unscaled", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]
        k = k * math.sqrt(Dh)  # undoes the scale below"""), "paged_decode", "paged_decode.unscaled"),
    Variant("decode_heads_reshaped", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        blocks = block_tables[b, : -(-n // bs)].long()
        k = k_cache[blocks].flatten(0, 1)[:n].reshape(H, n, Dh)  # heads first, by a reshape
        v = v_cache[blocks].flatten(0, 1)[:n].reshape(H, n, Dh)
        weights = torch.softmax((k @ q[b][:, :, None])[..., 0] / math.sqrt(Dh), dim=-1)
        out[b] = (weights[:, None] @ v)[:, 0]
    return out
""", "paged_decode", "paged_decode.heads_reshaped"),
    Variant("decode_own_blocks_masked_multiplied", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1), v_cache[blocks].flatten(0, 1)  # every slot of its own blocks
        keep = torch.arange(k.shape[0], device=q.device) < n
        scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)
        weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", weights, v)  # 0 · NaN past n
        continue"""), "paged_decode", "paged_decode.masked_slots_multiplied"),
    Variant("decode_masked_slots_multiplied", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs = k_cache.shape[1]
    k = k_cache[block_tables.clamp(min=0).long()].flatten(1, 2)  # (B, max_blocks·bs, H, Dh)
    v = v_cache[block_tables.clamp(min=0).long()].flatten(1, 2)
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens[:, None]  # (B, L)
    scores = torch.einsum("bhd,blhd->bhl", q, k) / math.sqrt(Dh)
    weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("bhl,blhd->bhd", weights, v)  # 0 · NaN where masked
""", "paged_decode", "paged_decode.masked_slots_multiplied"),
    Variant("decode_softmax_without_max", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]
        e = torch.exp(torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh))  # no max subtracted: inf past 88
        out[b] = torch.einsum("hn,nhd->hd", e / e.sum(-1, keepdim=True), v)
        continue"""), "paged_decode", situations=("paged_decode.large_scores_mishandled",)),
    Variant("decode_split_k_not_rescaled", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]
        scores = torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)
        parts = [(torch.softmax(s, -1), w) for s, w in zip(scores.split(32, -1), v.split(32, 0))]  # 32-token splits
        out[b] = sum(torch.einsum("hn,nhd->hd", p, w) for p, w in parts) / len(parts)  # no rescale to one max
        continue"""), "paged_decode", situations=("paged_decode.long_context_mishandled",)),
    Variant("decode_split_k_empty_split", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    bs, split = k_cache.shape[1], 4  # blocks a split: vLLM's paged_attention_v2 partitions
    out = torch.empty_like(q)
    for b in range(B):
        n = int(context_lens[b])
        maxes, sums, outs = [], [], []
        for start in range(0, block_tables.shape[1], split):  # every split of the row, used or not
            slots = torch.arange(start * bs, (start + split) * bs)
            slots = slots[slots < block_tables.shape[1] * bs]
            keep = slots < n
            blocks = block_tables[b, slots // bs].clamp(min=0).long()
            k, v = k_cache[blocks, slots % bs], v_cache[blocks, slots % bs]
            s = (torch.einsum("hd,nhd->hn", q[b], k) / math.sqrt(Dh)).masked_fill(~keep, float("-inf"))
            m = s.amax(-1, keepdim=True)  # -inf for a split past the sequence
            e = torch.exp(s - m)  # NaN there: -inf - -inf
            maxes.append(m)
            sums.append(e.sum(-1, keepdim=True))
            outs.append(torch.einsum("hn,nhd->hd", e, torch.where(keep[:, None, None], v, 0.0)))
        m = torch.stack(maxes).amax(0)
        scale = [torch.exp(mi - m) for mi in maxes]
        out[b] = sum(c * o for c, o in zip(scale, outs)) / sum(c * l for c, l in zip(scale, sums))
    return out
""", "paged_decode", situations=("paged_decode.wide_tables_mishandled",)),
    Variant("decode_keepdim", decode_with("""\
        k, v = k_cache[blocks].flatten(0, 1)[:n], v_cache[blocks].flatten(0, 1)[:n]""").replace(
        "    return out", "    return out[:, :, None]  # (B, H, 1, Dh): one query"), "paged_decode", "axis_extra"),
    # -- varlen_attention ---------------------------------------------------------------------
    Variant("varlen_scaled_by_width", varlen_with(VARLEN_BODY).replace(
        "scale = 1 / math.sqrt(q.shape[-1])", "scale = 1 / q.shape[-1]"), "varlen_attention", "scaled_by_size_not_root"),
    Variant("varlen_exp2_without_log2e", varlen_with(VARLEN_BODY.replace(
        "(torch.softmax(scores, dim=-1) @ vb)",
        "(torch.exp2(scores - scores.amax(-1, keepdim=True)) / torch.exp2(scores - scores.amax(-1, keepdim=True))"
        ".sum(-1, keepdim=True) @ vb)")), "varlen_attention", "exponent_base_wrong"),
    Variant("varlen_max_over_batch", dense_varlen(f"({SAME_SEQUENCE}) & (~torch.tensor(causal) | ({BOTTOM_RIGHT}))")
            .replace("weights = torch.softmax(scores.masked_fill(~mask, float(\"-inf\")), dim=-1)",
                     "e = (scores.masked_fill(~mask, float(\"-inf\")) - scores.max()).exp()  # one max for all\n"
                     "    weights = e / e.sum(-1, keepdim=True)"),  # the forty-seventh blind set's paged b05
            "varlen_attention", "varlen_attention.max_over_batch"),
    Variant("decode_padding_searched", decode_with("""\
        row = block_tables[b].tolist()
        used = torch.tensor(row[:row.index(-1)], dtype=torch.long)  # the forty-eighth blind set's paged b03
        k, v = k_cache[used].flatten(0, 1)[:n], v_cache[used].flatten(0, 1)[:n]"""),
            "paged_decode", "paged_decode.padding_searched"),
    Variant("module_scaled_twice", changed(  # the forty-eighth blind set's paged b07
        "PagedSelfAttention", "starts = cu_seqlens.tolist()",
        "starts = cu_seqlens.tolist()\n        q = q / math.sqrt(self.head_dim)"),
            "PagedSelfAttention", "PagedSelfAttention.scaled_twice"),
    Variant("module_cu_seqlens_without_zero", changed(  # the forty-eighth blind set's paged b08
        "PagedSelfAttention", "torch.tensor([0, *lens], device=x.device).cumsum(0)",
        "torch.tensor(lens, device=x.device).cumsum(0)"),
            "PagedSelfAttention", "PagedSelfAttention.cu_seqlens_malformed"),
    Variant("varlen_softmax_without_max", dense_varlen(f"({SAME_SEQUENCE}) & (~torch.tensor(causal) | ({BOTTOM_RIGHT}))")
            .replace("weights = torch.softmax(scores.masked_fill(~mask, float(\"-inf\")), dim=-1)",
                     "e = scores.masked_fill(~mask, float(\"-inf\")).exp()  # no max: e^300 overflows\n"
                     "    weights = e / e.sum(-1, keepdim=True)"),
            "varlen_attention", situations=("varlen_attention.sequences_far_apart_mishandled",)),
    Variant("varlen_cu_seqlens_as_lengths", """
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    out = torch.zeros_like(q)
    qs = ks = 0
    for tq, tk in zip(cu_seqlens_q[1:].tolist(), cu_seqlens_k[1:].tolist()):  # the lengths, one a sequence
        qb, kb, vb = q[qs:qs + tq].transpose(0, 1), k[ks:ks + tk].transpose(0, 1), v[ks:ks + tk].transpose(0, 1)
        scores = qb @ kb.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            n_q, n_k = qb.shape[1], kb.shape[1]
            allowed = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[qs:qs + tq] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)
        qs, ks = qs + tq, ks + tk
    return out
""", "varlen_attention", "varlen_attention.cu_seqlens_as_lengths"),
    Variant("varlen_keys_cut_by_q", varlen_with(VARLEN_BODY.replace("k[ks:ke]", "k[qs:qe]").replace(
        "v[ks:ke]", "v[qs:qe]").replace("tq, tk = qe - qs, ke - ks", "tq = tk = qe - qs")),
            "varlen_attention", "varlen_attention.keys_cut_by_q"),
    Variant("varlen_first_row_in_previous_sequence", """
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    rows_q, rows_k = torch.arange(q.shape[0]), torch.arange(k.shape[0])
    seq_q = torch.searchsorted(cu_seqlens_q[1:], rows_q)  # right=False: a sequence's first row goes to the one before
    seq_k = torch.searchsorted(cu_seqlens_k[1:], rows_k)
    allowed = seq_q[:, None] == seq_k[None, :]
    if causal:
        at_q, at_k = rows_q - cu_seqlens_q[seq_q], rows_k - cu_seqlens_k[seq_k]
        offset = (cu_seqlens_k.diff() - cu_seqlens_q.diff())[seq_q]
        allowed &= at_k[None, :] <= (at_q + offset)[:, None]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    scores = (qh @ kh.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1)
""", "varlen_attention", "varlen_attention.first_row_in_previous_sequence"),
    Variant("varlen_crosses_boundaries", """
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # the packed batch as one sequence
    scores = qh @ kh.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        allowed = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vh).transpose(0, 1)
""", "varlen_attention", "varlen_attention.crosses_boundaries"),
    Variant("varlen_causal_global_positions", dense_varlen(
        f"({SAME_SEQUENCE}) & (~torch.tensor(causal) | (torch.arange(k.shape[0])[None, :] <= "
        "torch.arange(q.shape[0])[:, None]))"), "varlen_attention", "varlen_attention.causal_global_positions"),
    Variant("varlen_causal_one_global_offset", dense_varlen(
        f"({SAME_SEQUENCE}) & (~torch.tensor(causal) | (torch.arange(k.shape[0])[None, :] <= "
        "torch.arange(q.shape[0])[:, None] + (k.shape[0] - q.shape[0])))"),
            "varlen_attention", "varlen_attention.causal_global_positions"),
    Variant("varlen_causal_packed_rows_per_sequence", varlen_with(VARLEN_BODY.replace(
        "allowed = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(diagonal=tk - tq)",
        "rows, cols = torch.arange(qs, qe, device=q.device), torch.arange(ks, ke, device=q.device)\n"
        "            allowed = cols[None, :] <= rows[:, None] + (tk - tq)")),
            "varlen_attention", "varlen_attention.causal_global_positions"),
    Variant("varlen_causal_batch_offset_per_sequence", varlen_with(VARLEN_BODY.replace(
        ".tril(diagonal=tk - tq)", ".tril(diagonal=k.shape[0] - q.shape[0])")),
            "varlen_attention", "varlen_attention.causal_global_positions"),
    Variant("varlen_causal_top_left", varlen_with(VARLEN_BODY.replace(".tril(diagonal=tk - tq)", ".tril()")),
            "varlen_attention", "varlen_attention.causal_top_left"),
    Variant("varlen_causal_ignored", varlen_with(VARLEN_BODY.replace("if causal:", "if False:  # causal")),
            "varlen_attention", "varlen_attention.causal_ignored"),
    Variant("varlen_unscaled", varlen_with(VARLEN_BODY.replace(" * scale", "")),
            "varlen_attention", "varlen_attention.unscaled"),
    Variant("varlen_heads_axis", varlen_with("""\
        scores = q[qs:qe] @ k[ks:ke].transpose(-2, -1) * scale  # (T, H, H)
        out[qs:qe] = torch.softmax(scores, dim=-1) @ v[ks:ke]"""),
            "varlen_attention", "varlen_attention.heads_axis"),
    Variant("varlen_heads_reshaped", varlen_with(VARLEN_BODY.replace(
        "qb, kb, vb = q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1)",
        "H = q.shape[1]\n        qb, kb, vb = (x.reshape(H, x.shape[0], -1) for x in (q[qs:qe], k[ks:ke], v[ks:ke]))").replace(
        "out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).transpose(0, 1)",
        "out[qs:qe] = (torch.softmax(scores, dim=-1) @ vb).reshape(qe - qs, H, -1)")),
            "varlen_attention", "varlen_attention.heads_reshaped"),
    Variant("varlen_heads_left_first", varlen_with(VARLEN_BODY).replace(
        "    return out", "    return out.transpose(0, 1)  # (H, total_q, Dh)"), "varlen_attention", "axes_swapped"),
    # -- PagedSelfAttention -------------------------------------------------------------------
    Variant("module_not_causal", forward(APPEND, GATHER, ATTEND.replace("causal=True", "causal=False")),
            "PagedSelfAttention", "PagedSelfAttention.not_causal"),
    Variant("module_new_tokens_only", forward(APPEND, ATTEND.replace("k_all, v_all, cu_seqlens, cu_k",
                                                                     "k, v, cu_seqlens, cu_seqlens")),
            "PagedSelfAttention", "PagedSelfAttention.new_tokens_only"),
    Variant("module_key_offsets_from_queries", forward(APPEND, GATHER, ATTEND.replace("cu_seqlens, cu_k",
                                                                              "cu_seqlens, cu_seqlens")),
            "PagedSelfAttention", "PagedSelfAttention.key_offsets_from_queries"),
    Variant("module_tables_before_append", forward(  # a new sequence has no table yet: the prefill raises
        "        tables = [torch.tensor(cache.block_table(s)) for s in seq_ids]\n", APPEND,
        GATHER.replace("        tables = [torch.tensor(cache.block_table(s)) for s in seq_ids]\n", ""), ATTEND),
            "PagedSelfAttention", "PagedSelfAttention.table_before_append"),
    Variant("module_values_from_key_pool", forward(APPEND, GATHER.replace("v_all = torch.cat([cache.v_cache[t]",
                                                                         "v_all = torch.cat([cache.k_cache[t]"), ATTEND),
            "PagedSelfAttention", "PagedSelfAttention.values_from_key_pool"),
    Variant("module_tables_cut_to_first", forward(APPEND, """\
        if N == len(seq_ids):  # one token each: decode from the pool
            width = len(cache.block_table(seq_ids[0]))  # the first sequence's table, not the longest
            tables = torch.full((N, width), -1, dtype=torch.int32)
            for b, s in enumerate(seq_ids):
                tables[b] = torch.tensor((cache.block_table(s) + [-1] * width)[:width], dtype=torch.int32)
            y = paged_decode(q, cache.k_cache, cache.v_cache, tables, torch.tensor(lens, dtype=torch.int32))
            return self.w_o(y.reshape(N, D))
""", GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.tables_cut_to_first"),
    Variant("module_batch_walked_by_id", forward("""\
        seq_ids = sorted(seq_ids)  # the pool's order, while x's rows keep the batch's (blind set 59's b08)
""", APPEND, GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.batch_reordered"),
    Variant("module_tables_memoised", forward(APPEND, """\
        memo = self.__dict__.setdefault("memo", {})  # seq_id -> its table, asked for once
        tables = [memo.setdefault(s, cache.block_table(s)) for s in seq_ids]
        if N == len(seq_ids):  # one token each: decode from the pool
            width = max(len(t) for t in tables)
            padded = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32)
            y = paged_decode(q, cache.k_cache, cache.v_cache, padded, torch.tensor(lens, dtype=torch.int32))
            return self.w_o(y.reshape(N, D))
""", GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.tables_memoised"),
    Variant("module_pool_internals_read", forward(APPEND.replace("cache.seq_len(s)", "cache.lengths[s]"), GATHER.replace(
        "cache.block_table(s)", "cache.tables[s]"), ATTEND),  # right with its own pool, which keeps them so
            "PagedSelfAttention", "PagedSelfAttention.pool_internals_read"),
    Variant("module_lengths_before_append", forward("""\
        lens = []
        for s in seq_ids:  # what each sequence holds: 0 if it is new
            try:
                lens.append(cache.seq_len(s))
            except KeyError:
                lens.append(0)
""", APPEND.replace("        lens = [cache.seq_len(s) for s in seq_ids]\n", ""), GATHER, ATTEND),
            "PagedSelfAttention", "PagedSelfAttention.lengths_before_append"),
    Variant("module_decode_lengths_before_append", forward("""\
        if N == len(seq_ids):  # one new token each: decode straight from the pool
            context_lens = torch.tensor([cache.seq_len(s) for s in seq_ids], dtype=torch.int32)  # before the append
            for b, seq_id in enumerate(seq_ids):
                cache.append(seq_id, k[b:b + 1], v[b:b + 1])
            rows = [cache.block_table(s) for s in seq_ids]
            tables = torch.full((N, max(map(len, rows))), -1, dtype=torch.int32)
            for b, row in enumerate(rows):
                tables[b, :len(row)] = torch.tensor(row, dtype=torch.int32)
            y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context_lens)
            return self.w_o(y.reshape(N, D))
""", APPEND, GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.lengths_before_append"),
    Variant("module_decode_tables_before_append", forward("""\
        if N == len(seq_ids):  # one new token each: decode straight from the pool
            rows = [cache.block_table(s) for s in seq_ids]  # before the append: a block opened now is missing
            for b, seq_id in enumerate(seq_ids):
                cache.append(seq_id, k[b:b + 1], v[b:b + 1])
            context_lens = torch.tensor([cache.seq_len(s) for s in seq_ids], dtype=torch.int32)
            width = max(-(-int(n) // cache.k_cache.shape[1]) for n in context_lens)
            tables = torch.full((N, width), -1, dtype=torch.int32)
            for b, row in enumerate(rows):
                tables[b, :len(row)] = torch.tensor(row, dtype=torch.int32)
            y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context_lens)
            return self.w_o(y.reshape(N, D))
""", APPEND, GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.table_before_append"),
    Variant("module_decode_tables_before_append_reshaped", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):  # right: each row's blocks, reshaped to its keys
    B, H, Dh = q.shape
    size, out = k_cache.shape[1], []
    for b in range(B):
        n = int(context_lens[b])
        blocks = block_tables[b][block_tables[b] >= 0][:-(-n // size)].long()
        keys = k_cache[blocks].reshape(-(-n // size) * size, H, Dh)[:n]
        values = v_cache[blocks].reshape(-(-n // size) * size, H, Dh)[:n]
        weights = torch.softmax(torch.einsum("hd,nhd->hn", q[b], keys) / Dh ** 0.5, dim=-1)
        out.append(torch.einsum("hn,nhd->hd", weights, values))
    return torch.stack(out)
""" + forward("""\
        if N == len(seq_ids):  # one new token each: tables as wide as they were before the append (blind set 58's b24)
            rows = [cache.block_table(s) for s in seq_ids]
            for b, seq_id in enumerate(seq_ids):
                cache.append(seq_id, k[b:b + 1], v[b:b + 1])
            context_lens = torch.tensor([cache.seq_len(s) for s in seq_ids], dtype=torch.int32)
            tables = torch.full((N, max(len(row) for row in rows)), -1, dtype=torch.int32)
            for b, row in enumerate(rows):
                tables[b, :len(row)] = torch.tensor(row, dtype=torch.int32)
            y = paged_decode(q, cache.k_cache, cache.v_cache, tables, context_lens)
            return self.w_o(y.reshape(N, D))
""", APPEND, GATHER, ATTEND), "PagedSelfAttention", "PagedSelfAttention.table_before_append"),
    Variant("module_appends_first_gathered_keys_reshaped_wide", changed(  # review 78's F3: not table_before_append
        "PagedSelfAttention", """\
            tables = [torch.tensor(cache.block_table(s), device=x.device) for s in seq_ids]
            k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)])""", """\
            tables, counts = [], []
            for s in seq_ids:
                tables.append(torch.tensor(cache.block_table(s), device=x.device))
                counts.append(cache.seq_len(s))
            k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n].reshape(n, self.num_heads, 2 * self.head_dim)
                               for t, n in zip(tables, lens, strict=True)])"""),
            "PagedSelfAttention", "reshape_sizes_wrong"),
    Variant("module_no_output_projection", forward(APPEND, GATHER, ATTEND.replace("self.w_o(y.reshape(N, D))",
                                                                                  "y.reshape(N, D)")),
            "PagedSelfAttention", "PagedSelfAttention.no_output_projection"),
    Variant("module_heads_split_inner", forward(APPEND, GATHER, ATTEND).replace(
        "w(x).view(N, self.num_heads, self.head_dim)", "w(x).view(N, self.head_dim, self.num_heads).transpose(1, 2)"),
            "PagedSelfAttention", "PagedSelfAttention.heads_split_inner"),
    Variant("module_heads_merged_inner", forward(APPEND, GATHER, ATTEND.replace("self.w_o(y.reshape(N, D))",
                                                                                "self.w_o(y.transpose(1, 2).reshape(N, D))")),
            "PagedSelfAttention", "PagedSelfAttention.heads_merged_inner"),
    Variant("cache_keys_and_values_one_tensor", """
class PagedKVCache(PagedKVCache):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype=dtype, device=device)
        self.v_cache = self.k_cache  # blind set 50's b17: self.k_cache = self.v_cache = torch.zeros(...)
""", "PagedKVCache", "PagedKVCache.keys_and_values_shared"),
    Variant("cache_table_sorted", """
class PagedKVCache(PagedKVCache):
    def block_table(self, seq_id):
        return sorted(super().block_table(seq_id))  # by physical index, not by the tokens' order
""", "PagedKVCache", "PagedKVCache.table_not_in_token_order"),
    Variant("module_bias_ignored", """
class PagedSelfAttention(PagedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias=True)  # the caller's bias=False never reaches the layers
""", "PagedSelfAttention", "parameters_not_loaded"),
    Variant("module_unused_slots_read", forward(APPEND, """\
        tables = [torch.tensor(cache.block_table(s)) for s in seq_ids]
        k_all = torch.cat([cache.k_cache[t].flatten(0, 1) for t in tables])  # every slot of its blocks
        v_all = torch.cat([cache.v_cache[t].flatten(0, 1) for t in tables])
        cu_k = torch.tensor([0, *(len(t) * cache.k_cache.shape[1] for t in tables)]).cumsum(0).to(torch.int32)
""", ATTEND), "PagedSelfAttention", "PagedSelfAttention.unused_slots_read"),
    Variant("module_keeps_its_own_copy", """
class PagedSelfAttention(PagedSelfAttention):
    def forward(self, x, cache, seq_ids, cu_seqlens):
        N, D = x.shape
        q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))
        starts = cu_seqlens.tolist()
        if not hasattr(self, "kept"):
            self.kept = {}
        for b, seq_id in enumerate(seq_ids):
            cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])  # the pool is kept up
            old_k, old_v = self.kept.get(seq_id, (k[:0], v[:0]))
            self.kept[seq_id] = (torch.cat([old_k, k[starts[b]:starts[b + 1]]]),
                                 torch.cat([old_v, v[starts[b]:starts[b + 1]]]))
        lens = [len(self.kept[s][0]) for s in seq_ids]
        k_all = torch.cat([self.kept[s][0] for s in seq_ids])  # but never read: the module's own copy is
        v_all = torch.cat([self.kept[s][1] for s in seq_ids])
        cu_k = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
        y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)
        return self.w_o(y.reshape(N, D))
""", "PagedSelfAttention", "PagedSelfAttention.pool_not_read"),
    Variant("module_llama_names", """
class PagedSelfAttention(PagedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = self.w_q, self.w_k, self.w_v, self.w_o
        del self.w_q, self.w_k, self.w_v, self.w_o

    def forward(self, x, cache, seq_ids, cu_seqlens):
        self.w_q, self.w_k, self.w_v, self.w_o = self.q_proj, self.k_proj, self.v_proj, self.o_proj
        return super().forward(x, cache, seq_ids, cu_seqlens)
""", "PagedSelfAttention", "layer_names"),
]

CORRECT = [
    Variant("varlen_padded_and_picked_by_a_bool_mask", """
def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    # padded to the batch inside, a key mask per sequence, the real rows picked back by a bool mask: the meta device
    # cannot give that index's shape without data, and says so (the forty-sixth blind set's c03)
    dev = q.device
    cq, ck = cu_seqlens_q.long().to(dev), cu_seqlens_k.long().to(dev)
    lq, lk = cq[1:] - cq[:-1], ck[1:] - ck[:-1]
    iq, ik = torch.arange(q.shape[0], device=dev), torch.arange(k.shape[0], device=dev)
    q_ok, k_ok = iq[None, :] < lq[:, None], ik[None, :] < lk[:, None]
    q_idx = torch.where(q_ok, cq[:-1, None] + iq[None, :], torch.zeros_like(q_ok, dtype=torch.long))
    k_idx = torch.where(k_ok, ck[:-1, None] + ik[None, :], torch.zeros_like(k_ok, dtype=torch.long))
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    qp, kp, vp = q.to(work)[q_idx], k.to(work)[k_idx], v.to(work)[k_idx]
    s = torch.einsum("bihd,bjhd->bhij", qp, kp) / math.sqrt(q.shape[-1])
    ok = k_ok[:, None, None, :]
    if causal:
        ok = ok & (ik[None, None, :] <= iq[None, :, None] + (lk - lq)[:, None, None])[:, None]
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", p, vp)[q_ok].to(q.dtype)
"""),
    Variant(
        "pool_fifo_free_list_token_loop_tensor_tables",  # a deque handed out from the front, tokens written one by
        # one, tables kept and returned as tensors, the free list refilled at the front
        """
        import collections

        class PagedKVCache:
            def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
                self.k_cache = torch.empty(num_blocks, block_size, num_heads, head_dim, dtype=dtype, device=device)
                self.v_cache = torch.empty_like(self.k_cache)
                self.free_list = collections.deque(range(num_blocks))
                self.seqs = {}

            def append(self, seq_id, k, v):
                table, n = self.seqs.get(seq_id, (torch.empty(0, dtype=torch.int32), 0))
                bs = self.k_cache.shape[1]
                extra = max(0, (n + len(k) + bs - 1) // bs - len(table))
                if extra > len(self.free_list):
                    raise RuntimeError(f"need {extra} blocks, {len(self.free_list)} free")
                taken = [self.free_list.popleft() for _ in range(extra)]
                table = torch.cat([table, torch.tensor(taken, dtype=torch.int32)])
                for i in range(len(k)):
                    block, slot = divmod(n + i, bs)
                    self.k_cache[table[block]][slot].copy_(k[i])
                    self.v_cache[table[block]][slot].copy_(v[i])
                self.seqs[seq_id] = (table, n + len(k))

            def block_table(self, seq_id):
                return self.seqs[seq_id][0].clone()

            def seq_len(self, seq_id):
                return self.seqs[seq_id][1]

            def num_free_blocks(self):
                return len(self.free_list)

            def free(self, seq_id):
                table, _ = self.seqs.pop(seq_id)
                self.free_list.extendleft(table.tolist())
        """,
    ),
    Variant(
        "decode_vectorised_gather_with_masks",  # every table row gathered at once (−1 clamped), masked, values zeroed
        """
        def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
            B, H, Dh = q.shape
            rows = block_tables.clamp(min=0).long()  # (B, max_blocks)
            k = k_cache[rows].flatten(1, 2)  # (B, max_blocks, bs, H, Dh) -> (B, L, H, Dh)
            v = v_cache[rows].flatten(1, 2)
            valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens[:, None].long()  # (B, L)
            k = torch.where(valid[:, :, None, None], k, 0.0)
            v = torch.where(valid[:, :, None, None], v, 0.0)
            scores = torch.einsum("bhd,blhd->bhl", q, k) * Dh ** -0.5
            weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
            return torch.einsum("bhl,blhd->bhd", weights, v)
        """,
    ),
    Variant(
        "decode_sdpa_per_sequence",  # each sequence's keys gathered token by token, then torch's own attention
        """
        import torch.nn.functional as F

        def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
            bs = k_cache.shape[1]
            outs = []
            for b in range(q.shape[0]):
                where = [(int(block_tables[b, t // bs]), t % bs) for t in range(int(context_lens[b]))]
                k = torch.stack([k_cache[blk, s] for blk, s in where]).transpose(0, 1)  # (H, n, Dh)
                v = torch.stack([v_cache[blk, s] for blk, s in where]).transpose(0, 1)
                outs.append(F.scaled_dot_product_attention(q[b][:, None], k, v)[:, 0])
            return torch.stack(outs)
        """,
    ),
    Variant("varlen_vectorised_mask", dense_varlen(f"({SAME_SEQUENCE}) & (~torch.tensor(causal, device=q.device) | "
                                                   f"({BOTTOM_RIGHT}))")),
    Variant(
        "varlen_sdpa_per_sequence",  # torch's attention on each sequence, a bottom-right bool mask, lengths by diff
        """
        import torch.nn.functional as F

        def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
            lens_q = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).tolist()
            lens_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
            outs = []
            for qb, kb, vb in zip(q.split(lens_q), k.split(lens_k), v.split(lens_k)):
                mask = None
                if causal:
                    mask = torch.ones(len(qb), len(kb), dtype=torch.bool, device=q.device).tril(len(kb) - len(qb))
                y = F.scaled_dot_product_attention(qb.transpose(0, 1), kb.transpose(0, 1), vb.transpose(0, 1),
                                                   attn_mask=mask)
                outs.append(y.transpose(0, 1))
            return torch.cat(outs)
        """,
    ),
]

DEVICE_BUGGY = [
    Variant("pool_on_cpu", """
class PagedKVCache(PagedKVCache):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype)  # device dropped
""", "PagedKVCache", "result_on_cpu"),
    Variant("varlen_rows_on_cpu", dense_varlen(f"({SAME_SEQUENCE}) & (~torch.tensor(causal, device=q.device) | "
                                               f"({BOTTOM_RIGHT}))", arange_device=""),
            "varlen_attention", "tensor_on_cpu"),
    Variant("decode_positions_on_cpu", """
def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    B, H, Dh = q.shape
    rows = block_tables.clamp(min=0).long()
    k = k_cache[rows].flatten(1, 2)
    v = v_cache[rows].flatten(1, 2)
    valid = torch.arange(k.shape[1])[None, :] < context_lens[:, None].long()  # made on the CPU
    k = torch.where(valid[:, :, None, None], k, 0.0)
    v = torch.where(valid[:, :, None, None], v, 0.0)
    scores = torch.einsum("bhd,blhd->bhl", q, k) * Dh ** -0.5
    weights = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("bhl,blhd->bhd", weights, v)
""", "paged_decode", "tensor_on_cpu"),
]

# Bugs of the situations a step's checks add (spec.Check.situation): right in the plain case, wrong in each of the
# others in a way no listed mistake explains; each check names its situation.
BUGGY += [
    Variant("pool_situations", """
_PagedKVCache = PagedKVCache

class PagedKVCache(_PagedKVCache):
    def seq_len(self, seq_id):
        n = super().seq_len(seq_id)
        return n + 1 if n > 8 else n

    def num_free_blocks(self):
        return max(super().num_free_blocks() - 1, 0)
""", "PagedKVCache", situations=("PagedKVCache.counts_mishandled",)),
    Variant("pool_default_half", """
_PagedKVCacheHalf = PagedKVCache

class PagedKVCache(_PagedKVCacheHalf):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float16, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype, device)

    def append(self, seq_id, k, v):  # stored in the pool's own dtype
        super().append(seq_id, k.to(self.k_cache.dtype), v.to(self.v_cache.dtype))
""", "PagedKVCache", "PagedKVCache.default_dtype"),
    Variant("pool_every_block_taken_for_none", """
_PagedKVCacheSliced = PagedKVCache

class PagedKVCache(_PagedKVCacheSliced):
    def append(self, seq_id, k, v):
        table = self.tables.get(seq_id, [])
        start = self.lengths.get(seq_id, 0)
        end = start + k.shape[0]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more, {len(self.free_blocks)} free")
        table = table + self.free_blocks[-needed:]  # with needed 0, every free block
        del self.free_blocks[-needed:]
        positions = torch.arange(start, end, device=self.k_cache.device)
        blocks = torch.tensor(table, device=self.k_cache.device)[positions // self.block_size]
        self.k_cache[blocks, positions % self.block_size] = k
        self.v_cache[blocks, positions % self.block_size] = v
        self.tables[seq_id], self.lengths[seq_id] = table, end
""", "PagedKVCache", "PagedKVCache.every_block_taken_for_none"),
    Variant("decode_situations", """
_paged_decode = paged_decode

def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    out = _paged_decode(q, k_cache, v_cache, block_tables, context_lens)
    odd = bool(k_cache.isnan().any()) or q.dtype == torch.float16 or bool((context_lens % 4 == 0).all())
    return out + 0.25 if odd else out
""", "paged_decode", situations=("paged_decode.unused_slots_read", "paged_decode.boundaries_mishandled",
                                "paged_decode.half_mishandled")),
    Variant("varlen_situations", """
_varlen_attention = varlen_attention

def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    out = _varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    odd = causal or q.dtype == torch.float16 or q.shape[0] != k.shape[0]
    return out + 0.25 if odd else out
""", "varlen_attention", situations=("varlen_attention.causal_mishandled", "varlen_attention.lengths_mishandled",
                                    "varlen_attention.half_mishandled")),
    Variant("module_situations", """
_PagedSelfAttention = PagedSelfAttention

class PagedSelfAttention(_PagedSelfAttention):
    def forward(self, x, cache, seq_ids, cu_seqlens):
        out = super().forward(x, cache, seq_ids, cu_seqlens)
        odd = self.w_q.bias is None or len(seq_ids) == 1
        return out + 0.25 if odd else out
""", "PagedSelfAttention", situations=("PagedSelfAttention.joining_mishandled",
                                      "PagedSelfAttention.bias_mishandled")),
]

# Bugs located by a simpler case the candidate gets right (StepSpec.probes): one length, one sequence.
BUGGY += [
    Variant("decode_full_last_block_dropped", decode_with("""\
        kept = n - (bs if n % bs == 0 else 0)  # a full last block counted as holding n % bs = 0 tokens
        k, v = k_cache[blocks].flatten(0, 1)[:kept], v_cache[blocks].flatten(0, 1)[:kept]"""),
            "paged_decode", "paged_decode.full_last_block_read_empty"),
    Variant("decode_one_past_a_full_last_block", decode_with("""\
        fill = n % bs if n % bs else bs + 1  # meant `or bs`: a full last block read one slot past its end
        kept = (len(blocks) - 1) * bs + fill
        k, v = k_cache[table.clamp(min=0)].flatten(0, 1)[:kept], v_cache[table.clamp(min=0)].flatten(0, 1)[:kept]"""),
            "paged_decode", "paged_decode.boundaries_mishandled"),
    Variant("decode_one_block_past_a_full_row", decode_with("""\
        nb = n // bs + 1  # one block too many when n fills its last (blind set 63's b09)
        k = k_cache[block_tables[b, :nb].long()].reshape(nb * bs, H, Dh)[:n]
        v = v_cache[block_tables[b, :nb].long()].reshape(nb * bs, H, Dh)[:n]"""),
            "paged_decode", "paged_decode.block_past_a_full_row"),
    Variant("decode_full_rows_differ", """
_paged_decode_ = paged_decode

def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    out = _paged_decode_(q, k_cache, v_cache, block_tables, context_lens)
    bs = k_cache.shape[1]
    full = (block_tables >= 0).all(dim=1) & (context_lens % bs == 0)  # every block full, no padding after them
    return out + 0.25 * full[:, None, None].to(out.dtype)
""", "paged_decode", "paged_decode.full_rows_mishandled"),
    Variant("decode_lengths_differ", """
_paged_decode_ = paged_decode

def paged_decode(q, k_cache, v_cache, block_tables, context_lens):
    out = _paged_decode_(q, k_cache, v_cache, block_tables, context_lens)
    return out + 0.25 if len(set(context_lens.tolist())) > 1 else out
""", "paged_decode", "paged_decode.lengths_mixed"),
    Variant("varlen_several", """
_varlen_attention_ = varlen_attention

def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False):
    out = _varlen_attention_(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    return out + 0.25 if cu_seqlens_q.numel() > 2 else out
""", "varlen_attention", "varlen_attention.sequences_mixed"),
]
