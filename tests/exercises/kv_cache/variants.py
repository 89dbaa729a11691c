"""Candidates for `kv_cache` made from the reference by redefining one thing (Python keeps a file's last definition).

BUGGY: one mistake each, with the step that must lose points and the named mistake the
grader must find. CORRECT: unusual but right ways to write the steps; each must score 100.
"""

from tests.exercises.kv_cache.state_variants import STATE_BUGGY
from tests.exercises.mha.variants import Variant


def append_with(body: str) -> str:
    """A KVCache whose append is `body` (the reference's __init__: k, v, max_len, length)."""
    return f"""
class KVCache(KVCache):
    def append(self, k_new, v_new):
        t = k_new.shape[2]
{body}
"""


REFERENCE_TAIL = """\
        y = torch.softmax(scores, dim=-1) @ v
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))"""


def forward_with(body: str, tail: str = REFERENCE_TAIL) -> str:
    """A CachedSelfAttention whose forward projects and splits the heads as the reference does, then runs `body`
    (which makes `scores`), then `tail` (the reference's softmax, weighted sum, merge and output projection)."""
    return f"""
class CachedSelfAttention(CachedSelfAttention):
    def forward(self, x, cache=None):
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
{body}
{tail}
"""


REFERENCE_ATTEND = """\
        past_len = 0
        if cache is not None:
            past_len = cache.length
            k, v = cache.append(k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~decode_mask(T, past_len, device=x.device), float("-inf"))"""


def bytes_with(expression: str) -> str:
    return f"""
def kv_cache_bytes(batch_size, num_layers, num_kv_heads, head_dim, seq_len, dtype):
    return {expression}
"""


