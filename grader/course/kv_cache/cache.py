"""kv_cache's KVCache step: the cache script, its record and checks, and its named mistakes.

A cache script builds the candidate's KVCache in one worker, appends chunk after chunk, and
reads what the cache holds after each append; its record (CacheScript) is the answer the
mistakes' tests read, named through Run.explain as every other step's answers are. spec.py
beside this file declares the exercise; the sizes below are shared with it.
"""

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
    Tolerance,
    device_of,
    diagnose,
    exactly,
    expect_each,
    expect_form,
    expect_result,
    fill,
    matches_any,
    prop,
    type_name,
)

FLOATS = (torch.float32, torch.float64)
B, H, DH = 2, 3, 4  # batch, heads, head width
D = H * DH  # model width
MAX_LEN = 16  # the cache's room: more than twice the tokens any check appends, so a length advanced twice still fits
CHUNKS = (4, 1, 2)  # tokens per append: a prefill of 4 (not H, so the head axis cannot pass for the token axis), 1, 2
KV = ("k_new", "v_new")  # append's arguments, as messages name them
X = ("x",)  # the module's


def _pair(value, what: str):
    """An append's answer as (k, v)."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    got = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else type_name(value)
    raise CheckFailed(f"{what} returned {got}; expected a tuple (k, v)")


def _shape(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else type_name(value)


# -- KVCache ------------------------------------------------------------------------------


def cache_inputs(gen, dtype, chunks=CHUNKS):
    """The new keys and values of each append, (B, H, T, Dh) each: the keys of head h about h, its values about -h."""
    offset = torch.arange(H, dtype=dtype).view(1, H, 1, 1)
    ks = [torch.as_tensor(gen.randn(B, H, t, DH, dtype=dtype)) * 0.1 + offset for t in chunks]
    vs = [torch.as_tensor(gen.randn(B, H, t, DH, dtype=dtype)) * 0.1 - offset for t in chunks]
    return Call((ks, vs), names=KV)


class Append(NamedTuple):
    """What one append of a CacheScript showed, and what it should have."""

    index: int
    returned: object  # append's answer
    length: object  # then read: length, k, v
    k: object
    v: object
    keys: torch.Tensor  # every key appended so far, (B, H, length, Dh)
    vals: torch.Tensor
    expected_length: int

    @property
    def returned_k(self):
        return self.returned[0] if isinstance(self.returned, (tuple, list)) and self.returned else None


def fill_unused(script: Script, cache: int) -> int:
    """NaN into the cache's unused slots (its k and v from `length` on, axis 2); the index of the fill's result.

    The fill may raise: a cache that makes its buffers on its first append (k = None until then) holds no
    unused slot to fill. Such a cache loses `preallocated` and nothing else; a buffer that is there but no
    tensor is the cache's loss in `unused_slots_nan` (CacheScript.refused_fill).
    """
    script.actions.append({**fill(cache, ("k", "v"), axis=2, start="length"), "may_raise": True})
    return len(script.actions) - 1


class CacheScript:
    """A cache built (its unused slots filled with NaN if `nan`), then for each chunk: append, read length, k and v
    (and with `probe`, where k and v are stored: a script's `storage` action).

    The answer of a cache check: `initial` and `appends` sort the results out, and the cache's
    mistakes' tests read them (Run.explain(script, script.call) names the one it shows).

    With `twin`, a second cache of the same shape is built beside it and given other keys right after each of the
    first's appends, before the first is read: two caches alive at once (two layers, two sequences) hold their own.
    """

    def __init__(self, run: Run, dtype=torch.float32, device: str = "cpu", chunks=CHUNKS, nan: bool = False,
                 probe: bool = False, twin: bool = False):
        self.dtype, self.chunks, self.nan = dtype, chunks, nan
        self.call = run.inputs(dtype=dtype, chunks=chunks)
        self.ks, self.vs = self.call.args
        script = Script()
        on = {"device": device} if device != "cpu" else {}
        cache = script.build("KVCache", B, H, DH, MAX_LEN, dtype=dtype, **on)
        other = script.build("KVCache", B, H, DH, MAX_LEN, dtype=dtype, **on) if twin else None
        self.filled = fill_unused(script, cache) if nan else None
        self.start = len(script.actions)
        for name in ("k", "v", "length"):
            script.get(cache, name)
        self.storages = [script.storage(cache, ("k", "v"))] if probe or twin else []
        self.rows = []  # each append's index, then those of its reads: length, k and v
        for k, v in zip(self.ks, self.vs, strict=True):
            row = script.call(cache, "append", k, v, names=KV)
            if twin:
                script.call(other, "append", -k, -v, names=KV)
            self.rows.append((row, *(script.get(cache, name) for name in ("length", "k", "v"))))
            if probe:
                self.storages.append(script.storage(cache, ("k", "v")))
        self.twin = script.storage(other, ("k", "v")) if twin else None
        self.results = run.script(script, device=device).value

    @property
    def initial(self):
        return self.results[self.start:self.start + 3]  # k, v, length

    def refused_fill(self) -> CandidateError | None:
        """The error of the NaN fill, unless the cache held no buffer yet to fill (k None: made on the first append)."""
        error = self.results[self.filled] if self.filled is not None else None
        return error if isinstance(error, CandidateError) and self.initial[0] is not None else None

    def appends(self):
        """One Append for each chunk, in order."""
        for i, row in enumerate(self.rows):
            returned, length, k, v = (self.results[at] for at in row)
            keys, vals = torch.cat(self.ks[:i + 1], dim=2), torch.cat(self.vs[:i + 1], dim=2)
            yield Append(i, returned, length, k, v, keys, vals, keys.shape[2])


def _shared(seen: CacheScript, *_) -> bool:
    """Whether the twin cache's buffers lie in the first's storages."""
    if seen.twin is None:
        return False
    wheres = [seen.results[seen.storages[0]], seen.results[seen.twin]]
    addresses = [{w[0] for w in where if w is not None} for where in wheres if isinstance(where, list)]
    return len(addresses) == 2 and bool(addresses[0] & addresses[1])


def _grown(seen: CacheScript, *_) -> bool:
    buffers = [seen.initial[0], *(a.k for a in seen.appends())]
    return any(isinstance(k, torch.Tensor) and (k.dim() != 4 or k.shape[2] != MAX_LEN) for k in buffers)


def _whole_buffer(seen: CacheScript, *_) -> bool:
    return any(isinstance(k, torch.Tensor) and k.dim() == 4 and k.shape[2] == MAX_LEN != a.expected_length
               for a in seen.appends() for k in [a.returned_k])


def _old_prefix(returned, keys: torch.Tensor, t: int) -> bool:
    """Is `returned` the keys cached before this append of t tokens (of `keys`, all so far): sliced before advancing?"""
    old = keys.shape[2] - t
    return (isinstance(returned, torch.Tensor) and returned.dim() == 4 and t > 0
            and tuple(returned.shape) == (*keys.shape[:2], old, keys.shape[3])
            and (returned.is_meta or matches_any(returned.to(keys.dtype), [keys[:, :, :old]])))


def _nan_written(seen: CacheScript, *_) -> bool:
    """With NaN in the unused slots, NaN in the positions an append filled: NaN + k_new is NaN."""
    found = [x[:, :, :a.expected_length] for a in seen.appends() for x in (*_pair(a.returned, ""), a.k, a.v)
             if isinstance(x, torch.Tensor) and x.dim() == 4]
    return seen.nan and any(bool(torch.isnan(x).any()) for x in found)


def _written_after_advancing(seen: CacheScript, *_) -> bool:
    """Whether a buffer holds an append's new keys or values one append's length late, at [end, end + T): written
    after length was advanced."""
    for a in seen.appends():
        t, end = seen.chunks[a.index], a.expected_length
        for buffer, want in ((a.k, a.keys), (a.v, a.vals)):
            if isinstance(buffer, torch.Tensor) and buffer.dim() == 4 and buffer.shape[2] >= end + t:
                late, new = buffer[:, :, end:end + t].double(), want[:, :, end - t:end].double()
                if late.shape == new.shape and torch.allclose(late, new, rtol=1e-3, atol=1e-3):
                    return True
    return False


def _cache_check(look, **options):
    def check(run: Run) -> None:
        script = CacheScript(run, **options)
        expect_each(run, script, script.call, look)

    return check


def preallocated(script: CacheScript) -> None:
    """Made at its full size, and written in place: the same storage before and after every append, as the grader's
    probe finds it (not as the cache describes itself: a property may pad a grown tensor to look preallocated)."""
    k, v, length = script.initial
    for name, buffer in (("k", k), ("v", v)):
        try:
            expect_form(buffer, torch.empty(B, H, MAX_LEN, DH, dtype=script.dtype))
        except CheckFailed as failure:
            raise CheckFailed(f"KVCache({B}, {H}, {DH}, max_len={MAX_LEN}).{name}, just built: {failure.message}; "
                              f"preallocate (B, H, max_len, Dh)") from None
    if not exactly(length, 0):
        raise CheckFailed(f"a new cache's length is {length!r}; expected 0")
    for a in script.appends():
        if not isinstance(a.k, torch.Tensor) or tuple(a.k.shape) != (B, H, MAX_LEN, DH):
            raise CheckFailed(f"after append {a.index + 1}, k is {_shape(a.k)}: the buffer must stay "
                              f"(B, H, max_len, Dh) = {(B, H, MAX_LEN, DH)}, written in place")
    first = script.results[script.storages[0]] if script.storages else None
    for number, at in enumerate(script.storages[1:], 1):
        seen = script.results[at]
        for name, before, now in zip("kv", first or (None, None), seen or (None, None), strict=True):
            if before is None or now is None:  # a property or __getattr__ makes it: a padded copy, say
                raise CheckFailed(f"after append {number}, the cache's {name} is no torch.Tensor it keeps itself (an "
                                  "attribute, a slot or a buffer): keep k and v as tensors, written in place",
                                  NOT_IN_PLACE)
            if now != before:
                raise CheckFailed(f"after append {number}, the cache's {name} is another tensor than the one it was "
                                  "built with (its storage moved): write each append into the buffer made once",
                                  NOT_IN_PLACE)


def appends(script: CacheScript, where: str = "", tolerance: Tolerance | None = None) -> None:
    """What each append returned; `where`: the device a device check runs on, said in its messages."""
    on, total = (f"on {where}, ", "") if where else ("", " (after {} tokens in all)")
    for a in script.appends():
        k, v = _pair(a.returned, f"append {a.index + 1}")
        expect_result(f"{on}append {a.index + 1}{total.format(a.expected_length)} returned k", k, a.keys,
                      where or "cpu", tolerance)
        expect_result(f"{on}append {a.index + 1} returned v", v, a.vals, where or "cpu", tolerance)


def lengths(script: CacheScript) -> None:
    for a in script.appends():
        if type(a.length) is not int:
            raise CheckFailed(f"after append {a.index + 1}, length is {type_name(a.length)}, not an int")
        if a.length != a.expected_length:
            raise CheckFailed(f"after appends of {', '.join(map(str, script.chunks[:a.index + 1]))} tokens, length is "
                              f"{a.length}; expected {a.expected_length}")


def contents(script: CacheScript) -> None:
    for a in script.appends():
        n = a.expected_length
        for name, buffer, want in (("k", a.k, a.keys), ("v", a.v, a.vals)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 4 or buffer.shape[2] < n:
                raise CheckFailed(f"after append {a.index + 1}, the cache's {name} is {_shape(buffer)}; expected "
                                  f"(B, H, max_len, Dh) holding {n} positions")
            expect_result(f"after append {a.index + 1}, the cache's {name}[:, :, :{n}]", buffer[:, :, :n], want)


def unused_slots_nan(run: Run) -> None:
    script = CacheScript(run, nan=True)
    refused = script.refused_fill()
    if refused is not None:
        raise CheckFailed(f"the grader could not fill the cache's unused slots with NaN: {refused.message}; keep k and "
                          "v as (B, H, max_len, Dh) tensors")
    expect_each(run, script, script.call, appends, contents, prefix="with NaN in the unused slots: ")


def overflow_script(run: Run) -> dict:
    """A cache of max_len 6 takes 4 tokens, then is offered 3 more: what it showed before and after, by name."""
    (k1, k2), (v1, v2) = run.inputs(chunks=(4, 3)).args
    script = Script()
    cache = script.build("KVCache", B, H, DH, 6)
    script.call(cache, "append", k1, v1, names=KV)
    for name in ("k", "v", "length"):
        script.get(cache, name)
    script.call(cache, "append", k2, v2, names=KV, may_raise=True)
    for name in ("length", "k", "v"):
        script.get(cache, name)
    names = ("first", "k_before", "v_before", "length_before", "error", "length", "k_after", "v_after")
    seen = dict(zip(names, run.script(script).value[1:], strict=True), k1=k1, v1=v1)
    if not exactly(seen["length_before"], 4):  # the append that fits must have worked first
        length = seen["length_before"]
        mistake = {0: LENGTH_NOT_ADVANCED, 8: LENGTH_TWICE}.get(length) if type(length) is int else None
        raise CheckFailed(f"a cache of max_len 6 took 4 tokens, and its length is {length!r}; expected 4", mistake)
    return seen


def overflow_raises(run: Run) -> None:
    error = overflow_script(run)["error"]  # a CandidateError if append raised, else what it returned
    if not isinstance(error, CandidateError):
        raise CheckFailed("a cache of max_len 6 holding 4 tokens took 3 more without complaint: check length + T > "
                          "max_len and raise ValueError", OVERFLOW_NOT_REFUSED)
    if error.type != "ValueError":
        mistake = diagnose.ASSERT_NOT_VALUEERROR if error.type == "AssertionError" else OVERFLOW_NOT_REFUSED
        raise CheckFailed(f"appending 3 tokens to a cache of max_len 6 holding 4 raised {error.message}; the contract "
                          "says ValueError", mistake)


def unchanged_after_overflow(run: Run) -> None:
    seen = overflow_script(run)
    if not exactly(seen["length"], 4):
        raise CheckFailed(f"after the refused append (3 tokens past max_len 6), length is {seen['length']!r}; expected "
                          "4, as before it", CHANGED_BEFORE_RAISING)
    for name in ("k", "v"):
        before, after, want = seen[f"{name}_before"], seen[f"{name}_after"], seen[f"{name}1"]
        kept = before[:, :, :4] if isinstance(before, torch.Tensor) and before.dim() == 4 else before
        expect_result(f"{name}[:, :, :4] after the first append", kept, want)
        if not (isinstance(after, torch.Tensor) and isinstance(before, torch.Tensor) and after.shape == before.shape
                and torch.equal(after.nan_to_num(), before.nan_to_num())):
            raise CheckFailed(f"the refused append changed the cache's {name}: check before writing anything",
                              CHANGED_BEFORE_RAISING)


def fills_to_max_len(run: Run) -> None:
    """A cache of max_len 7 takes 4 tokens, then 3: the last slot is the cache's to fill (>= would refuse it)."""
    (k1, k2), (v1, v2) = run.inputs(chunks=(4, 3)).args
    script = Script()
    cache = script.build("KVCache", B, H, DH, 7)
    script.call(cache, "append", k1, v1, names=KV)
    script.call(cache, "append", k2, v2, names=KV, may_raise=True)
    script.get(cache, "length")
    _, result, length = run.script(script).value[1:]
    if isinstance(result, CandidateError):
        mistake = FULL_REFUSED if result.type in ("ValueError", "AssertionError") else None
        raise CheckFailed(f"a cache of max_len 7 holding 4 tokens refused 3 more, which fill it exactly: "
                          f"{result.message}", mistake)
    if not exactly(length, 7):
        raise CheckFailed(f"a cache of max_len 7 took 4 tokens, then 3, and its length is {length!r}; expected 7")
    got = result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None)
    for name, value, want in (("k", got[0], torch.cat([k1, k2], 2)), ("v", got[1], torch.cat([v1, v2], 2))):
        try:
            expect_result(f"the {name} returned by the append that filled the cache", value, want)
        except CheckFailed as failure:  # this check's own script: RETURNS_OLD_PREFIX's test reads a CacheScript
            mistake = failure.mistake or (RETURNS_OLD_PREFIX if _old_prefix(value, want, k2.shape[2]) else None)
            raise CheckFailed(failure.message, mistake, failure.details) from None


