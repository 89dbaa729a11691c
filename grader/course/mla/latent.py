"""mla's stateful steps: the latent cache and the module that decodes with it, checked with scripts.

A cache script builds the candidate's LatentCache in one worker, appends chunk after chunk,
and reads what it holds after each append; its record (CacheScript) is the answer its
mistakes' tests read. A module script builds the module with the grader's weights and feeds
it a sequence in chunks with a cache; the outputs are compared with one causal call over the
whole sequence, and its mistakes' wrong answers come from `latent_attention` given the same
splits. The module is graded on its own wiring: while LatentCache has lost points it runs with
the stand-in (stand_ins.py beside this file), and while a function step has lost points the
grader answers its calls; only its end-to-end check runs the candidate's own.
"""

import math
from dataclasses import replace
from typing import NamedTuple

import torch

from grader.engine import (
    ALWAYS,
    ON_META,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Raises,
    Run,
    Script,
    StepSpec,
    chunks,
    exactly,
    expect_chunks,
    expect_close,
    expect_each,
    expect_form,
    expect_joined,
    expect_result,
    expect_seen,
    linear_layers,
    prop,
    source_of,
    type_name,
    upcast,
    values,
)
from solutions import mla as ref

FLOATS = (torch.float32, torch.float64)
B, H, R, DN, DR, DV, D = 2, 3, 8, 4, 6, 5, 16  # batch, heads, kv_lora_rank, qk_nope, qk_rope, v widths, model width
INIT = (D, H, R, DN, DR, DV)
MAX_LEN = 16  # the cache's room: more than twice the tokens any check appends
LONG = 264  # the room of the one check of positions past 256
CHUNKS = (4, 1, 2)  # tokens per append: a prefill of 4, then 1, then 2
APPEND = ("c_kv_new", "k_rope_new")  # append's arguments, as messages name them
BUFFERS = ("c_kv", "k_rope")
X = ("x",)


def bottom_right(t_new: int, t_all: int) -> torch.Tensor:
    """Bool (t_new, t_all): the new tokens are the last t_new of t_all positions; each sees the keys up to itself."""
    return torch.ones(t_new, t_all, dtype=torch.bool).tril(diagonal=t_all - t_new)