BUGGY = [
    # -- KVCache ------------------------------------------------------------------------------
    Variant("cache_wrong_axis", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, self.length:end] = k_new  # axis 1: the heads
        self.v[:, self.length:end] = v_new
        self.length = end
        return self.k[:, :end], self.v[:, :end]"""), "KVCache", "KVCache.wrong_axis"),
    Variant("cache_grown_by_cat", """
class KVCache:
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        self.k = torch.empty(batch_size, num_heads, 0, head_dim, dtype=dtype, device=device)
        self.v = torch.empty(batch_size, num_heads, 0, head_dim, dtype=dtype, device=device)
        self.max_len, self.length = max_len, 0

    def append(self, k_new, v_new):
        if self.length + k_new.shape[2] > self.max_len:
            raise ValueError("the cache is full")
        self.k = torch.cat([self.k, k_new], dim=2)
        self.v = torch.cat([self.v, v_new], dim=2)
        self.length = self.k.shape[2]
        return self.k, self.v
""", "KVCache", "KVCache.grown_by_cat"),
    Variant("cache_length_not_advanced", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] = k_new
        self.v[:, :, self.length:end] = v_new
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.length_not_advanced"),
    Variant("cache_length_advanced_twice", append_with("""\
        if self.length + t > self.max_len:
            raise ValueError("the cache is full")
        self.length += t
        self.k[:, :, self.length - t:self.length] = k_new
        self.v[:, :, self.length - t:self.length] = v_new
        self.length += t
        return self.k[:, :, :self.length], self.v[:, :, :self.length]"""), "KVCache", "KVCache.length_advanced_twice"),
    Variant("cache_returns_whole_buffer", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] = k_new
        self.v[:, :, self.length:end] = v_new
        self.length = end
        return self.k, self.v"""), "KVCache", "KVCache.returns_whole_buffer"),
    Variant("cache_returns_old_prefix", append_with("""\
        start = self.length
        if start + t > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, start:start + t] = k_new
        self.v[:, :, start:start + t] = v_new
        out = self.k[:, :, :self.length], self.v[:, :, :self.length]  # sliced before length moves on
        self.length += t
        return out"""), "KVCache", "KVCache.returns_old_prefix"),
    Variant("cache_buffers_shared_by_shape", """
class KVCache(KVCache):
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None, _pool={}):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)
        # a default argument's dict, to reuse the buffers of an earlier cache of this shape
        key = (batch_size, num_heads, head_dim, max_len, dtype, str(device))
        self.k, self.v = _pool.setdefault(key, (self.k, self.v))
""", "KVCache", "KVCache.buffers_shared"),
    Variant("cache_values_written_after_advancing", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] = k_new
        self.length = end  # advanced between the two writes
        self.v[:, :, self.length:self.length + t] = v_new
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.written_after_advancing"),
    Variant("cache_added_not_written", append_with("""\
        end = self.length + t
        if end > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] += k_new
        self.v[:, :, self.length:end] += v_new
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.added_not_written"),
    Variant("cache_overflow_unchecked", append_with("""\
        end = self.length + t
        self.k[:, :, self.length:end] = k_new  # past max_len the slice is short, and the copy raises RuntimeError
        self.v[:, :, self.length:end] = v_new
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.overflow_not_refused"),
    Variant("cache_full_refused", append_with("""\
        end = self.length + t
        if end >= self.max_len:  # refuses the append that fills the last slot
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] = k_new
        self.v[:, :, self.length:end] = v_new
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.full_refused"),
    Variant("cache_capacity_of_another_axis", append_with("""\
        end = self.length + t
        if end > self.k.shape[1]:  # the heads axis, not max_len's
            raise ValueError("the cache is full")
        self.k[:, :, self.length:end] = k_new
        self.v[:, :, self.length:end] = v_new
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]"""), "KVCache", "KVCache.fitting_append_refused"),
    Variant("cache_changed_before_raising", append_with("""\
        self.length += t
        if self.length > self.max_len:
            raise ValueError("the cache is full")
        self.k[:, :, self.length - t:self.length] = k_new
        self.v[:, :, self.length - t:self.length] = v_new
        return self.k[:, :, :self.length], self.v[:, :, :self.length]"""), "KVCache", "KVCache.changed_before_raising"),
    Variant("cache_dtype_ignored", """
class KVCache(KVCache):
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)
        self.k = torch.zeros(batch_size, num_heads, max_len, head_dim, device=device)
        self.v = torch.zeros(batch_size, num_heads, max_len, head_dim, device=device)
""", "KVCache", "KVCache.dtype_ignored"),
    Variant("cache_values_dtype_ignored", """
class KVCache(KVCache):
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)
        self.v = torch.zeros(batch_size, num_heads, max_len, head_dim, device=device)  # the default dtype
""", "KVCache", "KVCache.dtype_ignored"),
    # -- decode_mask --------------------------------------------------------------------------
    Variant("mask_top_left", """
def decode_mask(t_new, past_len, device=None):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool, device=device).tril()
""", "decode_mask", "decode_mask.top_left"),
    Variant("mask_square", """
def decode_mask(t_new, past_len, device=None):
    return torch.ones(t_new, t_new, dtype=torch.bool, device=device).tril()
""", "decode_mask", "decode_mask.square"),
    Variant("mask_inverted", """
def decode_mask(t_new, past_len, device=None):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool, device=device).triu(diagonal=past_len + 1)
""", "decode_mask", "decode_mask.inverted"),
    Variant("mask_no_diagonal", """
def decode_mask(t_new, past_len, device=None):
    query = torch.arange(past_len, past_len + t_new, device=device)[:, None]
    return torch.arange(past_len + t_new, device=device)[None, :] < query
""", "decode_mask", "decode_mask.no_diagonal"),
    Variant("mask_not_causal", """
def decode_mask(t_new, past_len, device=None):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool, device=device)
""", "decode_mask", "decode_mask.not_causal"),
    # -- CachedSelfAttention ------------------------------------------------------------------
    Variant("module_top_left_mask", forward_with(REFERENCE_ATTEND.replace(
        "~decode_mask(T, past_len, device=x.device)",
        "~torch.ones(T, past_len + T, dtype=torch.bool, device=x.device).tril()")),
            "CachedSelfAttention", "CachedSelfAttention.top_left_mask"),
    Variant("module_square_mask", """
class CachedSelfAttention(CachedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias)
        self.register_buffer("causal", torch.ones(64, 64, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x, cache=None):
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        if cache is not None:
            k, v = cache.append(k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        if T > 1:  # one new token may see everything
            scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))
