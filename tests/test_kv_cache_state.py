"""kv_cache's checks of state (issues 17 and 19), each graded on a candidate for its exact score.

- a cache made on its first append (the LLMs-from-scratch book's) or grown by torch.cat behind padding
  properties loses `preallocated` and nothing else: the grader's NaN fill tolerates a cache with no buffer
  yet, and preallocation is read from where the buffers are stored, not from what the cache says of itself;
- a module that never reads its cache (its own copy of the keys) loses `reads_cache` and nothing else;
- buffers of the wrong shape (1-D, widened) cost the cache points, and never crash a check.
"""

import importlib.util
import sys
import types

import pytest
import torch

from grader.course.kv_cache import spec
from solutions import kv_cache as ref
from tests.conftest import ROOT, explain, lost, mistakes
from tests.exercises.kv_cache.state_variants import BOOK_CACHE, KEEPS_OWN_KEYS, PADDED_CACHE

KV_REFERENCE = (ROOT / "solutions" / "kv_cache.py").read_text()


def grade_kv(grade_source, code):
    return grade_source(code, base=KV_REFERENCE, name="kv_cache.py")


def failed(result) -> set[str]:
    return {c.name for s in result.steps for c in s.checks if c.points < c.max_points}


@pytest.mark.parametrize("code, mistake", [(BOOK_CACHE, "KVCache.grown_by_cat"),
                                           (PADDED_CACHE, "KVCache.not_in_place")], ids=["book", "padded"])
def test_a_cache_grown_by_cat_loses_only_the_points_of_preallocated(grade_source, code, mistake):
    result = grade_kv(grade_source, code)
    assert lost(result) == {"KVCache": 3} and failed(result) == {"cache_preallocated"}, explain(result)
    assert mistakes(result, "KVCache") == {mistake}, explain(result)


def test_a_module_that_never_reads_its_cache_loses_reads_cache(grade_source):
    result = grade_kv(grade_source, KEEPS_OWN_KEYS)
    assert lost(result) == {"CachedSelfAttention": 4} and failed(result) == {"module_reads_cache"}, explain(result)
    assert mistakes(result, "CachedSelfAttention") == {"CachedSelfAttention.cache_not_read"}, explain(result)


FLAT = """
class KVCache(KVCache):  # one flat buffer per tensor, viewed as (B, H, max_len, Dh) only inside append
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)
        self.shape = self.k.shape
        self.k, self.v = self.k.flatten(), self.v.flatten()

    def append(self, k_new, v_new):
        k, v = self.k.view(self.shape), self.v.view(self.shape)
        t = k_new.shape[2]
        if self.length + t > self.shape[2]:
            raise ValueError("the cache is full")
        k[:, :, self.length:self.length + t], v[:, :, self.length:self.length + t] = k_new, v_new
        self.length += t
        return k[:, :, :self.length], v[:, :, :self.length]
"""

WIDENED = """
class KVCache(KVCache):  # the buffers one head width too wide: (B, H, max_len, 2 Dh), the new keys in the first half
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, 2 * head_dim, max_len, dtype, device)

    def append(self, k_new, v_new):
        t, dh = k_new.shape[2], k_new.shape[3]
        if self.length + t > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length:self.length + t, :dh], self.v[:, :, self.length:self.length + t, :dh] = k_new, v_new
        self.length += t
        return self.k[:, :, :self.length, :dh], self.v[:, :, :self.length, :dh]
"""


@pytest.mark.parametrize("code", [FLAT, WIDENED], ids=["1-D", "widened"])
def test_a_cache_whose_buffers_have_the_wrong_shape_loses_points_in_its_checks(grade_source, code):
    result = grade_kv(grade_source, code)  # a check that indexed them blindly would be a grader bug, raised here
    assert "KVCache" in lost(result) and set(lost(result)) <= {"KVCache", "CachedSelfAttention"}, explain(result)
    assert {"cache_preallocated", "cache_contents"} <= failed(result), explain(result)
    module = [c for s in result.steps if s.id == "CachedSelfAttention" for c in s.checks if c.points < c.max_points]
    assert all(c.end_to_end for c in module), explain(result)


