"""paged_attention's stand-ins: the classes the worker builds in place of a candidate's class that lost points.

PagedSelfAttention is graded with this PagedKVCache while the candidate's PagedKVCache has lost
points, so a bug in the pool is charged to the pool alone. It does what the stub's contract
promises, nothing more. The worker loads this file by path (in its zygote, before any sandbox)
and runs it as the grader's code: none of its torch calls is recorded as the candidate's.
"""


import torch


class PagedKVCache:
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        shape = (num_blocks, block_size, num_heads, head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size, self.free_blocks, self.tables, self.lengths = block_size, list(range(num_blocks)), {}, {}

    def append(self, seq_id, k, v):
        table, start = self.tables.get(seq_id, []), self.lengths.get(seq_id, 0)
        end = start + k.shape[0]
        needed = -(-end // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more, {len(self.free_blocks)} free")
        table = table + [self.free_blocks.pop() for _ in range(needed)]
        for i, t in enumerate(range(start, end)):
            self.k_cache[table[t // self.block_size], t % self.block_size] = k[i]
            self.v_cache[table[t // self.block_size], t % self.block_size] = v[i]
        self.tables[seq_id], self.lengths[seq_id] = table, end

    def block_table(self, seq_id):
        return list(self.tables[seq_id])

    def seq_len(self, seq_id):
        return self.lengths[seq_id]

    def num_free_blocks(self):
        return len(self.free_blocks)

    def free(self, seq_id):
        self.free_blocks.extend(self.tables.pop(seq_id))
        del self.lengths[seq_id]