def half(run: Run) -> None:
    script = CacheScript(run, dtype=torch.float16)
    for name, buffer in zip("kv", script.initial[:2], strict=True):  # either buffer may ignore it
        if isinstance(buffer, torch.Tensor) and buffer.dtype != torch.float16:
            raise CheckFailed(f"KVCache(..., dtype=torch.float16).{name} is "
                              f"{str(buffer.dtype).removeprefix('torch.')}: make the buffers in the dtype asked for",
                              DTYPE_IGNORED)
    expect_each(run, script, script.call, appends, prefix="in float16: ")


def cache_on_device(run: Run) -> None:
    where = run.ctx.device
    fresh = Script()
    cache = fresh.build("KVCache", B, H, DH, MAX_LEN, **({"device": where} if where != "cpu" else {}))
    fresh.get(cache, "k")
    fresh.get(cache, "v")
    # first, on its own: on the meta device a CPU buffer cannot take a meta append
    for name, buffer in zip("kv", run.script(fresh, device=where).value[1:], strict=True):
        if isinstance(buffer, torch.Tensor) and device_of(buffer).split(":")[0] != where.split(":")[0]:
            raise CheckFailed(f"KVCache(..., device={where!r}).{name} is on {device_of(buffer)}: make the buffers on "
                              "the device asked for", diagnose.RESULT_ON_CPU)
    script = CacheScript(run, device=where)
    expect_each(run, script, script.call, lambda seen: appends(seen, where, Tolerance(0, 0)))