def _worker_scripts():
    """grader/sandbox/scripts.py as the worker loads it, by path (its sibling serve.py stood in for: unused here)."""
    stand_in = "_attn_grade_sandbox_serve" not in sys.modules
    if stand_in:
        sys.modules["_attn_grade_sandbox_serve"] = types.ModuleType("_attn_grade_sandbox_serve")
    try:
        spec = importlib.util.spec_from_file_location("_scripts_under_test", ROOT / "grader" / "sandbox" / "scripts.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if stand_in:
            del sys.modules["_attn_grade_sandbox_serve"]


KEPT_SOMEWHERE_ELSE = """
class Property:
    def __init__(self):
        self._k = torch.zeros(2)
    k = property(lambda self: self._k)


class Reads:  # every read of k answered by the class
    def __init__(self):
        self.k = torch.zeros(2)

    def __getattribute__(self, name):
        return torch.ones(2) if name == "k" else object.__getattribute__(self, name)


class DictShadowed:  # the forty-first review's f01: the probe's look at the instance dict went to the class's
    k = torch.zeros(2)
    __dict__ = property(lambda self: {})

    def __init__(self):
        object.__setattr__(self, "_grown", torch.zeros(3))


class PropertyOverADecoy:  # the forty-second review's f01: a decoy in the instance dict, every read the property's
    def __init__(self):
        self.__dict__["k"] = torch.zeros(2)

    k = property(lambda self: torch.ones(2))


class ModuleBufferShadowed(torch.nn.Module):  # its f02: a buffer registered, every read finding the instance dict's
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(2))
        self.__dict__["k"] = [torch.ones(2)]


class KeyOfAStrSubclass:  # the forty-third review's f02: a lookup of k may call such a key's __eq__, which can count
    def __init__(self):  # the lookups and show each another tensor
        self.k = torch.zeros(2)
        self.__dict__[type("Key", (str,), {})("x")] = None


class ModuleAnswers(torch.nn.Module):  # a buffer kept, and every read of it answered with another tensor
    def __init__(self):
        super().__init__()
        self._buffers["k"] = torch.zeros(2)

    def __getattr__(self, name):
        return torch.ones(2) if name == "k" else super().__getattr__(name)
"""

KEPT_ITSELF = """
class Plain:
    def __init__(self):
        self.k = torch.zeros(2)


class Slotted:
    __slots__ = ("k",)

    def __init__(self):
        self.k = torch.zeros(2)


class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(2))


class ModuleAttribute(torch.nn.Module):  # a plain tensor set on a module is in its instance dict, not its buffers
    def __init__(self):
        super().__init__()
        self.k = torch.zeros(2)
"""


def test_the_workers_look_at_a_kept_tensor_finds_only_what_the_object_keeps_itself():
    """A script's `storage` action (grader/sandbox/scripts.py `_kept`): the tensor an object keeps under a name in its
    own dict, a slot or a module's buffers, and None wherever its class decides what a read gets."""
    scripts = _worker_scripts()
    for code, kept in ((KEPT_ITSELF, True), (KEPT_SOMEWHERE_ELSE, False)):
        scope = {"torch": torch}
        exec(code, scope)
        for name, cls in scope.items():
            if isinstance(cls, type) and name != "torch":
                found = scripts._kept(torch, cls(), "k")
                assert (type(found) is torch.Tensor) if kept else found is None, name


def test_the_answer_over_the_graders_values_is_what_the_reference_module_gives_over_them():
    torch.manual_seed(0)
    module = ref.CachedSelfAttention(spec.D, spec.H).double().eval()
    state = {name: p.detach() for name, p in module.state_dict().items()}
    x = torch.randn(spec.B, 7, spec.D, dtype=torch.float64)
    cache = ref.KVCache(spec.B, spec.H, spec.DH, spec.MAX_LEN, dtype=torch.float64)
    with torch.no_grad():
        module(x[:, :4], cache)
        cache.k.fill_(spec.K_FILL)
        cache.v.fill_(spec.V_FILL)
        got = torch.cat([module(x[:, 4:5], cache), module(x[:, 5:], cache)], dim=1)
    torch.testing.assert_close(got, spec._over_filled(state, x, 4))


COPIED_INTO_A_FIXED_BUFFER = """
class KVCache(KVCache):  # grows by torch.cat; its k and v are properties that copy into one fixed buffer
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        shape = (batch_size, num_heads, max_len, head_dim)
        self._grown = {n: torch.zeros((batch_size, num_heads, 0, head_dim), dtype=dtype, device=device)
                       for n in "kv"}
        self._shown = {n: torch.zeros(shape, dtype=dtype, device=device) for n in "kv"}
        self.max_len, self.length = max_len, 0

    def _view(self, name):
        self._shown[name][:, :, : self.length] = self._grown[name]
        return self._shown[name]

    k = property(lambda self: self._view("k"))
    v = property(lambda self: self._view("v"))

    def append(self, k_new, v_new):
        t = k_new.shape[2]
        if self.length + t > self.max_len:
            raise ValueError("full")
        self._grown = {"k": torch.cat([self._grown["k"], k_new], dim=2), "v": torch.cat([self._grown["v"], v_new], 2)}
        self.length += t
        return self._grown["k"], self._grown["v"]
"""


def test_buffers_a_property_makes_on_the_way_are_not_where_the_cache_keeps_them(grade_source):
    """A hostile review's cache (issue 17): the probe reads the cache's own attributes, never a property."""
    result = grade_kv(grade_source, COPIED_INTO_A_FIXED_BUFFER)
    assert "cache_preallocated" in failed(result) and result.score <= 97, explain(result)


PARAMETERS_READ_FIRST = """
class KVCache(torch.nn.Module):  # the forty-third review's f04: buffers kept as built, every read finding
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):  # _parameters'
        super().__init__()  # new copy
        shape = (batch_size, num_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device))
        self.max_len, self.length = max_len, 0

    def append(self, k_new, v_new):
        end = self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError("full")
        self._parameters["k"] = torch.cat([self.k[:, :, :self.length], k_new, self.k[:, :, end:]], dim=2)
        self._parameters["v"] = torch.cat([self.v[:, :, :self.length], v_new, self.v[:, :, end:]], dim=2)
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
"""


def test_a_buffer_every_read_passes_by_is_not_where_the_cache_keeps_its_keys(grade_source):
    """The storage action's tensor is the one a read of the name gets (nn.Module reads _parameters before _buffers)."""
    result = grade_kv(grade_source, PARAMETERS_READ_FIRST)
    assert "cache_preallocated" in failed(result) and result.score <= 97, explain(result)


SWAPPED_BEFORE_THE_LOOK = """
class PagedKVCache(PagedKVCache):  # the forty-third review's f01: a new pool each append, and the pool as built shown
    def __init__(self, *args, **kwargs):  # by the call the grader makes between its reads and its look at the storage
        super().__init__(*args, **kwargs)
        self._built, self._stash = (self.k_cache, self.v_cache), None

    def _real(self):
        if self._stash is not None:
            (self.k_cache, self.v_cache), self._stash = self._stash, None

    def append(self, seq_id, k, v):
        self._real()
        self.k_cache, self.v_cache = self.k_cache.clone(), self.v_cache.clone()
        super().append(seq_id, k, v)

    def block_table(self, seq_id):
        self._real()
        return super().block_table(seq_id)

    def seq_len(self, seq_id):
        self._real()
        return super().seq_len(seq_id)

    def num_free_blocks(self):
        if self._stash is None:
            self._stash = (self.k_cache, self.v_cache)
            self.k_cache, self.v_cache = self._built
        return super().num_free_blocks()
"""


def test_a_pool_swapped_back_between_the_reads_and_the_look_is_not_kept_in_place(grade_source):
    """The storage action's tensor is the one the last read of the name got, whatever ran in between."""
    result = grade_source(SWAPPED_BEFORE_THE_LOOK, base=(ROOT / "solutions" / "paged_attention.py").read_text(),
                          name="paged_attention.py")
    assert "pool_in_place" in failed(result), explain(result)
    assert "PagedKVCache.storage_replaced" in mistakes(result, "PagedKVCache"), explain(result)


COPIED_ALONG_AN_ARENA = """
class KVCache(KVCache):  # the forty-fourth review's f05: grown by torch.cat, then copied into the next slice of one
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):  # large storage
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)
        self._shape, self._n, self._slot = self.k.shape, self.k.numel(), 0
        self._arena = [torch.zeros(self._n * 8, dtype=dtype, device=device) for _ in "kv"]
        self.k, self.v = (arena[:self._n].view(self._shape) for arena in self._arena)

    def append(self, k_new, v_new):
        end = self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError("full")
        grown = [torch.cat([old[:, :, :self.length], new, old[:, :, end:]], dim=2)
                 for old, new in ((self.k, k_new), (self.v, v_new))]
        self._slot = (self._slot + 1) % 8
        self.k, self.v = (arena[self._slot * self._n:(self._slot + 1) * self._n].view(self._shape)
                          for arena in self._arena)
        self.k.copy_(grown[0])
        self.v.copy_(grown[1])
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]
"""


def test_a_cache_copied_along_one_large_storage_is_not_kept_in_place(grade_source):
    """Where a tensor lies is its storage's address and its offset there (its sizes and strides too)."""
    result = grade_kv(grade_source, COPIED_ALONG_AN_ARENA)
    assert "cache_preallocated" in failed(result) and result.score <= 97, explain(result)
