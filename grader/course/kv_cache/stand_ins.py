"""kv_cache's stand-ins: the classes the worker builds in place of a candidate's class that lost points.

A module that fills a cache is graded with this KVCache while the candidate's KVCache has lost
points, so a bug in the cache is charged to the cache alone. It does what the stub's contract
promises, nothing more. The worker loads this file by path (in its zygote, before any sandbox)
and runs it as the grader's code: none of its torch calls is recorded as the candidate's.
"""

import inspect
import types

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


class BufferProbe:
    """No stand-in but the grader's probe, built the same way: where a cache keeps its buffers.

    storages(cache) gives, for the cache's k and v, the address of the storage each lives in (None for what is
    no plain tensor). It keeps every tensor it read alive, so no later tensor can be given a freed one's address:
    a cache that makes new buffers (torch.cat, or a padded copy behind a property) shows new addresses.
    """

    PROBE = True  # called by the grader's script alone, on the candidate's objects (scripts._unrecorded)

    def __init__(self):
        self.held = []

    def storages(self, cache):
        found = []
        for name in ("k", "v"):
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