WRONG_AXIS = Mistake(
    "KVCache.wrong_axis", "appended along the wrong axis: write the new (B, H, T, Dh) on axis 2, at "
    "k[:, :, length:length + T]", why="The buffers are (B, H, max_len, Dh): the tokens are axis 2, not the heads'.",
    test=lambda seen, *_: _shape(seen.initial[0]) == (B, MAX_LEN, H, DH),
    raises=Raises(message=r"must match|expanded size|shape mismatch|size mismatch", line=r"\[.*:.*\]|copy_|narrow"))
GROWN_BY_CAT = Mistake(
    "KVCache.grown_by_cat", "the buffers grow (torch.cat onto what is cached): preallocate k and v as "
    "(B, H, max_len, Dh) once and write each append in place",
    why="cat copies the whole cache at every token: quadratic over a sequence.", test=_grown)
LENGTH_NOT_ADVANCED = Mistake(
    "KVCache.length_not_advanced", "length was not advanced: after writing T tokens at [length, length + T), set "
    "length += T", why="Otherwise the next append overwrites them, and what append returns leaves them out.",
    test=lambda seen, *_: any(type(a.length) is int and a.length == 0 for a in seen.appends()))
LENGTH_TWICE = Mistake(
    "KVCache.length_advanced_twice", "length was advanced twice per append (by 2·T): advance it once, after the write",
    test=lambda seen, *_: any(type(a.length) is int and a.length == 2 * a.expected_length for a in seen.appends()))
