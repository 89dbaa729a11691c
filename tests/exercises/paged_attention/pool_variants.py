"""paged_attention's PagedKVCache variants: the pool's mistakes, one each (variants.py adds them to BUGGY)."""

from tests.exercises.mha.variants import Variant


def append_with(body: str) -> str:
    """A PagedKVCache whose append is `body` (the reference's __init__: k_cache, v_cache, block_size, free_blocks,
    tables, lengths)."""
    return f"""
class PagedKVCache(PagedKVCache):
    def append(self, seq_id, k, v):
        table = self.tables.get(seq_id, [])
        start = self.lengths.get(seq_id, 0)
        end = start + k.shape[0]
        bs = self.block_size
{body}
"""


WRITE = """\
        for i, t in enumerate(range(start, end)):
            self.k_cache[table[t // bs], t % bs] = k[i]
            self.v_cache[table[t // bs], t % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end"""

TAKE = """\
        needed = -(-end // bs) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        table = table + [self.free_blocks.pop() for _ in range(needed)]
"""


POOL_BUGGY = [
    # -- PagedKVCache -------------------------------------------------------------------------
    Variant("pool_tables_in_the_class", """
class PagedKVCache(PagedKVCache):
    every_table, every_length = {}, {}  # made once, with the class: every pool shares them (blind set 58's b17)

    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype, device)
        self.tables, self.lengths = self.every_table, self.every_length
""", "PagedKVCache", "state_shared_between_objects"),
    Variant("pool_grown_by_cat", """
class PagedKVCache(PagedKVCache):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype, device)
        self.k_cache, self.v_cache = self.k_cache[:0], self.v_cache[:0]  # a block made when no freed one is left
        self.num_blocks, self.free_blocks = num_blocks, []

    def num_free_blocks(self):
        return len(self.free_blocks) + self.num_blocks - len(self.k_cache)

    def take(self):
        if self.free_blocks:
            return self.free_blocks.pop()
        self.k_cache = torch.cat([self.k_cache, self.k_cache.new_zeros(1, *self.k_cache.shape[1:])])
        self.v_cache = torch.cat([self.v_cache, self.v_cache.new_zeros(1, *self.v_cache.shape[1:])])
        return len(self.k_cache) - 1

    def append(self, seq_id, k, v):
        table, start = self.tables.get(seq_id, []), self.lengths.get(seq_id, 0)
        end, bs = start + k.shape[0], self.block_size
        needed = -(-end // bs) - len(table)
        if needed > self.num_free_blocks():
            raise RuntimeError("out of blocks")
        table = table + [self.take() for _ in range(needed)]
        for i, t in enumerate(range(start, end)):
            self.k_cache[table[t // bs], t % bs] = k[i]
            self.v_cache[table[t // bs], t % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end
""", "PagedKVCache", "PagedKVCache.grown_by_cat"),
    Variant("pool_added_not_written", append_with(TAKE + WRITE.replace("t % bs] = k[i]", "t % bs] += k[i]").replace(
        "t % bs] = v[i]", "t % bs] += v[i]")), "PagedKVCache", "PagedKVCache.added_not_written"),  # blind set 60's b13
    Variant("pool_values_written_from_keys", append_with(TAKE + WRITE.replace("t % bs] = v[i]", "t % bs] = k[i]")),
            "PagedKVCache", "PagedKVCache.values_written_from_keys"),  # the forty-sixth blind set's b01
    Variant("pool_storage_replaced", append_with(TAKE + """\
        where = torch.arange(start, end)
        blocks, slots = torch.tensor(table)[where // bs], where % bs
        self.k_cache = self.k_cache.index_put((blocks, slots), k)  # index_put, not index_put_: a new pool
        self.v_cache = self.v_cache.index_put((blocks, slots), v)
        self.tables[seq_id], self.lengths[seq_id] = table, end"""), "PagedKVCache", "PagedKVCache.storage_replaced"),
    Variant("pool_extra_block_at_boundary", append_with("""\
        needed = end // bs + 1 - len(table)  # one block per block_size tokens, plus the partial one
        if needed > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        table = table + [self.free_blocks.pop() for _ in range(needed)]
""" + WRITE), "PagedKVCache", "PagedKVCache.extra_block_at_boundary", situations=("PagedKVCache.tables_mishandled",)),
    Variant("pool_last_block_not_allocated", append_with("""\
        needed = end // bs - len(table)  # full blocks only
        if needed > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        table = table + [self.free_blocks.pop() for _ in range(max(needed, 0))]
""" + WRITE), "PagedKVCache", "PagedKVCache.last_block_not_allocated"),
    Variant("pool_append_written_as_one_slice", append_with(TAKE + """\
        block, offset = table[start // bs], start % bs
        self.k_cache[block, offset:offset + k.shape[0]] = k  # the whole append into the current block
        self.v_cache[block, offset:offset + k.shape[0]] = v
        self.tables[seq_id], self.lengths[seq_id] = table, end"""),
            "PagedKVCache", "PagedKVCache.append_written_as_one_slice"),
    Variant("pool_tokens_moved", append_with("""\
        if -(-end // bs) - len(table) > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        if table:  # the whole sequence moved to fresh blocks, the old ones given back
            k = torch.cat([self.k_cache[table].flatten(0, 1)[:start], k])
            v = torch.cat([self.v_cache[table].flatten(0, 1)[:start], v])
        self.free_blocks.extend(table)
        table, start = [self.free_blocks.pop(0) for _ in range(-(-end // bs))], 0
""" + WRITE), "PagedKVCache", "PagedKVCache.tokens_moved"),
    Variant("pool_slot_from_append_index", append_with(TAKE + """\
        for i, t in enumerate(range(start, end)):
            self.k_cache[table[t // bs], i % bs] = k[i]  # the slot counted within the append
            self.v_cache[table[t // bs], i % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end"""),
            "PagedKVCache", "PagedKVCache.slot_from_append_index"),
    Variant("pool_block_handed_out_twice", append_with("""\
        needed = -(-end // bs) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError("out of blocks")
        table = table + self.free_blocks[:needed]  # taken from the front ...
        del self.free_blocks[len(self.free_blocks) - needed:]  # ... removed from the end (blind set 56's b18)
""" + WRITE), "PagedKVCache", "PagedKVCache.block_handed_out_twice"),
    Variant("pool_append_wrapped_in_one_block", append_with(TAKE + """\
        block = table[start // bs]  # looked up once, for the append's first token
        for i, t in enumerate(range(start, end)):
            self.k_cache[block, t % bs] = k[i]
            self.v_cache[block, t % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end"""),
            "PagedKVCache", "PagedKVCache.append_wrapped_in_one_block"),
    Variant("pool_append_into_newest_block", append_with(TAKE + """\
        for i, t in enumerate(range(start, end)):  # after the sequence's last token: in its newest block
            self.k_cache[table[-1], t % bs] = k[i]
            self.v_cache[table[-1], t % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end"""),
            "PagedKVCache", "PagedKVCache.append_wrapped_in_one_block"),
    Variant("pool_logical_block_written", append_with(TAKE + """\
        for i, t in enumerate(range(start, end)):
            self.k_cache[t // bs, t % bs] = k[i]  # the logical block, not table[t // bs]
            self.v_cache[t // bs, t % bs] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end"""),
            "PagedKVCache", "PagedKVCache.logical_block_written"),
    Variant("pool_seq_len_counts_slots", """
class PagedKVCache(PagedKVCache):
    def seq_len(self, seq_id):
        return len(self.tables[seq_id]) * self.block_size
""", "PagedKVCache", "PagedKVCache.seq_len_counts_slots"),
    Variant("pool_out_of_blocks_not_refused", append_with("""\
        table = table + [self.free_blocks.pop() for _ in range(-(-end // bs) - len(table))]
""" + WRITE), "PagedKVCache", "PagedKVCache.out_of_blocks_not_refused"),
    Variant("pool_out_of_blocks_value_error", append_with(TAKE.replace("RuntimeError", "ValueError") + WRITE),
            "PagedKVCache", "PagedKVCache.out_of_blocks_not_refused"),
    Variant("pool_changed_before_raising", append_with("""\
        for i, t in enumerate(range(start, end)):  # a block taken as each one fills
            if t % bs == 0:
                if not self.free_blocks:
                    raise RuntimeError("out of blocks")
                table.append(self.free_blocks.pop())
                self.tables[seq_id] = table
            self.k_cache[table[t // bs], t % bs] = k[i]
            self.v_cache[table[t // bs], t % bs] = v[i]
            self.lengths[seq_id] = t + 1"""), "PagedKVCache", "PagedKVCache.changed_before_raising"),
    Variant("pool_free_keeps_blocks", """
class PagedKVCache(PagedKVCache):
    def free(self, seq_id):
        del self.tables[seq_id], self.lengths[seq_id]
""", "PagedKVCache", "PagedKVCache.free_keeps_blocks"),
    Variant("pool_exact_fit_refused", append_with(TAKE.replace("needed > len", "needed >= len") + WRITE),
            "PagedKVCache", "PagedKVCache.exact_fit_refused"),
    Variant("pool_room_in_last_block_ignored", append_with(TAKE.replace(
        "if needed > len(self.free_blocks):", "if -(-k.shape[0] // bs) > len(self.free_blocks):  # new tokens' blocks")
        + WRITE), "PagedKVCache", "PagedKVCache.room_in_last_block_ignored"),
    Variant("pool_free_compacts", """
class PagedKVCache(PagedKVCache):
    def free(self, seq_id):
        super().free(seq_id)
        for table in self.tables.values():  # compacted: each block moved down to the lowest free one (blind set 57)
            for i, block in enumerate(table):
                lowest = min(self.free_blocks, default=block)
                if lowest < block:
                    self.k_cache[lowest], self.v_cache[lowest] = self.k_cache[block], self.v_cache[block]
                    self.free_blocks.remove(lowest)
                    self.free_blocks.append(block)
                    table[i] = lowest
""", "PagedKVCache", "PagedKVCache.free_moves_tokens"),
    Variant("pool_free_keeps_table", """
class PagedKVCache(PagedKVCache):
    def free(self, seq_id):
        self.free_blocks.extend(self.tables[seq_id])  # the blocks go back, but the table stays
        del self.lengths[seq_id]
""", "PagedKVCache", "PagedKVCache.free_keeps_sequence"),
    Variant("pool_free_keeps_length", """
class PagedKVCache(PagedKVCache):
    def free(self, seq_id):
        self.free_blocks.extend(self.tables.pop(seq_id))  # the length stays: a reused id starts past its end
""", "PagedKVCache", "PagedKVCache.free_keeps_sequence"),
    Variant("pool_dtype_ignored", """
class PagedKVCache(PagedKVCache):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype, device)
        self.k_cache = torch.zeros(num_blocks, block_size, num_heads, head_dim, device=device)
        self.v_cache = torch.zeros(num_blocks, block_size, num_heads, head_dim, device=device)
""", "PagedKVCache", "PagedKVCache.dtype_ignored"),
]
