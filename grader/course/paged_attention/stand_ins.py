"""paged_attention's stand-ins: the classes the worker builds in place of a candidate's class that lost points.

PagedSelfAttention is graded with this PagedKVCache while the candidate's PagedKVCache has lost
points, so a bug in the pool is charged to the pool alone. It does what the stub's contract
promises, nothing more. The worker loads this file by path (in its zygote, before any sandbox)
and runs it as the grader's code: none of its torch calls is recorded as the candidate's.
"""

import inspect
import types

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


class StorageProbe:
    """No stand-in but the grader's probe, built the same way: where a pool keeps its k_cache and v_cache.

    storages(cache) gives the address of the storage each lives in (None for what is no plain tensor), and keeps
    every tensor it read alive, so no later tensor can be given a freed one's address: a pool that makes new
    storage on an append (torch.cat, clone, index_put without its underscore) shows new addresses.
    """

    PROBE = True  # called by the grader's script alone, on the candidate's objects (scripts._unrecorded)

    def __init__(self):
        self.held = []

    def storages(self, cache):
        found = []
        for name in ("k_cache", "v_cache"):
            value = _stored(cache, name)
            self.held.append(value)
            found.append(value.untyped_storage().data_ptr() if type(value) is torch.Tensor else None)
        return found


OWN_GETATTRIBUTE = object.__dict__["__getattribute__"]


def _stored(obj, name):
    """The tensor `obj` keeps under `name` itself (its own attribute, a slot, or an nn.Module's buffer), never one a
    property or __getattr__ makes on the way: a grown tensor copied into one fixed buffer would look preallocated."""
    if isinstance(obj, torch.nn.Module) and name in obj._buffers:
        return obj._buffers[name]
    if inspect.getattr_static(type(obj), "__getattribute__", None) is not OWN_GETATTRIBUTE:
        return None  # its class answers every read itself: the tensor a read gets need not be the one kept (the
        # fortieth review's f03 showed grown copies to reads and a buffer never written to this look)
    try:
        found = inspect.getattr_static(obj, name)
    except AttributeError:
        return None
    if isinstance(found, types.MemberDescriptorType):  # a __slots__ entry
        return getattr(obj, name, None)
    return found if isinstance(found, torch.Tensor) else None