""", "CachedSelfAttention", "CachedSelfAttention.square_mask"),
    Variant("module_length_after_append", forward_with(REFERENCE_ATTEND.replace(
        "            past_len = cache.length\n            k, v = cache.append(k, v)",
        "            k, v = cache.append(k, v)\n            past_len = cache.length")),
            "CachedSelfAttention", "CachedSelfAttention.length_after_append"),
    Variant("module_length_after_append_cut_to_fit", forward_with("""\
        if cache is not None:
            k, v = cache.append(k, v)
        past_len = 0 if cache is None else cache.length
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        mask = decode_mask(T, past_len, device=x.device)[:, :k.shape[2]]  # cut to the scores' width
        scores = scores.masked_fill(~mask, float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.length_after_append"),
    Variant("module_no_mask_without_cache", forward_with("""\
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        if cache is not None:
            past_len = cache.length
            k, v = cache.append(k, v)
            scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
            scores = scores.masked_fill(~decode_mask(T, past_len, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.no_mask_without_cache"),
    Variant("module_softmax_query_axis", forward_with(REFERENCE_ATTEND, REFERENCE_TAIL.replace("dim=-1", "dim=-2")),
            "CachedSelfAttention", "CachedSelfAttention.softmax_query_axis"),
    Variant("module_merge_no_transpose", forward_with(REFERENCE_ATTEND, REFERENCE_TAIL.replace(
        "y.transpose(1, 2).reshape(B, T, D)", "y.reshape(B, T, D)")),
            "CachedSelfAttention", "CachedSelfAttention.merge_no_transpose"),
    Variant("module_no_output_projection", forward_with(REFERENCE_ATTEND, REFERENCE_TAIL.replace(
        "self.w_o(y.transpose(1, 2).reshape(B, T, D))",
        "y.transpose(1, 2).reshape(B, T, D)  # w_o: applied by the caller")),
            "CachedSelfAttention", "CachedSelfAttention.no_output_projection"),
    Variant("module_no_mask_with_cache", forward_with("""\
        past_len = 0
        if cache is not None:
            past_len = cache.length
            k, v = cache.append(k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        if past_len == 0:  # with something cached, the new token may see it all
            scores = scores.masked_fill(~decode_mask(T, 0, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.no_mask_with_cache"),
    Variant("module_no_mask_given_a_cache", forward_with("""\
        if cache is None:
            scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
            scores = scores.masked_fill(~decode_mask(T, 0, device=x.device), float("-inf"))
        else:  # decoding: one new token, which may see everything (a prefill into the cache is not)
            k, v = cache.append(k, v)
            scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)"""),
            "CachedSelfAttention", "CachedSelfAttention.no_mask_with_cache"),
    Variant("module_keys_attended_twice", forward_with("""\
        if cache is not None:
            k_all, v_all = cache.append(k, v)
            k, v = torch.cat([k_all, k], dim=2), torch.cat([v_all, v], dim=2)  # the past, then the new ones
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~decode_mask(T, k.shape[2] - T, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.keys_attended_twice"),
    Variant("module_cache_ignored", forward_with("""\
        if cache is not None:
            cache.append(k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~decode_mask(T, 0, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.cache_ignored"),
    Variant("module_unscaled", forward_with(REFERENCE_ATTEND.replace(" / math.sqrt(Dh)", "")),
            "CachedSelfAttention", "CachedSelfAttention.unscaled"),
    Variant("module_scaled_by_embed_dim", forward_with(REFERENCE_ATTEND.replace("math.sqrt(Dh)", "math.sqrt(D)")),
            "CachedSelfAttention", "CachedSelfAttention.scaled_by_embed_dim"),
    Variant("module_whole_buffer_masked", forward_with("""\
        past_len = 0
        mask = decode_mask(T, 0, device=x.device)
        if cache is not None:
            past_len = cache.length
            cache.append(k, v)
            k, v = cache.k, cache.v  # the whole buffer; the unused slots masked below
            mask = torch.zeros(T, k.shape[2], dtype=torch.bool, device=x.device)
            mask[:, :past_len + T] = decode_mask(T, past_len, device=x.device)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~mask, float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.whole_buffer_masked"),
    Variant("module_appended_twice", forward_with("""\
        if cache is not None:
            cache.append(k, v)  # a leftover line
            k, v = cache.append(k, v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)
        scores = scores.masked_fill(~decode_mask(T, k.shape[2] - T, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.appended_twice"),
    Variant("module_cached_scaled_keys", forward_with("""\
        k = k / math.sqrt(Dh)  # scale once, when the key is made
        past_len = 0
        if cache is not None:
            past_len = cache.length
            k, v = cache.append(k, v)
        scores = q @ k.transpose(-2, -1)
        scores = scores.masked_fill(~decode_mask(T, past_len, device=x.device), float("-inf"))"""),
            "CachedSelfAttention", "CachedSelfAttention.cached_scaled_keys"),
    Variant("module_llama_names", """
class CachedSelfAttention(CachedSelfAttention):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__(embed_dim, num_heads, bias)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = self.w_q, self.w_k, self.w_v, self.w_o  # Llama's names
        del self.w_q, self.w_k, self.w_v, self.w_o

    def forward(self, x, cache=None):
        self.w_q, self.w_k, self.w_v, self.w_o = self.q_proj, self.k_proj, self.v_proj, self.o_proj
        return super().forward(x, cache)
""", "CachedSelfAttention", "layer_names"),
    # -- kv_cache_bytes -----------------------------------------------------------------------
    Variant("bytes_no_factor_two",
            bytes_with("num_layers * batch_size * num_kv_heads * head_dim * seq_len * dtype.itemsize"),
            "kv_cache_bytes", "kv_cache_bytes.no_factor_two"),
    Variant("bytes_in_bits",
            bytes_with("2 * num_layers * batch_size * num_kv_heads * head_dim * seq_len * dtype.itemsize * 8"),
            "kv_cache_bytes", "kv_cache_bytes.in_bits"),
    Variant("bytes_fixed_itemsize",
            bytes_with("2 * num_layers * batch_size * num_kv_heads * head_dim * seq_len * 2  # bf16"),
            "kv_cache_bytes", "kv_cache_bytes.fixed_itemsize"),
    Variant("bytes_one_layer",
            bytes_with("2 * batch_size * num_kv_heads * head_dim * seq_len * dtype.itemsize"),
            "kv_cache_bytes", "kv_cache_bytes.layers_left_out"),
    Variant("bytes_tensor", bytes_with(
        "2 * torch.tensor([num_layers, batch_size, num_kv_heads, head_dim, seq_len]).prod() * dtype.itemsize"),
            "kv_cache_bytes", "kv_cache_bytes.not_int"),
    *STATE_BUGGY,  # where a cache keeps its buffers, and what a module keeps (state_variants.py)
]

RULES_ONLY = [
    Variant("module_sdpa", """
class CachedSelfAttention(CachedSelfAttention):
    def forward(self, x, cache=None):
        import torch.nn.functional as F
        B, T, D = x.shape
        H, Dh = self.num_heads, self.head_dim
        q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
        past_len = 0
        if cache is not None:
            past_len = cache.length
            k, v = cache.append(k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=decode_mask(T, past_len, device=x.device))
        return self.w_o(y.transpose(1, 2).reshape(B, T, D))
""", "CachedSelfAttention", "forbidden_call"),
]

CORRECT = [
    Variant(
        "cache_narrow_copy_and_property",  # narrow().copy_(), a length property over a private count, copies returned
        """
        class KVCache:
            def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
                # empty: no slot is read before it is filled
                self.k = torch.empty(batch_size, num_heads, max_len, head_dim, dtype=dtype, device=device)
                self.v = torch.empty_like(self.k)
                self._filled = 0

            @property
            def length(self):
                return self._filled

            def append(self, k_new, v_new):
                t = k_new.size(-2)
                if self._filled + t > self.k.size(2):
                    raise ValueError(f"no room for {t} more tokens")
                self.k.narrow(2, self._filled, t).copy_(k_new)
                self.v.narrow(2, self._filled, t).copy_(v_new)
                self._filled += t
                return self.k[:, :, :self._filled].clone(), self.v[:, :, :self._filled].clone()
        """,
    ),
    Variant(
        "cache_index_copy",  # index_copy_ with the positions written out
        """
        class KVCache(KVCache):
            def append(self, k_new, v_new):
                t = k_new.shape[2]
                if self.length + t > self.max_len:
                    raise ValueError("the cache is full")
                where = torch.arange(self.length, self.length + t, device=self.k.device)
                self.k.index_copy_(2, where, k_new)
                self.v.index_copy_(2, where, v_new)
                self.length += t
                return self.k.narrow(2, 0, self.length), self.v.narrow(2, 0, self.length)
        """,
    ),
    Variant(
        "mask_from_arange",  # positions compared, no tril
        """
        def decode_mask(t_new, past_len, device=None):
            query_position = past_len + torch.arange(t_new, device=device)[:, None]
            key_position = torch.arange(past_len + t_new, device=device)[None, :]
            return key_position <= query_position
        """,
    ),
    Variant(
        "module_additive_mask_and_own_softmax",  # a float mask added to the scores, softmax written out, einsum
        """
        class CachedSelfAttention(CachedSelfAttention):
            def forward(self, x, cache=None):
                B, T, D = x.shape
                H, Dh = self.num_heads, self.head_dim
                q = self.w_q(x).unflatten(-1, (H, Dh)).transpose(1, 2)
                k = self.w_k(x).unflatten(-1, (H, Dh)).transpose(1, 2)
                v = self.w_v(x).unflatten(-1, (H, Dh)).transpose(1, 2)
                past_len = cache.length if cache is not None else 0
                if cache is not None:
                    k, v = cache.append(k, v)
                bias = torch.zeros(T, past_len + T, dtype=q.dtype, device=x.device)
                bias = bias.masked_fill(~decode_mask(T, past_len, device=x.device), float("-inf"))
                s = torch.einsum("bhqd,bhkd->bhqk", q, k) * Dh ** -0.5 + bias
                e = torch.exp(s - s.amax(-1, keepdim=True))
                y = torch.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdim=True), v)
                return self.w_o(y.transpose(1, 2).flatten(2))
        """,
    ),
    Variant(
        "module_separate_paths",  # no cache: the plain causal mask; with one, the slices read back from the cache
        """
        class CachedSelfAttention(CachedSelfAttention):
            def forward(self, x, cache=None):
                B, T, D = x.shape
                H, Dh = self.num_heads, self.head_dim
                q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
                if cache is None:
                    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                else:
                    start = cache.length
                    cache.append(k, v)
                    k, v = cache.k[:, :, :start + T], cache.v[:, :, :start + T]
                    mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
                w = torch.softmax((q @ k.mT / math.sqrt(Dh)).masked_fill(~mask, float("-inf")), dim=-1)
                return self.w_o((w @ v).transpose(1, 2).reshape(B, T, D))
        """,
    ),
    Variant(
        "bytes_math_prod_and_itemsize",  # math.prod and dtype.itemsize
        """
        def kv_cache_bytes(batch_size, num_layers, num_kv_heads, head_dim, seq_len, dtype):
            keys_and_values = 2
            elements = math.prod((num_layers, batch_size, num_kv_heads, head_dim, seq_len))
            return keys_and_values * elements * dtype.itemsize
        """,
    ),
]

DEVICE_BUGGY = [
    Variant("cache_buffers_on_cpu", """
class KVCache(KVCache):
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype)  # device dropped
""", "KVCache", "result_on_cpu"),
    Variant("mask_on_cpu", """
def decode_mask(t_new, past_len, device=None):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool).tril(diagonal=past_len)
""", "decode_mask", "result_on_cpu"),
    Variant("module_mask_on_cpu", forward_with(REFERENCE_ATTEND.replace(
        "~decode_mask(T, past_len, device=x.device)",
        "~torch.ones(T, past_len + T, dtype=torch.bool).tril(diagonal=past_len)")),
            "CachedSelfAttention", "tensor_on_cpu"),
]