WHOLE_BUFFER = Mistake(
    "KVCache.returns_whole_buffer", "returned the whole buffer, unused slots included: return k[:, :, :length] and "
    "v[:, :, :length], the positions filled so far", test=_whole_buffer)
RETURNS_OLD_PREFIX = Mistake(
    "KVCache.returns_old_prefix", "returned the positions cached before this append, without the tokens just written: "
    "advance length first, or return k[:, :, :length + T]",
    why="k[:, :, :length] was sliced before length was advanced.",
    test=lambda seen, *_: any(_old_prefix(a.returned_k, a.keys, seen.chunks[a.index]) for a in seen.appends()))
WRITTEN_AFTER_ADVANCING = Mistake(
    "KVCache.written_after_advancing", "k or v was written after length was advanced, at [length + T, length + 2T): "
    "write both at [length, length + T), then advance length", test=_written_after_advancing)
ADDED_NOT_WRITTEN = Mistake(
    "KVCache.added_not_written", "the new keys were added to what the slots held (+=, index_add_): assign them "
    "(k[:, :, a:b] = k_new, or copy_)", test=_nan_written,
    why="Adding is right only while the slots hold zeros: the grader fills the unused slots with NaN.")
FULL_REFUSED = Mistake(
    "KVCache.full_refused", "refused an append that fills the cache exactly (length + T == max_len): raise only "
    "when length + T > max_len", why="The last slot is the cache's to fill; >= refuses it.")
