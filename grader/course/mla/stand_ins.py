"""mla's stand-ins: the classes the worker builds in place of a candidate's class that lost points.

The module is graded with this LatentCache while the candidate's LatentCache has lost points,
so a bug in the cache is charged to the cache alone. It does what the stub's contract promises,
nothing more. The worker loads this file by path and runs it as the grader's code.
"""

import torch


class LatentCache:
    def __init__(self, batch_size, max_len, kv_lora_rank, qk_rope_head_dim, dtype=torch.float32, device=None):
        self.c_kv = torch.zeros(batch_size, max_len, kv_lora_rank, dtype=dtype, device=device)
        self.k_rope = torch.zeros(batch_size, max_len, qk_rope_head_dim, dtype=dtype, device=device)
        self.max_len, self.length = max_len, 0

    def append(self, c_kv_new, k_rope_new):
        t = c_kv_new.shape[1]
        if self.length + t > self.max_len:
            raise ValueError(f"{self.length} + {t} tokens pass max_len {self.max_len}")
        self.c_kv[:, self.length : self.length + t] = c_kv_new
        self.k_rope[:, self.length : self.length + t] = k_rope_new
        self.length += t
        return self.c_kv[:, : self.length], self.k_rope[:, : self.length]
