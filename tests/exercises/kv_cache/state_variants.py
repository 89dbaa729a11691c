"""kv_cache's variants about state (issues 17 and 19): where a cache keeps its buffers, and what a module keeps.

variants.py adds these to its BUGGY list; tests/test_kv_cache_state.py grades some of them for their exact score.
"""

from tests.exercises.mha.variants import Variant

# As in the LLMs-from-scratch book, adapted to the contract: None until the first append, then grown by torch.cat.
# It must lose the 3 points of `preallocated` and nothing else.
BOOK_CACHE = """
class KVCache:
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        self.k, self.v, self.max_len, self.length = None, None, max_len, 0

    def append(self, k_new, v_new):
        if self.length + k_new.shape[2] > self.max_len:
            raise ValueError("the cache is full")
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k, self.v = torch.cat([self.k, k_new], dim=2), torch.cat([self.v, v_new], dim=2)
        self.length = self.k.shape[2]
        return self.k, self.v
"""

# Grown by torch.cat behind properties that pad it to look preallocated: only its storage tells.
PADDED_CACHE = """
class KVCache:
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        self._k = torch.empty(batch_size, num_heads, 0, head_dim, dtype=dtype, device=device)
        self._v = torch.empty_like(self._k)
        self.max_len = max_len

    def _padded(self, x):
        room = x.new_zeros(*x.shape[:2], self.max_len - x.shape[2], x.shape[3])
        return torch.cat([x, room], dim=2)

    k = property(lambda self: self._padded(self._k))
    v = property(lambda self: self._padded(self._v))
    length = property(lambda self: self._k.shape[2])

    def append(self, k_new, v_new):
        if self.length + k_new.shape[2] > self.max_len:
            raise ValueError("the cache is full")
        self._k, self._v = torch.cat([self._k, k_new], dim=2), torch.cat([self._v, v_new], dim=2)
        return self._k, self._v
"""


def forward_attending(body: str) -> str:
    """A CachedSelfAttention whose forward projects as the reference does, runs `body` (which sets past_len, k and v),
    then attends with decode_mask(T, past_len) and merges as the reference does."""
    return f"""
class CachedSelfAttention(CachedSelfAttention):
    def forward(self, x, cache=None):
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        past_len = 0
{body}
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~decode_mask(T, past_len, device=x.device), float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))
"""


# Never reads its cache: keeps its own record of the sequence's keys and values (reset for each new cache).
KEEPS_OWN_KEYS = forward_attending("""\
        if cache is not None:
            past_len = cache.length
            if past_len == 0:  # a new sequence: start the module's own record of it
                self._keys, self._values = k[:, :, :0], v[:, :, :0]
            cache.append(k, v)  # kept up to date for whoever reads it, but never read here
            self._keys, self._values = torch.cat([self._keys, k], dim=2), torch.cat([self._values, v], dim=2)
            k, v = self._keys, self._values""")

STATE_BUGGY = [
    Variant("cache_padded_by_cat", PADDED_CACHE, "KVCache", "KVCache.not_in_place"),
    Variant("cache_made_on_first_append", BOOK_CACHE, "KVCache", "KVCache.grown_by_cat"),
    Variant("module_keeps_own_keys", KEEPS_OWN_KEYS, "CachedSelfAttention", "CachedSelfAttention.cache_not_read"),
    Variant("module_position_on_self", forward_attending("""\
        if cache is not None:
            past_len = getattr(self, "position", 0)  # the tokens decoded so far, counted on the module
            k, v = cache.append(k, v)
            self.position = past_len + T"""), "CachedSelfAttention", "CachedSelfAttention.state_across_sequences"),
    Variant("module_own_cache_without_one", """
class CachedSelfAttention(CachedSelfAttention):
    def forward(self, x, cache=None):
        if cache is None:  # generation by default: the module keeps a cache of its own between calls
            if getattr(self, "own_cache", None) is None:
                self.own_cache = KVCache(x.shape[0], self.num_heads, self.head_dim, 64, dtype=x.dtype, device=x.device)
            cache = self.own_cache
        return super().forward(x, cache)
""", "CachedSelfAttention", "state_between_calls"),
    Variant("module_output_bias_always", """
class CachedSelfAttention(CachedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias)
        self.w_o = nn.Linear(embed_dim, embed_dim)  # bias left at its default: always one
""", "CachedSelfAttention", "parameters_not_loaded"),
    Variant("module_no_bias_by_default", """
class CachedSelfAttention(CachedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=False):
        super().__init__(embed_dim, num_heads, bias)
""", "CachedSelfAttention", "constructor_defaults"),
]