OVERFLOW_NOT_REFUSED = Mistake(
    "KVCache.overflow_not_refused", "an append past max_len was not refused with ValueError: check "
    "length + T > max_len first and raise ValueError",
    why="Without the check, a slice past the end is silently cut short, and the copy into it raises its own "
        "RuntimeError.")
CHANGED_BEFORE_RAISING = Mistake(
    "KVCache.changed_before_raising", "the refused append changed the cache (length advanced, or tokens written) "
    "before raising: check first, then write, then advance")
FITTING_REFUSED = Mistake(
    "KVCache.fitting_append_refused", "refused an append that fits (ValueError with room left): compare length + T "
    "with max_len, the buffers' token axis, and raise only past it",
    raises=Raises(types=("ValueError",), line=r"raise"),
    why="The capacity read from another axis (k.shape[1] is the heads) refuses appends the cache has room for.")
NOT_IN_PLACE = Mistake(
    "KVCache.not_in_place", "after an append, k or v is a new tensor (torch.cat, a clone, a padded copy): preallocate "
    "them once and write each append in place",
    why="A new buffer each append copies the whole cache every token: quadratic over a sequence, and twice the memory "
        "while it copies.")
BUFFERS_SHARED = Mistake(
    "KVCache.buffers_shared", "two caches of one shape share their buffers (a class attribute, a default argument): "
    "make each cache's own k and v in __init__", test=_shared,
    why="A model keeps a cache per layer and per sequence, all alive at once: each append must reach its own cache "
        "only.")
