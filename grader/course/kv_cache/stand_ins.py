"""kv_cache's stand-ins: the classes the worker builds in place of a candidate's class that lost points.

A module that fills a cache is graded with this KVCache while the candidate's KVCache has lost
points, so a bug in the cache is charged to the cache alone. It does what the stub's contract
promises, nothing more. The worker loads this file by path (in its zygote, before any sandbox)
and runs it as the grader's code: none of its torch calls is recorded as the candidate's.
"""


import torch


class KVCache:
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        shape = (batch_size, num_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len, self.length = max_len, 0

    def append(self, k_new, v_new):
        t = k_new.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(f"{self.length} + {t} tokens pass max_len {self.max_len}")
        self.k[:, :, self.length : self.length + t] = k_new
        self.v[:, :, self.length : self.length + t] = v_new
        self.length += t
        return self.k[:, :, : self.length], self.v[:, :, : self.length]
