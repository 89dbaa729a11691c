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
        # its bookkeeping under names no module can guess (name-mangled): a module that reads a pool's own
        # attributes rather than its contract fails here, as with any pool but its own
        self.__block, self.__free, self.__tables, self.__lengths = block_size, list(range(num_blocks)), {}, {}

    def append(self, seq_id, k, v):
        table, start = self.__tables.get(seq_id, []), self.__lengths.get(seq_id, 0)
        end = start + k.shape[0]
        needed = -(-end // self.__block) - len(table)
        if needed > len(self.__free):
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {needed} more, {len(self.__free)} free")
        table = table + [self.__free.pop() for _ in range(needed)]
        for i, t in enumerate(range(start, end)):
            self.k_cache[table[t // self.__block], t % self.__block] = k[i]
            self.v_cache[table[t // self.__block], t % self.__block] = v[i]
        self.__tables[seq_id], self.__lengths[seq_id] = table, end

    def block_table(self, seq_id):
        return list(self.__tables[seq_id])

    def seq_len(self, seq_id):
        return self.__lengths[seq_id]

    def num_free_blocks(self):
        return len(self.__free)

    def free(self, seq_id):
        self.__free.extend(self.__tables.pop(seq_id))
        del self.__lengths[seq_id]