DTYPE_IGNORED = Mistake(
    "KVCache.dtype_ignored", "the buffers ignore the dtype argument (torch.zeros(shape) is float32): pass dtype= and "
    "device= when you make them")

CACHE = StepSpec(
    "KVCache", cache_inputs, lambda ks, vs: None, prefix="cache", plain="appends",
    checks=(
        prop("preallocated", 3, _cache_check(preallocated, probe=True)),
        prop("appends", 4, _cache_check(appends)),
        prop("length", 3, _cache_check(lengths)), prop("contents", 3, _cache_check(contents)),
        prop("two_caches", 1, _cache_check(contents, twin=True)),
        prop("unused_slots_nan", 3, unused_slots_nan), prop("fills_to_max_len", 2, fills_to_max_len),
        prop("overflow_raises", 2, overflow_raises, gated=ALWAYS),
        prop("unchanged_after_overflow", 3, unchanged_after_overflow),
        prop("half", 3, half), prop("device", 3, cache_on_device, gated=ON_META),
    ),
    mistakes=(WRONG_AXIS, GROWN_BY_CAT, LENGTH_NOT_ADVANCED, LENGTH_TWICE, WHOLE_BUFFER, RETURNS_OLD_PREFIX,
              WRITTEN_AFTER_ADVANCING, ADDED_NOT_WRITTEN, FULL_REFUSED, OVERFLOW_NOT_REFUSED, CHANGED_BEFORE_RAISING,
              DTYPE_IGNORED, NOT_IN_PLACE, FITTING_REFUSED, BUFFERS_SHARED),
)