def _shape(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type_name(value)


def _pair(value, what: str):
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    raise CheckFailed(f"{what} returned {type_name(value)}; expected a tuple (c_kv, k_rope)")


# -- LatentCache --------------------------------------------------------------------------


def cache_inputs(gen, dtype, chunks=CHUNKS):
    """Each append's latents (B, T, R), about +1, and RoPE keys (B, T, Dr), about −1."""
    cs = [torch.as_tensor(gen.randn(B, t, R, dtype=dtype)) * 0.1 + 1 for t in chunks]
    ks = [torch.as_tensor(gen.randn(B, t, DR, dtype=dtype)) * 0.1 - 1 for t in chunks]
    return Call((cs, ks), names=APPEND)


class Append(NamedTuple):
    index: int
    returned: object  # append's answer
    length: object  # then read: length, c_kv, k_rope
    c_kv: object
    k_rope: object
    latents: torch.Tensor  # every latent appended so far, (B, length, R)
    keys: torch.Tensor
    expected_length: int


class CacheScript:
    """A cache built (its unused slots NaN if `nan`), then for each chunk: append, read length, c_kv and k_rope; and
    where c_kv and k_rope are stored, once built and after each append (a script's `storage` action).

    With `twin`, a second cache of the same shape is built beside it and given other latents right after each of the
    first's appends, before the first is read: two caches alive at once (two layers, two sequences) hold their own.
    """

    def __init__(self, run: Run, dtype=torch.float32, device: str = "cpu", nan: bool = False, twin: bool = False):
        self.dtype, self.nan = dtype, nan
        self.call = run.inputs(dtype=dtype)
        self.cs, self.ks = self.call.args
        script = Script()
        on = {"device": device} if device != "cpu" else {}
        cache = script.build("LatentCache", B, MAX_LEN, R, DR, dtype=dtype, **on)
        other = script.build("LatentCache", B, MAX_LEN, R, DR, dtype=dtype, **on) if twin else None
        if nan:
            script.fill(cache, ("c_kv", "k_rope"), axis=1, start="length")
        self.start = len(script.actions)
        for name in ("c_kv", "k_rope", "length"):
            script.get(cache, name)
        self.storages, self.rows = [script.storage(cache, BUFFERS)], []  # rows: each append's, then its reads'
        for c, k in zip(self.cs, self.ks, strict=True):
            row = script.call(cache, "append", c, k, names=APPEND)
            if twin:
                script.call(other, "append", -c, -k, names=APPEND)
            self.rows.append((row, *(script.get(cache, name) for name in ("length", "c_kv", "k_rope"))))
            self.storages.append(script.storage(cache, BUFFERS))
        self.twin = script.storage(other, BUFFERS) if twin else None
        self.results = run.script(script, device=device).value

    @property
    def initial(self):
        return self.results[self.start:self.start + 3]  # c_kv, k_rope, length

    def appends(self):
        for i, row in enumerate(self.rows):
            returned, length, c_kv, k_rope = (self.results[at] for at in row)
            latents, keys = torch.cat(self.cs[:i + 1], dim=1), torch.cat(self.ks[:i + 1], dim=1)
            yield Append(i, returned, length, c_kv, k_rope, latents, keys, latents.shape[1])


def _cache_check(look, **options):
    def check(run: Run) -> None:
        script = CacheScript(run, **options)
        expect_each(run, script, script.call, look, prefix="with NaN in the unused slots: " if script.nan else "")

    return check


def preallocated(script: CacheScript) -> None:
    c_kv, k_rope, length = script.initial
    for name, buffer, width in (("c_kv", c_kv, R), ("k_rope", k_rope, DR)):
        try:
            expect_form(buffer, torch.empty(B, MAX_LEN, width, dtype=script.dtype))
        except CheckFailed as failure:
            ignored = _dtype_ignored(script)
            raise CheckFailed(f"LatentCache({B}, max_len={MAX_LEN}, {R}, {DR}).{name}, just built: {failure.message}; "
                              f"preallocate (B, max_len, {'kv_lora_rank' if width == R else 'qk_rope_head_dim'}), no "
                              "head axis", DTYPE_IGNORED if ignored else None) from None
    if not exactly(length, 0):
        raise CheckFailed(f"a new cache's length is {length!r}; expected 0")
    for a in script.appends():
        if _shape(a.c_kv) != (B, MAX_LEN, R):
            raise CheckFailed(f"after append {a.index + 1}, c_kv is {_shape(a.c_kv)}: the buffer must stay "
                              f"(B, max_len, R) = {(B, MAX_LEN, R)}, written in place")
    # the same storages after every append: a copy padded back to max_len keeps the shape (the forty-first review's f04)
    first = script.results[script.storages[0]]
    for number, at in enumerate(script.storages[1:], 1):
        if not isinstance(first, list) or None in first or script.results[at] != first:
            raise CheckFailed(f"after append {number}, c_kv or k_rope is not the tensor the cache was built with "
                              "(a new one, or none it keeps itself): preallocate both once and write each append "
                              "in place", NOT_IN_PLACE)


def appends(script: CacheScript, where: str = "") -> None:
    for a in script.appends():
        c_kv, k_rope = _pair(a.returned, f"append {a.index + 1}")
        on = f"on {where}, " if where else ""
        expect_result(f"{on}append {a.index + 1} (after {a.expected_length} tokens in all) returned c_kv", c_kv,
                      a.latents, where or "cpu")
        expect_result(f"{on}append {a.index + 1} returned k_rope", k_rope, a.keys, where or "cpu")


def contents(script: CacheScript) -> None:
    for a in script.appends():
        n = a.expected_length
        if type(a.length) is not int or a.length != n:
            raise CheckFailed(f"after appends of {', '.join(map(str, CHUNKS[:a.index + 1]))} tokens, length is "
                              f"{a.length!r}; expected {n}")
        for name, buffer, want in (("c_kv", a.c_kv, a.latents), ("k_rope", a.k_rope, a.keys)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 3 or buffer.shape[1] < n:
                raise CheckFailed(f"after append {a.index + 1}, the cache's {name} is {_shape(buffer)}; expected "
                                  f"(B, max_len, width) holding {n} positions")
            expect_result(f"after append {a.index + 1}, the cache's {name}[:, :{n}]", buffer[:, :n], want)


def overflow_refused(run: Run) -> None:
    """A cache of max_len 6 holding 4 tokens is offered 3 more: ValueError, and the cache as it was; then 2 more,
    which fill it exactly, are taken."""
    (c1, c2, c3), (k1, k2, k3) = run.inputs(chunks=(4, 3, 2)).args
    script = Script()
    cache = script.build("LatentCache", B, 6, R, DR)
    script.call(cache, "append", c1, k1, names=APPEND)
    script.call(cache, "append", c2, k2, names=APPEND, may_raise=True)
    script.get(cache, "length")
    script.get(cache, "c_kv")
    script.call(cache, "append", c3, k3, names=APPEND, may_raise=True)
    script.get(cache, "length")
    _, _, error, length, c_kv, filled, full_length = run.script(script).value
    if getattr(error, "type", None) != "ValueError":
        got = f"raised {error.message}" if hasattr(error, "message") and hasattr(error, "type") else "took them"
        raise CheckFailed(f"a cache of max_len 6 holding 4 tokens was offered 3 more and {got}: check length + T > "
                          "max_len first and raise ValueError", OVERFLOW_NOT_REFUSED)
    if not exactly(length, 4):
        raise CheckFailed(f"after the refused append its length is {length!r}; expected 4, as before it: check first, "
                          "then write, then advance", CHANGED_BEFORE_RAISING)
    try:
        # sliced only where it is (B, max_len, R): a buffer of fewer axes is a wrong answer, not the grader's fault
        # (the fortieth review's f01)
        kept = c_kv[:, :4] if isinstance(c_kv, torch.Tensor) and c_kv.dim() == 3 else c_kv
        expect_result("c_kv[:, :4] after the refused append", kept, c1)
    except CheckFailed as failure:
        raise CheckFailed(failure.message, CHANGED_BEFORE_RAISING) from None
    if isinstance(filled, CandidateError) or not exactly(full_length, 6):
        got = f"raised {filled.message}" if isinstance(filled, CandidateError) else f"its length is {full_length!r}"
        raise CheckFailed(f"a cache of max_len 6 holding 4 tokens was offered 2 more, which fill it exactly, and "
                          f"{got}; expected length 6", EXACT_FILL_REFUSED)


def half(run: Run) -> None:
    script = CacheScript(run, dtype=torch.float16)
    expect_each(run, script, script.call, preallocated, appends, prefix="in float16: ")


def cache_on_device(run: Run) -> None:
    placed(run, run.ctx.device)  # before any append: one onto a buffer left behind may not run on the meta device
    script = CacheScript(run, device=run.ctx.device)
    expect_each(run, script, script.call, lambda seen: appends(seen, run.ctx.device))


def placed(run: Run, where: str) -> None:
    """The buffers, just built on `where`, are there."""
    script = Script()
    cache = script.build("LatentCache", B, MAX_LEN, R, DR, device=where)
    for name in ("c_kv", "k_rope"):
        script.get(cache, name)
    buffers = run.script(script, device=where).value[1:]
    for name, buffer in zip(("c_kv", "k_rope"), buffers, strict=True):
        if isinstance(buffer, torch.Tensor) and buffer.device.type != torch.device(where).type:
            raise CheckFailed(f"LatentCache(..., device={where!r}).{name}, just built, is on {buffer.device.type}: "
                              "make the buffers with device=device", DEVICE_IGNORED)


def _grown(seen: CacheScript, *_) -> bool:
    return any(_shape(c)[1:2] != (MAX_LEN,) for c in (seen.initial[0], *(a.c_kv for a in seen.appends())))


def _dtype_ignored(seen: CacheScript, *_) -> bool:
    buffers = [x for x in seen.initial[:2] if isinstance(x, torch.Tensor)]
    return seen.dtype != torch.float32 and any(x.dtype == torch.float32 for x in buffers)


def _shared(seen: CacheScript, *_) -> bool:
    """Whether the twin cache's buffers lie in the first's storages."""
    if seen.twin is None:
        return False
    first, twin = seen.results[seen.storages[-1]], seen.results[seen.twin]
    addresses = [{w[0] for w in where if w is not None} for where in (first, twin) if isinstance(where, list)]
    return len(addresses) == 2 and bool(addresses[0] & addresses[1])


def _written_after_advancing(seen: CacheScript, *_) -> bool:
    """Whether a buffer holds an append's new values one append's length late, at [end, end + T): written after
    length was advanced (blind set 62's b11)."""
    for a in seen.appends():
        t, end = CHUNKS[a.index], a.expected_length
        for buffer, want in ((a.c_kv, a.latents), (a.k_rope, a.keys)):
            if isinstance(buffer, torch.Tensor) and buffer.dim() == 3 and buffer.shape[1] >= end + t:
                late, new = buffer[:, end:end + t].double(), want[:, end - t:end].double()
                if late.shape == new.shape and torch.allclose(late, new, rtol=1e-3, atol=1e-3):
                    return True
    return False


def _nan_written(seen: CacheScript, *_) -> bool:
    found = [x[:, :a.expected_length] for a in seen.appends() for x in (a.c_kv, a.k_rope)
             if isinstance(x, torch.Tensor) and x.dim() == 3]
    return seen.nan and any(bool(torch.isnan(x).any()) for x in found)


DTYPE_IGNORED = Mistake(
    "LatentCache.dtype_ignored", "a buffer was made in float32 whatever dtype was asked for: "
    "torch.zeros(..., dtype=dtype, device=device)", test=_dtype_ignored,
    why="torch.zeros without dtype= is float32; a float16 or bfloat16 model's cache then takes twice the memory MLA "
        "saves, and its appends are cast.")
DEVICE_IGNORED = Mistake(
    "LatentCache.device_ignored", "a buffer was made on the CPU whatever device was asked for: "
    "torch.zeros(..., dtype=dtype, device=device)",
    why="The module runs where its weights are; a cache left on the CPU is copied to and fro at every step.")
OVERFLOW_NOT_REFUSED = Mistake(
    "LatentCache.overflow_not_refused", "an append past max_len was not refused with ValueError: check "
    "length + T > max_len first and raise ValueError")
CHANGED_BEFORE_RAISING = Mistake(
    "LatentCache.changed_before_raising", "the refused append changed the cache (length advanced or slots written) "
    "before raising: check length + T > max_len first, then write, then advance",
    why="A caller that catches the error (to evict, or to stop decoding) must find the cache as it was.")
EXACT_FILL_REFUSED = Mistake(
    "LatentCache.exact_fill_refused", "an append that fills the cache exactly was refused: raise only when length + "
    "T > max_len, not >=",
    why="max_len is a capacity: the last slot is usable, and a model served at its full context needs it.")
NOT_IN_PLACE = Mistake(
    "LatentCache.not_in_place", "after an append, c_kv or k_rope is a new tensor (torch.cat, a padded copy, a "
    "property's): preallocate both once and write each append in place",
    why="A new buffer each append copies the whole cache every token: quadratic over a sequence.")
FITTING_REFUSED = Mistake(
    "LatentCache.fitting_append_refused", "refused an append that fits (ValueError with room left): compare length + "
    "T with max_len, the buffers' token axis, and raise only past it",
    raises=Raises(types=("ValueError",), line=r"raise"),
    why="The capacity read from another axis (c_kv.shape[0] is the batch) refuses appends the cache has room for.")
CACHE_MISTAKES = (
    Mistake("LatentCache.grown_by_cat", "the buffers grow (torch.cat onto what is cached): preallocate c_kv and "
            "k_rope as (B, max_len, width) once and write each append in place", test=_grown,
            why="cat copies the whole cache at every token: quadratic over a sequence."),
    Mistake("LatentCache.per_head_buffers", "the cache has a head axis: MLA keeps one latent and one RoPE key per "
            "token, shared by every head, (B, max_len, width)",
            test=lambda seen, *_: any(isinstance(b, torch.Tensor) and b.dim() == 4 for b in seen.initial[:2])),
    Mistake("LatentCache.length_not_advanced", "length was not advanced: after writing T tokens at "
            "[length, length + T), set length += T",
            test=lambda seen, *_: any(type(a.length) is int and a.length == 0 for a in seen.appends())),
    Mistake("LatentCache.returns_whole_buffer", "returned the whole buffer, unused slots included: return "
            "c_kv[:, :length] and k_rope[:, :length]",
            test=lambda seen, *_: any(_shape(_pair(a.returned, "")[0])[1:2] == (MAX_LEN,) for a in seen.appends())),
    Mistake("LatentCache.returns_new_only", "returned only this append's latents: return every cached position, "
            "c_kv[:, :length] and k_rope[:, :length], what attention reads",
            test=lambda seen, *_: any(a.index > 0 and _shape(_pair(a.returned, "")[0])[1:2] == (CHUNKS[a.index],)
                                      for a in seen.appends())),
    Mistake("LatentCache.returned_before_advancing", "returned the positions cached before this append: advance "
            "length first, then return c_kv[:, :length] and k_rope[:, :length], this append's included",
            test=lambda seen, *_: all(_shape(_pair(a.returned, "")[0])[1:2] == (a.expected_length - CHUNKS[a.index],)
                                      for a in seen.appends()),
            why="The caller attends with what append returns: its own new tokens must be among the keys."),
    Mistake("LatentCache.written_after_advancing", "a buffer was written after length was advanced, at [length + T, "
            "length + 2T): write both c_kv and k_rope at [length, length + T), then advance length",
            test=_written_after_advancing),
    Mistake("LatentCache.added_not_written", "the new latents were added to what the slots held (+=): assign them "
            "(c_kv[:, a:b] = c_kv_new)", test=_nan_written,
            why="Adding is right only while the slots hold zeros: the grader fills the unused slots with NaN."),
    Mistake("LatentCache.buffers_shared", "two caches of one shape share their buffers (a class attribute, a default "
            "argument): make each cache's own c_kv and k_rope in __init__", test=_shared,
            why="A model keeps a cache per layer and per sequence, all alive at once: each append must reach its "
                "own cache only."),
    DTYPE_IGNORED, DEVICE_IGNORED, OVERFLOW_NOT_REFUSED, CHANGED_BEFORE_RAISING, EXACT_FILL_REFUSED, FITTING_REFUSED,
    NOT_IN_PLACE,
)

# What a check's failure says when the appends are right and no listed mistake explains it.
CACHE_NAN = Mistake("LatentCache.unused_slots_mishandled", "right while the unused slots hold zeros, wrong when they "
                    "hold NaN: write new entries by assignment (c_kv[:, a:b] = new) and return only the first length")
CACHE_HALF = Mistake("LatentCache.half_mishandled", "right in float32, wrong in float16: make both buffers in the "
                     "dtype asked for and store the appended values as they are")

CACHE = StepSpec(
    "LatentCache", cache_inputs, lambda cs, ks: None, prefix="cache", plain="appends",
    checks=(
        prop("preallocated", 3, _cache_check(preallocated)),
        prop("appends", 3, _cache_check(appends)),
        prop("contents", 2, _cache_check(contents)), prop("two_caches", 1, _cache_check(contents, twin=True)),
        prop("unused_slots_nan", 2, _cache_check(appends, nan=True), situation=CACHE_NAN),
        prop("overflow_refused", 2, overflow_refused, gated=ALWAYS),
        prop("half", 1, half, situation=CACHE_HALF), prop("device", 1, cache_on_device, gated=ON_META),
    ),
    mistakes=CACHE_MISTAKES,
)

# -- MultiHeadLatentAttention -------------------------------------------------------------

T = sum(CHUNKS)
EVERY_SPLIT = [(s,) + (1,) * (T - s) for s in range(1, T)]
LAYERS = {"w_q": (H * (DN + DR), D), "w_dkv": (R, D), "w_kr": (DR, D), "w_uk": (H * DN, R), "w_uv": (H * DV, R),
          "w_o": (D, H * DV)}


def module_inputs(gen, dtype, t=T, absorbed=None):
    state = {f"{name}.weight": torch.as_tensor(gen.randn(*size, dtype=dtype, scale=size[1] ** -0.5))
             for name, size in LAYERS.items()}
    kwargs = {} if absorbed is None else {"absorbed": absorbed}
    return Call((gen.randn(B, t, D, dtype=dtype),), kwargs, X, init=INIT, state=state)


def latent_attention(state, x, absorbed=False, splits=None, *, bug: str | None = None, filled: bool = False):
    """The module's outputs for x fed in chunks of `splits` (None: one call, no cache), from the contract; the
    plain and absorbed paths give the same. `bug`, one of the step's mistakes' ids, makes its wrong answer.
    `filled`: after the first chunk the cache holds C_FILL and R_FILL in its place (`reads_cache`)."""
    w = {name: state[f"{name}.weight"] for name in LAYERS}
    cached = splits is not None
    splits = splits or (x.shape[1],)
    latents, keys, outs, past = [], [], [], 0
    for t, chunk in zip(splits, chunks(x, splits), strict=True):
        from_zero = bug == POSITIONS_FROM_ZERO.id or bug == FROM_ZERO_MASKED
        positions = torch.arange(t) if from_zero else torch.arange(past, past + t)
        after_append = torch.arange(past + t, past + 2 * t)  # the cache's length read after the append
        query_positions = (torch.arange(t) if bug == QUERY_FROM_ZERO else
                           after_append if bug == QUERY_AFTER_APPEND.id and cached else positions)
        projected = chunk @ w["w_q"].T
        q = (projected.view(B, H, t, DN + DR) if bug == QUERY_HEADS_NO_TRANSPOSE.id else
             projected.view(B, t, H, DN + DR).transpose(1, 2))
        if bug == ROPE_ON_WHOLE_QUERY.id:
            q = ref.apply_rope(q, positions)
        q_nope, q_rope = (q[..., DR:], q[..., :DR]) if bug == QUERY_SPLIT_SWAPPED.id else (q[..., :DN], q[..., DN:])
        if bug == QUERY_SPLIT_ACROSS_HEADS.id:  # every head's nope first, then every head's rope
            flat = chunk @ w["w_q"].T
            q_nope = flat[..., :H * DN].view(B, t, H, DN).transpose(1, 2)
            q_rope = flat[..., H * DN:].view(B, t, H, DR).transpose(1, 2)
        if bug not in (QUERY_UNROTATED.id, ROPE_ON_WHOLE_QUERY.id):
            q_rope = ref.apply_rope(q_rope, query_positions)
        c_kv, k_rope = ref.compress_kv(chunk, w["w_dkv"], w["w_kr"], positions)
        latents.append(c_kv)
        keys.append(k_rope)
        seen = 0 if bug == CACHE_IGNORED.id else past  # the cached tokens attended to
        k_nope, v = ref.expand_kv(torch.cat(latents, dim=1)[:, past - seen:], w["w_uk"], w["w_uv"], H)
        top_left = bug == TOP_LEFT_MASK.id or bug == FROM_ZERO_MASKED
        mask = torch.ones(t, seen + t, dtype=torch.bool).tril() if top_left else bottom_right(t, seen + t)
        if bug == MASK_ONE_AHEAD.id:  # each new token sees the next one too
            mask = torch.ones(t, seen + t, dtype=torch.bool).tril(diagonal=seen + 1)
        k_rope = torch.cat(keys, dim=1)[:, past - seen:]
        scores = ref.mla_scores(q_nope, q_rope, k_nope, k_rope)
        if bug == MODULE_SCALED_TWICE.id and not absorbed:
            scores = scores / math.sqrt(DN + DR)
        if not (absorbed and bug == ABSORBED_UNMASKED.id) and not (bug == CHUNK_UNMASKED.id and past):
            scores = scores.masked_fill(mask if bug == MASK_INVERTED.id else ~mask, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # (B, H, t, Dv)
        merged = {MERGE_NO_TRANSPOSE.id: y, MERGE_HEADS_INNER.id: y.permute(0, 2, 3, 1)}.get(bug, y.transpose(1, 2))
        merged = merged.reshape(B, t, H * DV)
        outs.append(merged @ w["w_o"].T)
        past += t
        if filled and len(latents) == 1:
            latents[0], keys[0] = torch.full_like(latents[0], C_FILL), torch.full_like(keys[0], R_FILL)
    return torch.cat(outs, dim=1)


def _mistake(name: str, message: str, **recognisers) -> Mistake:
    mistake_id = f"MultiHeadLatentAttention.{name}"
    return Mistake(mistake_id, message, lambda state, x, absorbed=False, splits=None: latent_attention(
        state, x, absorbed, splits=splits, bug=mistake_id), **recognisers)


class ModuleScript:
    """The module built with the grader's weights, then x fed in chunks of each feed of `splits` with a fresh cache
    (the candidate's, or the stand-in), feed after feed or, `interleaved`, a chunk of each in turn (one module serving
    several sequences); `contents` reads the cache after every call."""

    def __init__(self, run: Run, splits=(3, 1, 2, 1), absorbed: bool = False, dtype=torch.float32,
                 device: str = "cpu", nan: bool = False, contents: bool = False, interleaved: bool = False,
                 max_len: int = MAX_LEN):
        self.run, self.device = run, device
        self.feeds = [tuple(splits)] if isinstance(splits[0], int) else [tuple(s) for s in splits]
        self.splits = self.feeds[0]
        self.call = run.inputs(dtype=dtype, t=sum(self.splits))
        # each feed a sequence of its own: the same tokens in two caches would hide caches that share their buffers
        self.calls = [self.call] + [replace(self.call, args=(run.inputs(dtype=dtype, t=sum(feed)).args[0],))
                                    for feed in self.feeds[1:]]
        own = run.check.end_to_end or run.ctx.passed("LatentCache")  # a cache that lost points: the stand-in's
        on = {"device": device} if device != "cpu" else {}
        script = Script()
        module = script.build("MultiHeadLatentAttention", *INIT, state=self.call.state)
        self.outputs = [[] for _ in self.feeds]
        turns = []  # (feed, its cache, a chunk of it), in the order the module is called
        for i, (feed, call) in enumerate(zip(self.feeds, self.calls, strict=True)):
            cache = script.build("LatentCache", B, max_len, R, DR, stand_in=not own, dtype=dtype, **on)
            if nan:
                script.fill(cache, ("c_kv", "k_rope"), axis=1, start="length")
            turns.append([(i, cache, chunk) for chunk in chunks(call.args[0], feed)])
        order = ([t for rank in range(max(map(len, turns))) for feed in turns for t in feed[rank:rank + 1]]
                 if interleaved else [t for feed in turns for t in feed])
        for i, cache, chunk in order:
            self.outputs[i].append(script.call(module, "__call__", chunk, names=X, refs={"cache": cache},
                                               kwargs={"absorbed": True} if absorbed else None))
            if contents:
                for name in ("length", "c_kv", "k_rope"):
                    script.get(cache, name)
        self.results = run.script(script, device=device).value

    def expect_right(self) -> None:
        for feed, call, indices in zip(self.feeds, self.calls, self.outputs, strict=True):
            expect_chunks(self.run, call, feed, [self.results[i] for i in indices], self.device)


def _module_check(**options):
    return lambda run: ModuleScript(run, **options).expect_right()


C_FILL, R_FILL = 0.5, -1.5  # what the grader writes into a cache's c_kv and k_rope after a prefill


def reads_cache(run: Run, prefill: int = 4, splits=(1, 2)) -> None:
    """After a prefill the grader writes values of its own into the cache's c_kv and k_rope (the stand-in's); the
    calls after it, on both paths, must attend over them, not over latents the module kept or recomputed."""
    call = run.inputs(t=prefill + sum(splits))
    x, state = call.args[0], call.state
    parts = chunks(x, (prefill, *splits))
    exact = latent_attention(upcast(state), upcast(x), splits=(prefill, *splits), filled=True)[:, prefill:]
    native = latent_attention(state, x, splits=(prefill, *splits), filled=True)[:, prefill:]
    for absorbed in (False, True):
        script = Script()
        module = script.build("MultiHeadLatentAttention", *INIT, state=state)
        cache = script.build("LatentCache", B, MAX_LEN, R, DR, stand_in=True, dtype=x.dtype)
        kwargs = {"absorbed": True} if absorbed else None
        script.call(module, "__call__", parts[0], names=X, refs={"cache": cache}, kwargs=kwargs)
        script.fill(cache, ("c_kv",), axis=1, start=0, value=C_FILL)
        script.fill(cache, ("k_rope",), axis=1, start=0, value=R_FILL)
        at = [script.call(module, "__call__", part, names=X, refs={"cache": cache}, kwargs=kwargs)
              for part in parts[1:]]
        results = run.script(script).value
        what = (f"after a prefill of {prefill} tokens the grader set the cache's c_kv to {C_FILL} and k_rope to "
                f"{R_FILL}; then {'absorbed ' if absorbed else ''}calls of {', '.join(map(str, splits))} tokens")
        try:
            expect_joined([results[i] for i in at], splits, native, exact)
        except CheckFailed as failure:
            raise CheckFailed(f"{what}: {failure.message}", failure.mistake, failure.details) from None


def calls_independent(run: Run) -> None:
    """Two calls without a cache on one module: the second gives what a fresh module gives, nothing of the first
    kept on the module."""
    call = run.inputs()
    x = call.args[0]
    script = Script()
    module = script.build("MultiHeadLatentAttention", *INIT, state=call.state)
    script.call(module, "__call__", -0.5 * x.flip(1), names=X)
    second = script.call(module, "__call__", x, names=X, may_raise=True)
    result = run.script(script).value[second]
    what = "a second call without a cache, after another sequence's"
    if isinstance(result, CandidateError):
        raise CheckFailed(f"{what}, raised {result.message}")
    try:
        expect_chunks(run, call, (x.shape[1],), [result])
    except CheckFailed as failure:
        raise CheckFailed(f"{what}: {failure.message}", failure.mistake, failure.details) from None


def cache_contents(run: Run) -> None:
    """After each call the cache holds every token's c_kv and rotated k_rope so far, and nothing per head."""
    script = ModuleScript(run, contents=True)
    x, state = upcast(script.call.args[0]), upcast(script.call.state)
    latents, keys = ref.compress_kv(x, state["w_dkv.weight"], state["w_kr.weight"], torch.arange(x.shape[1]))
    start = 0
    for index, t in zip(script.outputs[0], script.splits, strict=True):
        start += t
        length, c_kv, k_rope = script.results[index + 1:index + 4]
        if not exactly(length, start):
            raise CheckFailed(f"after calls of {start} tokens in all the cache's length is {length!r}; expected "
                              f"{start}: append each call's c_kv and k_rope once")
        for name, buffer, want in (("c_kv", c_kv, latents), ("k_rope", k_rope, keys)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 3 or buffer.shape[1] < start:
                raise CheckFailed(f"the cache's {name} is {_shape(buffer)}; expected (B, max_len, width)")
            try:
                expect_close(buffer[:, :start], want[:, :start])
            except CheckFailed as failure:
                rotated = (x @ state["w_kr.weight"].T)[:, :start]
                unrotated = (name == "k_rope" and buffer[:, :start].shape == rotated.shape
                             and torch.allclose(buffer[:, :start].double(), rotated, atol=1e-5))
                raise CheckFailed(f"after {start} tokens, the cache's {name}[:, :{start}] is not what compress_kv "
                                  f"gives for them at their positions: {failure.message}",
                                  CACHED_UNROTATED_KEY if unrotated else None, failure.details) from None


def module_end_to_end(run: Run) -> None:
    """The module with the candidate's own LatentCache and steps, on both paths: does the whole thing decode?"""
    try:
        ModuleScript(run, splits=(3, 2, 1, 1), nan=True).expect_right()
        ModuleScript(run, splits=(3, 2, 1, 1), nan=True, absorbed=True).expect_right()
    except CheckFailed as failure:
        source = source_of(run.ctx.source, run.step.id)
        calls = ["LatentCache"] + [name for name in MODULE_CALLS if name in source]
        mistake = failure.mistake if all(run.ctx.passed(name) for name in calls) else None
        raise CheckFailed(failure.message, mistake, {**failure.details, "calls": calls}, failure.outcome) from None


TOP_LEFT_MASK = _mistake(
    "top_left_mask", "with a cache, the causal mask was aligned to the top-left (new token i sees keys 0 … i): new "
    "token i sits at past_len + i; use tril(diagonal=past_len)")
POSITIONS_FROM_ZERO = _mistake(
    "positions_from_zero", "each call's tokens were given positions from 0 (RoPE's, and a mask made from them): with "
    "a cache they sit at past_len … past_len + T − 1",
    why="RoPE makes q(m)·k(n) depend on m − n; a new token rotated as position 0 is compared with cached keys from "
        "their real positions.")
QUERY_FROM_ZERO = POSITIONS_FROM_ZERO.id + ":query"  # its other forms: only the queries rotated from 0, and the
FROM_ZERO_MASKED = POSITIONS_FROM_ZERO.id + ":masked"  # mask made from the same positions (top-left: the thirtieth
# blind set's b06)
POSITIONS_FROM_ZERO = replace(POSITIONS_FROM_ZERO, variant=lambda state, x, absorbed=False, splits=None: [
    latent_attention(state, x, absorbed, splits=splits, bug=bug)
    for bug in (POSITIONS_FROM_ZERO.id, QUERY_FROM_ZERO, FROM_ZERO_MASKED)])
QUERY_AFTER_APPEND = _mistake(
    "query_after_append", "with a cache, the queries were rotated from the cache's length after the append: the new "
    "tokens sit at past_len … past_len + T − 1, the length before it",
    why="Read after the append, the cache's length already counts the new tokens, so every query turns T too far.")
ROPE_ON_WHOLE_QUERY = _mistake(
    "rope_on_whole_query", "RoPE was applied to the whole query, its no-position part too: rotate only q_rope, the "
    "last qk_rope_head_dim features of each head")
QUERY_UNROTATED = _mistake(
    "query_unrotated", "q_rope was not rotated: apply_rope(q_rope, positions) with the new tokens' positions, as the "
    "keys are")
QUERY_SPLIT_SWAPPED = _mistake(
    "query_split_swapped", "each head's query was split as [rope, nope]: the contract's order is [nope, rope], "
    "q.split([qk_nope_head_dim, qk_rope_head_dim], dim=-1)")
QUERY_SPLIT_ACROSS_HEADS = _mistake(
    "query_split_across_heads", "w_q's output was split as [every head's nope | every head's rope]: view it as "
    "(B, T, H, Dn + Dr) first, then split each head's features [nope, rope]")
QUERY_HEADS_NO_TRANSPOSE = _mistake(
    "query_heads_no_transpose", "w_q's output was viewed as (B, H, T, Dn + Dr) straight: view it as (B, T, H, Dn + "
    "Dr), then transpose(1, 2)",
    why="Right for one token, where T is 1 and the two views agree: a decode-only test passes it (blind set 56's "
        "b14).")
MODULE_SCALED_TWICE = _mistake(
    "scaled_twice", "the plain path's scores were divided by √(Dn + Dr) again: mla_scores scales them already, so "
    "mask and softmax what it returns",
    why="Dividing twice flattens the attention toward the mean of the values; absorbed_attention, which scales once "
        "itself, stays right, so only absorbed=False shows it (blind set 59's b14).")
MERGE_NO_TRANSPOSE = _mistake(
    "merge_no_transpose", "merged the heads without moving the head axis back: transpose(1, 2) before reshaping "
    "(B, H, T, Dv) to (B, T, H·Dv)")
MERGE_HEADS_INNER = _mistake(
    "merge_heads_inner", "merged the heads in (Dv, H) order, heads inner: w_o's columns are (H, Dv), heads outer; "
    "transpose(1, 2) to (B, T, H, Dv), then reshape to H·Dv")
MASK_ONE_AHEAD = _mistake(
    "mask_one_ahead", "the causal mask let each new token see the next one too (tril's diagonal one too far): new "
    "token i sees keys 0 … past_len + i, tril(diagonal=past_len)")
MASK_SIZED_BY_BATCH = Mistake(
    "MultiHeadLatentAttention.mask_sized_by_batch", "the causal mask was made with the batch size where the new "
    "tokens' count belongs, (B, Tk): make it (T, past_len + T)",
    raises=Raises(message=r"must match the size of tensor|is invalid for input of size|expanded size",
                  source=r"torch\.(ones|full|zeros|empty)\(\s*(b|B|bsz|batch\w*)\s*,[^\n]*\.(tril|triu)\("),
    why="Right only where the batch is as large as the call's tokens (blind set 63's b20).")
MASK_INVERTED = _mistake(
    "mask_inverted", "the causal mask was applied inverted (-inf where it is True): True means may attend, so "
    "masked_fill(~mask, -inf)")
ABSORBED_UNMASKED = _mistake(
    "absorbed_unmasked", "the absorbed path attended without the causal mask: a call of several new tokens must mask "
    "the future ones there too, as the plain path does")
CHUNK_UNMASKED = _mistake(
    "chunk_unmasked", "with a cache, a chunk of several new tokens was not masked causally: mask on every call, new "
    "token i sees keys 0 … past_len + i",
    why="Chunked prefill feeds a long prompt a few tokens at a time: each chunk's tokens must not see the later "
        "ones of the same chunk, on the first call or any other.")
CACHE_IGNORED = _mistake(
    "cache_ignored", "attended over this call's tokens only: append c_kv and k_rope to the cache and attend over "
    "every position it returns")
CACHED_FULL_KEYS = Mistake(
    "MultiHeadLatentAttention.cached_full_keys", "appended per-head keys or values to the cache: it holds only what "
    "compress_kv gives, c_kv and the rotated k_rope; append those, then expand what append returns",
    raises=Raises(message=r"must match|expand|shape mismatch|size mismatch|number of sizes",
                  source=r"\.append\(\s*(?:k|keys?|k_full|k_nope|key_states|kv|k_all)\s*,"),
    why="Caching H keys and values per token is the cache MLA exists to shrink: DeepSeek-V2 keeps 576 numbers per "
        "token and layer, not 32768.")
W_O_INPUT = Mistake(
    "MultiHeadLatentAttention.w_o_input_wrong", "w_o was given other than the merged heads (B, T, H·Dv): "
    "absorbed_attention's output is already after w_o, return it as is; on the plain path merge the heads first",
    raises=Raises(types=("RuntimeError",), message=r"cannot be multiplied", line=r"\bw_o\("),
    why="absorbed_attention folds w_uv into w_o, so its output is the layer's; a second w_o meets D numbers where "
        "it takes H·Dv (blind set 53's b15).")
PER_HEAD_ROPE_KEY = Mistake(
    "MultiHeadLatentAttention.per_head_rope_key", "w_kr makes a RoPE key per head: MLA has one per token, shared by "
    "every head, w_kr = nn.Linear(embed_dim, qk_rope_head_dim)", raises=Raises(message=r"size mismatch for w_kr"))
CACHED_UNROTATED_KEY = Mistake(
    "MultiHeadLatentAttention.cached_unrotated_key", "the cache holds k_rope before RoPE: cache it rotated, as "
    "compress_kv gives it, so a cached key is never rotated again",
    why="A key rotated once, at its own position, stays right for every later query.")
ROPE_BEFORE_HEADS_MOVED = Mistake(
    "MultiHeadLatentAttention.rope_before_heads_moved", "RoPE was applied to q_rope laid out (B, T, H, Dr): apply_rope "
    "turns axis -2 by the positions, so move the heads to axis 1 first, (B, H, T, Dr)",
    why="DeepSeek-V3's own code keeps the heads on axis 2 and its RoPE reads the tokens elsewhere; this contract's "
        "apply_rope reads them on axis -2.",
    raises=Raises(types=("RuntimeError",), message=r"must match the size", line=r"angles"))

CACHE_NOT_READ = Mistake(
    "MultiHeadLatentAttention.cache_not_read", "attended over latents the module kept itself (on self, or "
    "recomputed), not over the cache's: attend over what cache.append returns",
    why="The cache is the one record of the sequence: a caller may trim it, move it or fill it from elsewhere.")
STATE_ACROSS_CALLS = Mistake(
    "MultiHeadLatentAttention.state_across_calls", "a call without a cache gave other answers after another call: "
    "the module kept state of its own; without a cache every call is a whole sequence, from position 0",
    why="One module serves many sequences: everything a sequence needs lives in its cache, or in no cache at all.")

# What a check's failure says when the module is right without a cache and no listed mistake explains it.
MODULE_CACHED = Mistake("MultiHeadLatentAttention.cache_mishandled", "right without a cache, wrong with one: new "
                        "tokens sit at positions past_len onwards (RoPE, the causal mask's offset) and attend to every "
                        "cached latent too")
MODULE_ABSORBED = Mistake("MultiHeadLatentAttention.absorbed_mishandled", "right on the plain path, wrong with "
                          "absorbed=True: fold w_uk into the query and w_uv into the output, per head, keeping the "
                          "RoPE part and the mask")
MODULE_OWN_POSITIONS = Mistake("MultiHeadLatentAttention.positions_of_its_own", "right for one sequence, wrong "
                               "when one module serves two caches in turn: the new tokens' positions are the cache's "
                               "length (past_len = cache.length), not a count the module keeps",
                               why="A server decodes many sequences with one layer; only the cache knows how far its "
                                   "own sequence has come.")
MODULE_LONG_HALF = Mistake("MultiHeadLatentAttention.positions_rounded", "right in float32, wrong in bfloat16 past "
                           "position 256: make positions integers, torch.arange(past, past + T), which bfloat16 "
                           "would round (257 is 256 there)")
MODULE_CACHE_CONTENTS = Mistake("MultiHeadLatentAttention.cache_contents_mishandled", "the cache holds other values "
                                "than each token's latent and rotated RoPE key: append c_kv and k_rope as "
                                "compress_kv gives them")

# absorbed_latents' sizes: wide heads (Dn 61, Dv 67) and a narrow latent (R 4, Dr 2), as absorbed_attention's
# latent_only asks, so that a key or value expanded for every cached token holds B·H·61 = 366 numbers per token and
# the absorbed path at most B·H·(R + Dr) = 36
MODULE_EXPANDED = Mistake("MultiHeadLatentAttention.absorbed_expanded", "with absorbed=True the cached latents were "
                          "expanded into per-head keys or values: call absorbed_attention on the cache's c_kv and "
                          "k_rope", why="The outputs are the same either way; what absorbing saves is exactly the "
                                        "expansion, H·(Dn + Dv) numbers per cached token at every decoded token.")


MODULE_MASK_WHOLE = Mistake("MultiHeadLatentAttention.decode_mask_whole", "with absorbed=True a causal mask over "
                            "every position, (T, T), was built to decode: build only the new tokens' rows, (T_new, "
                            "past_len + T_new)", why="Decoding one token over T cached ones reads T latents; a mask "
                                                     "over every position holds T² flags, more than the cache itself.")
# absorbed_latents' model, drawn under the draw key (review 64's F1 knew the check by its fixed widths): heads wide and
# latents narrow, so that one batch's key or value of one head holds Dn (or Dv) numbers per cached token, past the
# bound, min(Dn, Dv) - 1, while the absorbed path holds at most B·H·(R + Dr) <= 56 (B 2, H up to 4, R up to 5, Dr 2)
SPREAD_HEADS, SPREAD_RANKS, SPREAD_NOPE, SPREAD_MODEL = (2, 3, 4), (3, 4, 5), (59, 61, 67, 71, 73, 79), (17, 19, 23)


def _pick(run: Run, options):
    return options[int(torch.randint(len(options), (), generator=run.gen.unknown))]


def spread_model(run: Run) -> tuple[dict, int]:
    """The widths and the cache length absorbed_latents asks at, drawn with Gen.unknown. The length is no multiple of
    a width, long enough that every slice of a weight holds fewer than the bound's numbers per cached token and a
    square of it more (review 64's F4 hid an expansion in squares), and none
    at which a weight or a slice of one holds a key or value of every token, by its count (w_q's 3591 numbers at H 3,
    Dn 61, D 19 are 189 tokens of 19)."""
    dn = _pick(run, SPREAD_NOPE)
    w = {"d": _pick(run, SPREAD_MODEL), "h": _pick(run, SPREAD_HEADS), "r": _pick(run, SPREAD_RANKS), "dn": dn,
         "dr": 2, "dv": _pick(run, tuple(n for n in SPREAD_NOPE if n != dn))}
    h, d, widths = w["h"], w["d"], (w["dn"], w["dv"], w["d"])
    slices = {h * (w["dn"] + w["dr"]) * d, h * w["dn"] * d, w["dn"] * d, h * w["dv"] * d, w["dv"] * d,
              h * w["dn"] * w["r"], w["dn"] * w["r"], h * w["dv"] * w["r"], w["dv"] * w["r"], d * h * w["r"],
              w["r"] * d, w["dr"] * d}
    bound = min(w["dn"], w["dv"]) - 1
    shortest = max(max(slices) // bound + 2, bound + 2)  # and a (T, T) square past the bound: T + 1 per cached token
    lengths = [t for t in range(shortest, 512) if all(t % n for n in widths)
               and all(size % (t * n) for size in slices for n in widths)]
    return w, _pick(run, tuple(lengths))


# A table of RoPE angles built at every call for a fixed number of positions, as Hugging Face's rotary class builds
# it once (review 74's F3: 4096 positions of Dr): the positions, or their angles (no wider than Dr), at most TABLE
# numbers, the same shape over both caches. Keys or values expanded for every cached token hold more at any drawn
# model: at least B·T·H·Dn = 2·59·2·59 = 13924.
TABLE = 8192


def _table(size, elements: int, shorter: set, rope: int) -> bool:
    return (len(size) == 1 or len(size) == 2 and size[-1] <= rope) and elements <= TABLE and tuple(size) in shorter


def absorbed_latents(run: Run) -> None:
    """A token decoded with absorbed=True over a cache of about half of a drawn length's tokens, then of one fewer,
    by a model of drawn widths (spread_model; the cache the file's own once LatentCache passed, the stand-in before,
    so that its class tells no check from another: review 64's F2): nothing its torch calls create (but the weights'
    sizes) holds more than min(Dn, Dv) - 1 numbers per cached token at the longer (keys or values expanded from the
    latents, padded or not; the review 57's F2 ignored absorbed and scored 100, review 60's F4 padded them to 256
    tokens; a mask over every position is no smaller: review 64's F4 hid an expansion in squares as large), its calls
    are as many at both lengths (no loop over the cache in pieces), and the record is whole (review 61's F5 expanded
    inside a tensor subclass's __torch_function__). A table of at most TABLE numbers, the same over both caches (RoPE
    angles for a fixed number of positions), is no expansion. What leaves torch (NumPy) it does not see: Known
    limits."""
    w, total = spread_model(run)
    lengths = (total // 2, total - 1)  # cached before the decoded token
    per_token = min(w["dn"], w["dv"]) - 1
    init = (w["d"], w["h"], w["r"], w["dn"], w["dr"], w["dv"])
    model = f"H={w['h']}, Dn={w['dn']}, Dv={w['dv']}, R={w['r']}, Dr={w['dr']}"
    layers = {"w_q": (w["h"] * (w["dn"] + w["dr"]), w["d"]), "w_dkv": (w["r"], w["d"]), "w_kr": (w["dr"], w["d"]),
              "w_uk": (w["h"] * w["dn"], w["r"]), "w_uv": (w["h"] * w["dv"], w["r"]), "w_o": (w["d"], w["h"] * w["dv"])}
    gen = run.gen
    state = {f"{name}.weight": torch.as_tensor(gen.randn(*size, scale=size[1] ** -0.5))
             for name, size in layers.items()}
    own = run.ctx.passed("LatentCache")
    counts, calls = [], []
    for cached in lengths:
        script = Script()
        module = script.build("MultiHeadLatentAttention", *init, state=state)
        cache = script.build("LatentCache", B, total, w["r"], w["dr"], stand_in=not own)
        script.call(cache, "append", torch.as_tensor(gen.randn(B, cached, w["r"])),
                    torch.as_tensor(gen.randn(B, cached, w["dr"])), names=APPEND)
        script.call(module, "__call__", torch.as_tensor(gen.randn(B, 1, w["d"])), names=X, refs={"cache": cache},
                    kwargs={"absorbed": True})
        got = run.script(script, shapes=True)
        expect_seen(got, MODULE_EXPANDED)
        record = got.shapes or {"created": [], "more": 0}
        if record.get("more"):  # review 58's F1 made 299 shapes first, to push the expanded keys off the list
            raise CheckFailed(f"one token decoded with absorbed=True over {cached} cached tokens: the calls created "
                              f"tensors of more than {len(record['created'])} different shapes, too many to check "
                              "what they expand", MODULE_EXPANDED)
        counts.append([(math.prod(size), size) for size in record["created"]])
        calls.append(record.get("calls", 0))
    if calls[1] > calls[0]:  # a loop over the cached tokens, a few at a time (review 59's F1: four at a time)
        raise CheckFailed(f"one token decoded with absorbed=True over {lengths[0]} cached tokens made {calls[0]} "
                          f"torch calls, over {lengths[1]} {calls[1]}: it works through the cache in pieces; the "
                          "absorbed path reads c_kv and k_rope whole, as many calls for any length", MODULE_EXPANDED,
                          {"calls": calls})
    longer = counts[1]
    # Over a number of keys that is no multiple of a width a key or value of every token for each head holds that
    # number times Dn (or Dv, or the model width through w_o) times a whole number, however it is laid out or padded
    # with tensors of the same sizes at both lengths (review 58's F1b); nothing of the absorbed path does
    for elements, size in longer:
        if any(elements % (total * w[width]) == 0 for width in ("dn", "dv", "d")):
            raise CheckFailed(f"one token decoded with absorbed=True over {lengths[1]} cached tokens ({model}): a "
                              f"tensor of shape {tuple(size)} was created, a per-head key or value of every token: "
                              "keys or values expanded from the latents", MODULE_EXPANDED, {"shape": list(size)})
    weights = {math.prod(size) for size in layers.values()}  # w_o and its views (folded with w_uv) hold as many
    shorter = {tuple(size) for _, size in counts[0]}
    for elements, size in longer:  # padded to a constant length too (review 60's F4: 256 tokens)
        if (elements not in weights and elements > per_token * lengths[1]
                and not _table(size, elements, shorter, w["dr"])):
            square = len(size) >= 2 and math.prod(size[:-2]) == 1 and size[-1] == size[-2] in (lengths[1], total)
            said = ("a mask over every position, or keys or values expanded into squares" if square else
                    "keys or values expanded from the latents")
            raise CheckFailed(f"one token decoded with absorbed=True over {lengths[1]} cached tokens ({model}): a "
                              f"tensor of shape {tuple(size)} was created, {elements / lengths[1]:.0f} numbers per "
                              f"cached token (the latent and the RoPE key hold {B * w['h'] * (w['r'] + w['dr'])} "
                              f"over every head): {said}", MODULE_MASK_WHOLE if square else MODULE_EXPANDED,
                              {"shape": list(size)})


MODULE_CALLS = ("compress_kv", "expand_kv", "mla_scores", "absorbed_attention")
MODULE = StepSpec(
    "MultiHeadLatentAttention", module_inputs, latent_attention, module=True, prefix="module", answered=MODULE_CALLS,
    checks=(
        prop("structure", 2, linear_layers(tuple(LAYERS), INIT, "an nn.Linear")),
        values("no_cache", 3, FLOATS), values("no_cache_absorbed", 2, situation=MODULE_ABSORBED, absorbed=True),
        prop("decode", 2, _module_check(splits=(4, 1, 1, 1)), situation=MODULE_CACHED),
        prop("every_split", 1, _module_check(splits=EVERY_SPLIT), situation=MODULE_CACHED),
        # bfloat16 holds every integer up to 256 and every other one past it: positions 257, 259, 261 show
        prop("long_bfloat16", 1, _module_check(splits=(259, 2, 1), dtype=torch.bfloat16, max_len=LONG),
             situation=MODULE_LONG_HALF),
        prop("chunked", 2, _module_check(splits=(3, 2, 2)), situation=MODULE_CACHED),
        # named so only where the module is right without a cache (blind set 56's b14, wrong for every chunk of more
        # than one token, was named cache_not_read and state_across_calls)
        prop("reads_cache", 1, reads_cache, situation=CACHE_NOT_READ),
        prop("calls_independent", 1, calls_independent, situation=STATE_ACROSS_CALLS),
        prop("two_caches", 2, _module_check(splits=[(3, 2, 2), (4, 1, 1, 1)], interleaved=True),
             situation=MODULE_OWN_POSITIONS),
        prop("absorbed", 1, _module_check(splits=[(4, 1, 1, 1), (3, 2, 2)], absorbed=True, nan=True),
             situation=MODULE_ABSORBED),
        prop("absorbed_latents", 3, absorbed_latents, gated=ALWAYS),  # what it creates, not what it answers
        prop("cache_contents", 3, cache_contents, situation=MODULE_CACHE_CONTENTS),
        prop("device", 1, lambda run: ModuleScript(run, device=run.ctx.device).expect_right(), gated=ON_META),
        prop("end_to_end", 2, module_end_to_end, end_to_end=True),
    ),
    mistakes=(MODULE_EXPANDED, MODULE_MASK_WHOLE, TOP_LEFT_MASK, POSITIONS_FROM_ZERO, QUERY_AFTER_APPEND,
              ROPE_ON_WHOLE_QUERY, QUERY_UNROTATED, QUERY_SPLIT_SWAPPED, QUERY_SPLIT_ACROSS_HEADS,
              QUERY_HEADS_NO_TRANSPOSE, MODULE_SCALED_TWICE, MERGE_NO_TRANSPOSE, MERGE_HEADS_INNER, MASK_SIZED_BY_BATCH,
              MASK_INVERTED,
              MASK_ONE_AHEAD, ABSORBED_UNMASKED, CHUNK_UNMASKED,
              CACHE_IGNORED, CACHED_FULL_KEYS, W_O_INPUT,
              PER_HEAD_ROPE_KEY, CACHED_UNROTATED_KEY, ROPE_BEFORE_HEADS_MOVED, CACHE_NOT_READ, STATE_ACROSS_CALLS),
)
