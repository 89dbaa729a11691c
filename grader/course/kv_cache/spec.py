"""The checks of `kv_cache`: the cache, the decode mask, self-attention that decodes with the cache, and its size.

The cache and the module keep state between calls, so most checks here are scripts
(Candidate.script): build the candidate's objects in one worker, call them in order, read
what they hold, and compare every result here. The unused slots of a cache are filled
with NaN where a check says so: nothing the cache or the module returns may depend on them.

The module is graded on its own wiring: while the candidate's KVCache has lost points it
runs with the worker's stand-in cache (the stub's contract, nothing more), and while
decode_mask has lost points the grader answers its calls, so their bugs are charged to
them. Only the end-to-end check runs the candidate's own cache and mask.
"""

import math
import re
from typing import NamedTuple

import torch

from grader.engine import (
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Raises,
    Run,
    Spec,
    StepSpec,
    Tolerance,
    check_rules,
    device_of,
    diagnose,
    expect_close,
    expect_form,
    gradients,
    linear_layers,
    matches_any,
    prop,
    shape,
    source_of,
    upcast,
    values,
)
from solutions import kv_cache as ref

FLOATS = (torch.float32, torch.float64)
B, H, DH = 2, 3, 4  # batch, heads, head width
D = H * DH  # model width
MAX_LEN = 16  # the cache's room: more than twice the tokens any check appends, so a length advanced twice still fits
CHUNKS = (4, 1, 2)  # tokens per append: a prefill of 4 (not H, so the head axis cannot pass for the token axis), then 1, then 2


# -- scripts ------------------------------------------------------------------------------


def build(cls: str, *init, stand_in: bool = False, state: dict | None = None, **init_kwargs) -> dict:
    return {"do": "build", "class": cls, "init": list(init), "init_kwargs": init_kwargs, "state": state, "stand_in": stand_in}


def call(obj: int, method: str, *args, may_raise: bool = False, refs: dict | None = None) -> dict:
    names = {"append": ("k_new", "v_new"), "__call__": ("x",)}.get(method, ())  # for messages; the worker ignores them
    return {"do": "call", "object": obj, "method": method, "args": list(args), "kwargs": {}, "refs": refs or {},
            "may_raise": may_raise, "names": names}


def get(obj: int, attribute: str) -> dict:
    return {"do": "get", "object": obj, "attribute": attribute}


def fill_unused(obj: int) -> dict:
    return {"do": "fill_unused", "object": obj}


def _pair(value, what: str):
    """An append's answer as (k, v)."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value
    got = f"a {type(value).__name__} of {len(value)}" if isinstance(value, (tuple, list)) else _type(value)
    raise CheckFailed(f"{what} returned {got}; expected a tuple (k, v)")


def _type(value) -> str:
    """What a result that should have been something else is, for a message."""
    return getattr(value, "type_name", None) or f"{type(value).__module__}.{type(value).__qualname__}"


def _same(name: str, got, expected: torch.Tensor, device: str = "cpu", tolerance: Tolerance | None = None) -> None:
    """`got` is a tensor of expected's shape, dtype and device, with its values (unless on the meta device)."""
    try:
        expect_form(got, expected, device=device)
        if device != "meta":
            expect_close(got, expected, None, tolerance)
    except CheckFailed as failure:
        raise CheckFailed(f"{name}: {failure.message}", failure.mistake, failure.details) from None


# -- KVCache ------------------------------------------------------------------------------


def cache_inputs(gen, dtype, chunks=CHUNKS):
    """The new keys and values of each append, (B, H, T, Dh) each; the keys of head h are about h, its values about -h."""
    offset = torch.arange(H, dtype=dtype).view(1, H, 1, 1)
    ks = [torch.as_tensor(gen.randn(B, H, t, DH, dtype=dtype)) * 0.1 + offset for t in chunks]
    vs = [torch.as_tensor(gen.randn(B, H, t, DH, dtype=dtype)) * 0.1 - offset for t in chunks]
    return Call((ks, vs), names=("k_new", "v_new"))


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


class CacheScript:
    """A cache built, then for each chunk: append, read length, k and v; `initial` and `appends` sort the results out."""

    def __init__(self, run: Run, dtype=torch.float32, device: str = "cpu", chunks=CHUNKS, nan: bool = False):
        self.run, self.dtype, self.device, self.chunks = run, dtype, device, chunks
        self.ks, self.vs = run.inputs(dtype=dtype, chunks=chunks).args
        kwargs = {"dtype": dtype} | ({"device": device} if device != "cpu" else {})
        actions = [build("KVCache", B, H, DH, MAX_LEN, **kwargs)] + ([fill_unused(0)] if nan else [])
        self.start = len(actions)
        actions += [get(0, "k"), get(0, "v"), get(0, "length")]
        for k, v in zip(self.ks, self.vs):
            actions += [call(0, "append", k, v), get(0, "length"), get(0, "k"), get(0, "v")]
        self.results = run.script(actions, device=device).value

    @property
    def initial(self):
        return self.results[self.start:self.start + 3]  # k, v, length

    def appends(self):
        """One Append for each chunk, in order."""
        first = self.start + 3
        for i, _ in enumerate(self.chunks):
            returned, length, k, v = self.results[first + 4 * i:first + 4 * i + 4]
            keys, vals = torch.cat(self.ks[:i + 1], dim=2), torch.cat(self.vs[:i + 1], dim=2)
            yield Append(i, returned, length, k, v, keys, vals, keys.shape[2])


def cache_mistake(script: CacheScript):
    """The named mistake the cache's observations show, if any: its buffers' shapes, its lengths, its answers."""
    k0 = script.initial[0]
    if isinstance(k0, torch.Tensor) and tuple(k0.shape) == (B, MAX_LEN, H, DH):
        return WRONG_AXIS
    for a in script.appends():
        if isinstance(a.k, torch.Tensor) and (a.k.dim() != 4 or a.k.shape[2] != MAX_LEN):
            return GROWN_BY_CAT
        if type(a.length) is int and a.length in (0, 2 * a.expected_length) and a.length != a.expected_length:
            return LENGTH_NOT_ADVANCED if a.length == 0 else LENGTH_TWICE
        first = a.returned[0] if isinstance(a.returned, (tuple, list)) and a.returned else None
        if isinstance(first, torch.Tensor) and first.dim() == 4 and first.shape[2] == MAX_LEN != a.expected_length:
            return WHOLE_BUFFER
        if _old_prefix(first, a.keys, script.chunks[a.index]):
            return RETURNS_OLD_PREFIX
    if isinstance(k0, torch.Tensor) and (k0.dim() != 4 or k0.shape[2] != MAX_LEN):
        return GROWN_BY_CAT
    return None


def _old_prefix(returned, keys: torch.Tensor, t: int) -> bool:
    """Is `returned` the keys cached before this append of t tokens (of `keys`, all so far): sliced before advancing?"""
    old = keys.shape[2] - t
    return (isinstance(returned, torch.Tensor) and returned.dim() == 4 and t > 0
            and tuple(returned.shape) == (*keys.shape[:2], old, keys.shape[3])
            and (returned.is_meta or matches_any(returned.to(keys.dtype), [keys[:, :, :old]])))


def _cache_check(look):
    """A check of the cache: the script run, `look(script)` raising CheckFailed, the mistake named from everything seen."""

    def check(run: Run) -> None:
        script = CacheScript(run)
        try:
            look(script)
        except CheckFailed as failure:
            raise CheckFailed(failure.message, failure.mistake or cache_mistake(script), failure.details) from None

    return check


def preallocated(script: CacheScript) -> None:
    k, v, length = script.initial
    for name, buffer in (("k", k), ("v", v)):
        try:
            expect_form(buffer, torch.empty(B, H, MAX_LEN, DH, dtype=script.dtype))
        except CheckFailed as failure:
            raise CheckFailed(f"KVCache({B}, {H}, {DH}, max_len={MAX_LEN}).{name}, just built: {failure.message}; "
                              f"preallocate (B, H, max_len, Dh)") from None
    if length != 0 or type(length) is not int:
        raise CheckFailed(f"a new cache's length is {length!r}; expected 0")
    for a in script.appends():
        if not isinstance(a.k, torch.Tensor) or tuple(a.k.shape) != (B, H, MAX_LEN, DH):
            got = tuple(a.k.shape) if isinstance(a.k, torch.Tensor) else _type(a.k)
            raise CheckFailed(f"after append {a.index + 1}, k is {got}: the buffer must stay (B, H, max_len, Dh) = "
                              f"{(B, H, MAX_LEN, DH)}, written in place")


def appends(script: CacheScript) -> None:
    for a in script.appends():
        k, v = _pair(a.returned, f"append {a.index + 1}")
        _same(f"append {a.index + 1} (after {a.expected_length} tokens in all) returned k", k, a.keys)
        _same(f"append {a.index + 1} returned v", v, a.vals)


def lengths(script: CacheScript) -> None:
    for a in script.appends():
        if type(a.length) is not int:
            raise CheckFailed(f"after append {a.index + 1}, length is {_type(a.length)}, not an int")
        if a.length != a.expected_length:
            raise CheckFailed(f"after appends of {', '.join(map(str, script.chunks[:a.index + 1]))} tokens, length is "
                              f"{a.length}; expected {a.expected_length}")


def contents(script: CacheScript) -> None:
    for a in script.appends():
        n = a.expected_length
        for name, buffer, want in (("k", a.k, a.keys), ("v", a.v, a.vals)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 4 or buffer.shape[2] < n:
                got = tuple(buffer.shape) if isinstance(buffer, torch.Tensor) else _type(buffer)
                raise CheckFailed(f"after append {a.index + 1}, the cache's {name} is {got}; expected (B, H, max_len, Dh) "
                                  f"holding {n} positions")
            _same(f"after append {a.index + 1}, the cache's {name}[:, :, :{n}]", buffer[:, :, :n], want)


def unused_slots_nan(run: Run) -> None:
    script = CacheScript(run, nan=True)
    try:
        appends(script)
        contents(script)
    except CheckFailed as failure:
        mistake = failure.mistake or cache_mistake(script)
        if mistake is None and "NaN" in failure.message:
            mistake = ADDED_NOT_WRITTEN
        raise CheckFailed(f"with NaN in the unused slots: {failure.message}", mistake, failure.details) from None


def overflow_script(run: Run) -> dict:
    """A cache of max_len 6 takes 4 tokens, then is offered 3 more: what it showed before and after, by name."""
    (k1, k2), (v1, v2) = run.inputs(chunks=(4, 3)).args
    actions = [build("KVCache", B, H, DH, 6), call(0, "append", k1, v1), get(0, "k"), get(0, "v"), get(0, "length"),
               call(0, "append", k2, v2, may_raise=True), get(0, "length"), get(0, "k"), get(0, "v")]
    names = ("built", "first", "k_before", "v_before", "length_before", "error", "length", "k_after", "v_after")
    seen = dict(zip(names, run.script(actions).value), k1=k1, v1=v1)
    if seen["length_before"] != 4:  # the append that fits must have worked first
        length = seen["length_before"]
        mistake = {0: LENGTH_NOT_ADVANCED, 8: LENGTH_TWICE}.get(length) if type(length) is int else None
        raise CheckFailed(f"a cache of max_len 6 took 4 tokens, and its length is {length!r}; expected 4", mistake)
    return seen


def overflow_raises(run: Run) -> None:
    error = overflow_script(run)["error"]  # a CandidateError if append raised, else what it returned
    if not isinstance(error, CandidateError):
        raise CheckFailed("a cache of max_len 6 holding 4 tokens took 3 more without complaint: check length + T > max_len "
                          "and raise ValueError", OVERFLOW_NOT_REFUSED)
    if error.type != "ValueError":
        mistake = diagnose.ASSERT_NOT_VALUEERROR if error.type == "AssertionError" else OVERFLOW_NOT_REFUSED
        raise CheckFailed(f"appending 3 tokens to a cache of max_len 6 holding 4 raised {error.message}; the contract says "
                          "ValueError", mistake)


def unchanged_after_overflow(run: Run) -> None:
    seen = overflow_script(run)
    if seen["length"] != 4:
        raise CheckFailed(f"after the refused append (3 tokens past max_len 6), length is {seen['length']!r}; expected 4, "
                          "as before it", CHANGED_BEFORE_RAISING)
    for name in ("k", "v"):
        before, after, want = seen[f"{name}_before"], seen[f"{name}_after"], seen[f"{name}1"]
        _same(f"{name}[:, :, :4] after the first append", before[:, :, :4] if isinstance(before, torch.Tensor) else before, want)
        if not (isinstance(after, torch.Tensor) and isinstance(before, torch.Tensor) and after.shape == before.shape
                and torch.equal(after.nan_to_num(), before.nan_to_num())):
            raise CheckFailed(f"the refused append changed the cache's {name}: check before writing anything",
                              CHANGED_BEFORE_RAISING)


def fills_to_max_len(run: Run) -> None:
    """A cache of max_len 7 takes 4 tokens, then 3: the last slot is the cache's to fill (>= would refuse it)."""
    (k1, k2), (v1, v2) = run.inputs(chunks=(4, 3)).args
    actions = [build("KVCache", B, H, DH, 7), call(0, "append", k1, v1), call(0, "append", k2, v2, may_raise=True),
               get(0, "length")]
    _, _, result, length = run.script(actions).value
    if isinstance(result, CandidateError):
        mistake = FULL_REFUSED if result.type in ("ValueError", "AssertionError") else None
        raise CheckFailed(f"a cache of max_len 7 holding 4 tokens refused 3 more, which fill it exactly: {result.message}",
                          mistake)
    if length != 7:
        raise CheckFailed(f"a cache of max_len 7 took 4 tokens, then 3, and its length is {length!r}; expected 7")
    got = result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None)
    for name, value, want in (("k", got[0], torch.cat([k1, k2], 2)), ("v", got[1], torch.cat([v1, v2], 2))):
        try:
            _same(f"the {name} returned by the append that filled the cache", value, want)
        except CheckFailed as failure:
            mistake = failure.mistake or (RETURNS_OLD_PREFIX if _old_prefix(value, want, k2.shape[2]) else None)
            raise CheckFailed(failure.message, mistake, failure.details) from None


def half(run: Run) -> None:
    script = CacheScript(run, dtype=torch.float16)
    k, _, _ = script.initial
    if isinstance(k, torch.Tensor) and k.dtype != torch.float16:
        raise CheckFailed(f"KVCache(..., dtype=torch.float16).k is {str(k.dtype).removeprefix('torch.')}: make the buffers "
                          "in the dtype asked for", DTYPE_IGNORED)
    try:
        appends(script)
    except CheckFailed as failure:
        raise CheckFailed(f"in float16: {failure.message}", failure.mistake or cache_mistake(script), failure.details) from None


def cache_on_device(run: Run) -> None:
    where = run.ctx.device
    kwargs = {"device": where} if where != "cpu" else {}
    fresh = run.script([build("KVCache", B, H, DH, MAX_LEN, **kwargs), get(0, "k"), get(0, "v")], device=where).value
    for name, buffer in zip("kv", fresh[1:]):  # first, on its own: on the meta device a CPU buffer cannot take a meta append
        if isinstance(buffer, torch.Tensor) and device_of(buffer).split(":")[0] != where.split(":")[0]:
            raise CheckFailed(f"KVCache(..., device={where!r}).{name} is on {device_of(buffer)}: make the buffers on the "
                              "device asked for", diagnose.RESULT_ON_CPU)
    script = CacheScript(run, device=where)
    try:
        for a in script.appends():
            k, v = _pair(a.returned, f"append {a.index + 1}")
            _same(f"on {where}, append {a.index + 1} returned k", k, a.keys, where, Tolerance(0, 0))
            _same(f"on {where}, append {a.index + 1} returned v", v, a.vals, where, Tolerance(0, 0))
    except CheckFailed as failure:
        raise CheckFailed(failure.message, failure.mistake or cache_mistake(script), failure.details) from None


WRONG_AXIS = Mistake(
    "KVCache.wrong_axis", "appended along the wrong axis: the tokens are axis 2 of (B, H, max_len, Dh); write the new "
    "(B, H, T, Dh) at k[:, :, length:length + T]", raises=Raises(message=r"must match|expanded size|shape mismatch|size mismatch",
                                                                  line=r"\[.*:.*\]|copy_|narrow"))
GROWN_BY_CAT = Mistake(
    "KVCache.grown_by_cat", "the buffers grow (torch.cat onto what is cached): preallocate k and v as (B, H, max_len, Dh) "
    "once and write each append in place; cat copies the whole cache at every token, quadratic over a sequence")
LENGTH_NOT_ADVANCED = Mistake(
    "KVCache.length_not_advanced", "length was not advanced: after writing T tokens at [length, length + T), set "
    "length += T, or the next append overwrites them")
LENGTH_TWICE = Mistake(
    "KVCache.length_advanced_twice", "length was advanced twice per append (by 2·T): advance it once, after the write")
WHOLE_BUFFER = Mistake(
    "KVCache.returns_whole_buffer", "returned the whole buffer, unused slots included: return k[:, :, :length] and "
    "v[:, :, :length], the positions filled so far")
RETURNS_OLD_PREFIX = Mistake(
    "KVCache.returns_old_prefix", "returned the positions cached before this append, without the tokens just written (sliced "
    "k[:, :, :length] before advancing length): advance length first, or return k[:, :, :length + T]")
ADDED_NOT_WRITTEN = Mistake(
    "KVCache.added_not_written", "the new keys were added to what the slots held (+=, index_add_) instead of written: "
    "that is right only while the slots hold zeros; assign them (k[:, :, a:b] = k_new, or copy_)")
FULL_REFUSED = Mistake(
    "KVCache.full_refused", "refused an append that fills the cache exactly (length + T == max_len): the last slot is "
    "yours to fill; raise only when length + T > max_len (>= refuses it)")
OVERFLOW_NOT_REFUSED = Mistake(
    "KVCache.overflow_not_refused", "an append past max_len was not refused with ValueError (a slice silently cut short, "
    "or the copy's own RuntimeError): check length + T > max_len first and raise ValueError")
CHANGED_BEFORE_RAISING = Mistake(
    "KVCache.changed_before_raising", "the refused append changed the cache (length advanced, or tokens written) before "
    "raising: check first, then write, then advance")
DTYPE_IGNORED = Mistake(
    "KVCache.dtype_ignored", "the buffers ignore the dtype argument (torch.zeros(shape) is float32): pass dtype= and device= "
    "when you make them")

CACHE = StepSpec(
    "KVCache", cache_inputs, lambda ks, vs: None, prefix="cache",
    checks=(
        prop("preallocated", 3, _cache_check(preallocated)), prop("appends", 4, _cache_check(appends)),
        prop("length", 3, _cache_check(lengths)), prop("contents", 4, _cache_check(contents)),
        prop("unused_slots_nan", 3, unused_slots_nan), prop("fills_to_max_len", 2, fills_to_max_len),
        prop("overflow_raises", 2, overflow_raises),
        prop("unchanged_after_overflow", 3, unchanged_after_overflow), prop("half", 3, half), prop("device", 3, cache_on_device),
    ),
    mistakes=(WRONG_AXIS, GROWN_BY_CAT, LENGTH_NOT_ADVANCED, LENGTH_TWICE, WHOLE_BUFFER, RETURNS_OLD_PREFIX, ADDED_NOT_WRITTEN,
              FULL_REFUSED, OVERFLOW_NOT_REFUSED, CHANGED_BEFORE_RAISING, DTYPE_IGNORED),
)

# -- decode_mask --------------------------------------------------------------------------


def mask_inputs(gen, dtype, t_new=3, past_len=4):
    return Call((t_new, past_len), names=("t_new", "past_len"))


def mask_reference(t_new, past_len, device=None):
    """The reference, made on the CPU (the worker moves the grader's answer to a device the module asks for)."""
    return ref.decode_mask(t_new, past_len)


def mask_on_device(run: Run) -> None:
    """decode_mask(t_new, past_len, device) builds the mask on the device asked for."""
    where = run.ctx.device
    value = run.output(run.answer(Call((3, 4, where), names=("t_new", "past_len", "device")), device=where))
    got = device_of(value) if isinstance(value, torch.Tensor) else where
    if got.split(":")[0] != where.split(":")[0]:
        raise CheckFailed(f"expected the mask on {where}, the device asked for, got it on {got}", diagnose.RESULT_ON_CPU)
    run.expect_right(value, mask_inputs(run.gen, None), where)


def _ones(t_new, past_len):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool)


TOP_LEFT = ("aligned to the top-left (new token i sees keys 0 … i): new token i sits at position past_len + i and sees "
            "every cached key too, keys 0 … past_len + i: tril(diagonal=past_len)")

MASK = StepSpec(
    "decode_mask", mask_inputs, mask_reference,
    checks=(
        shape(2), values("prefill", 3, t_new=5, past_len=0), values("one_token", 3, t_new=1, past_len=6),
        values("chunk", 4, t_new=3, past_len=5), prop("device", 3, mask_on_device),
    ),
    mistakes=(
        Mistake("decode_mask.top_left", TOP_LEFT, lambda t, p, device=None: _ones(t, p).tril()),
        Mistake("decode_mask.square", "returned a (t_new, t_new) mask (a causal mask of the new tokens alone, or [:T, :T] of "
                "a bigger one): the keys are every cached token and the new ones, (t_new, past_len + t_new)",
                lambda t, p, device=None: torch.ones(t, t, dtype=torch.bool).tril()),
        Mistake("decode_mask.inverted", "mask convention inverted: True must mean 'may attend'",
                lambda t, p, device=None: ~ref.decode_mask(t, p)),
        Mistake("decode_mask.no_diagonal", "a new token cannot see its own key (< where <= belongs, or tril(diagonal=past_len "
                "- 1)): new token i sits at position past_len + i and sees keys 0 … past_len + i, itself included",
                lambda t, p, device=None: _ones(t, p).tril(p - 1)),
        Mistake("decode_mask.not_causal", "every new token may see every key: a new token must not see the new tokens "
                "after it (only with t_new = 1 is the mask all True)", lambda t, p, device=None: _ones(t, p)),
    ),
)

# -- CachedSelfAttention ------------------------------------------------------------------

T = sum(CHUNKS)  # tokens in a module check's sequence


def module_inputs(gen, dtype, bias=True, t=T):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": torch.as_tensor(gen.randn(D, D, dtype=dtype, scale=D**-0.5)) for n in names}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(D, dtype=dtype, scale=0.1)) for n in names})
    x = gen.randn(B, t, D, dtype=dtype)
    return Call((x,), {}, ("x",), init=(D, H), init_kwargs={"bias": bias}, state=state)


def _heads(y):
    b, t, _ = y.shape
    return y.view(b, t, H, DH).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)


def _proj(state, y, name):
    return y @ state[f"{name}.weight"].T + state.get(f"{name}.bias", 0)


def cached(state, x, splits=None, *, bug=None):
    """The module's outputs for x fed in chunks of `splits` (None: one call, no cache), from the contract;
    `bug` makes the named wrong variants."""
    with_cache = splits is not None
    splits = splits or (x.shape[1],)
    ks, vs, outs, start = [], [], [], 0
    for t in splits:
        chunk = x[:, start:start + t]
        q, k, v = (_heads(_proj(state, chunk, n)) for n in ("w_q", "w_k", "w_v"))
        past = start  # tokens before this call
        ks.append(k)
        vs.append(v)
        keys, vals = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        mask = ref.decode_mask(t, past)
        if bug == "top_left":
            mask = torch.ones(t, past + t, dtype=torch.bool).tril()
        elif (bug == "no_mask_with_cache" and past) or (bug == "no_mask_given_a_cache" and with_cache):
            mask = torch.ones(t, past + t, dtype=torch.bool)
        elif bug == "keys_attended_twice" and with_cache:  # the cache's answer, and this call's keys again
            keys, vals = torch.cat([keys, k], dim=2), torch.cat([vals, v], dim=2)
            mask = ref.decode_mask(t, past + t)
        elif bug == "appended_twice" and with_cache:  # every call's keys twice in the cache, all of them attended
            ks.append(k)
            vs.append(v)
            keys, vals = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
            mask = ref.decode_mask(t, keys.shape[2] - t)
        elif bug == "cache_ignored":
            keys, vals, mask = k, v, ref.decode_mask(t, 0)
        elif bug == "no_mask_without_cache" and not with_cache:
            mask = torch.ones(t, t, dtype=torch.bool)
        elif bug == "length_after_append" and with_cache:  # decode_mask(T, past_len + T), its first columns kept to fit
            mask = ref.decode_mask(t, past + t)[:, :past + t]
        root = {"unscaled": 1.0, "scaled_by_embed_dim": math.sqrt(D)}.get(bug, math.sqrt(DH))
        scores = (q @ keys.transpose(-2, -1) / root).masked_fill(~mask, float("-inf"))
        y = torch.softmax(scores, dim=-2 if bug == "softmax_query_axis" else -1) @ vals
        merged = y.reshape(chunk.shape) if bug == "merge_no_transpose" else y.transpose(1, 2).reshape(chunk.shape)
        outs.append(merged if bug == "no_output_projection" else _proj(state, merged, "w_o"))
        start += t
    return torch.cat(outs, dim=1)


def _variant(bug):
    return lambda state, x, splits=None: cached(state, x, splits, bug=bug)


def _has_nan(value, *args, **kwargs):
    return isinstance(value, torch.Tensor) and bool(torch.isnan(value.to(torch.float64)).any())


class ModuleScript:
    """The module built with the grader's weights, a cache (the candidate's, or the worker's stand-in), and x fed in chunks."""

    def __init__(self, run: Run, splits=(3, 1, 2, 1), dtype=torch.float32, device: str = "cpu", nan: bool = False,
                 contents: bool = False, bias: bool = True, no_cache_first: bool = False):
        self.run, self.splits, self.device = run, tuple(splits), device
        self.call = run.inputs(dtype=dtype, bias=bias, t=sum(splits))
        x = self.call.args[0]
        kwargs = {"dtype": dtype} | ({"device": device} if device != "cpu" else {})
        own = run.check.end_to_end or run.ctx.passed("KVCache")  # a cache that lost points is the stand-in's to play
        actions = [build("CachedSelfAttention", *self.call.init, state=self.call.state, **self.call.init_kwargs),
                   build("KVCache", B, H, DH, MAX_LEN, stand_in=not own, **kwargs)]
        if nan:
            actions.append(fill_unused(1))
        if no_cache_first:  # a call without a cache first: the rules hold on both paths
            actions.append(call(0, "__call__", x))
        self.outputs, start = [], 0
        for t in splits:
            self.outputs.append(len(actions))
            actions.append(call(0, "__call__", x[:, start:start + t].contiguous(), refs={"cache": 1}))
            if contents:
                actions += [get(1, "length"), get(1, "k"), get(1, "v")]
            start += t
        answer = run.script(actions, device=device)
        self.results, self.called = answer.value, answer.called

    def expect_right(self) -> None:
        expect_outputs(self.call, self.splits, [self.results[i] for i in self.outputs], self.device,
                       source_of(self.run.ctx.source, self.run.step.id))


def expect_outputs(call_: Call, splits: tuple, outputs: list, device: str = "cpu", source: str = "") -> None:
    """Each call's output is the full causal forward's at its tokens; the mistake named if one explains them.

    `source` is the module's source: a mistake recognised both by a wrong answer and by an exception raised
    in a source of its own (Raises.source) is named from its answer only in such a source too.
    """
    x, state = call_.args[0], call_.state
    native = cached(state, x)  # in the input's dtype, for the form and the half types' tolerance
    exact = cached(upcast(state), upcast(x))
    tolerance = Tolerance.of(native, exact, device)
    got, start = [], 0
    what = f"x of {sum(splits)} tokens fed in calls of {', '.join(map(str, splits))}"
    try:
        for value, t in zip(outputs, splits):
            expect_form(value, native[:, start:start + t], device=device)
            got.append(value)
            start += t
        if device == "meta":
            return
        expect_close(torch.cat(got, dim=1), exact, None, tolerance)
    except CheckFailed as failure:
        mistake = failure.mistake or _module_mistake(call_, splits, outputs, got, native, device, source)
        raise CheckFailed(f"{what}: {failure.message}", mistake, failure.details) from None


def _module_mistake(call_: Call, splits: tuple, outputs: list, got: list, native, device: str, source: str = ""):
    """The named mistake the outputs show: a wrong form, NaN from the unused slots, or one of the step's wrong variants."""
    if len(got) != len(splits):
        start = sum(splits[:len(got)])
        return diagnose.form(outputs[len(got)], native[:, start:start + splits[len(got)]], device=device)
    value = torch.cat(got, dim=1)
    if _has_nan(value):
        return WHOLE_BUFFER_MASKED
    x, state = call_.args[0], call_.state
    for mistake in MODULE.mistakes:
        if mistake.variant is None or (mistake.raises and mistake.raises.source
                                       and not re.search(mistake.raises.source, source)):
            continue
        if matches_any(value, [mistake.variant(state, x, splits)]):
            return mistake
    return None


def _module_check(**options):
    def check(run: Run) -> None:
        ModuleScript(run, **options).expect_right()

    return check


def every_split(run: Run) -> None:
    """A prefill of s tokens then one token a call, for every split point s: each gives the full forward's outputs."""
    call_ = run.inputs(t=T)
    x = call_.args[0]
    own = run.ctx.passed("KVCache")
    actions, outputs = [build("CachedSelfAttention", *call_.init, state=call_.state, **call_.init_kwargs)], {}
    for s in range(1, T):
        cache = len([a for a in actions if a["do"] == "build"])
        actions.append(build("KVCache", B, H, DH, MAX_LEN, stand_in=not own, dtype=x.dtype))
        splits = (s,) + (1,) * (T - s)
        outputs[splits], start = [], 0
        for t in splits:
            outputs[splits].append(len(actions))
            actions.append(call(0, "__call__", x[:, start:start + t].contiguous(), refs={"cache": cache}))
            start += t
    results = run.script(actions).value
    for splits, indices in outputs.items():
        expect_outputs(call_, splits, [results[i] for i in indices], source=source_of(run.ctx.source, run.step.id))


def cache_contents(run: Run) -> None:
    """After each call the cache holds every token's keys and values so far, heads split, as w_k and w_v give them."""
    script = ModuleScript(run, contents=True)
    x, state = script.call.args[0], script.call.state
    keys, vals = (_heads(_proj(upcast(state), upcast(x), n)) for n in ("w_k", "w_v"))
    start = 0
    for index, t in zip(script.outputs, script.splits):
        start += t
        length, k, v = script.results[index + 1:index + 4]
        if length != start:
            raise CheckFailed(f"after calls of {', '.join(map(str, script.splits[:script.outputs.index(index) + 1]))} tokens "
                              f"the cache's length is {length!r}; expected {start}: append each call's keys once",
                              APPENDED_TWICE if length == 2 * start else None)
        for name, buffer, want in (("k", k, keys), ("v", v, vals)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 4 or buffer.shape[2] < start:
                raise CheckFailed(f"the cache's {name} is not a (B, H, max_len, Dh) tensor")
            try:
                expect_close(buffer[:, :, :start], want[:, :, :start])
            except CheckFailed as failure:
                scaled = buffer[:, :, :start].double() * math.sqrt(DH)
                mistake = CACHED_SCALED_KEYS if name == "k" and torch.allclose(scaled, want[:, :, :start], atol=1e-5) else None
                raise CheckFailed(f"after {start} tokens, the cache's {name}[:, :, :{start}] is not this layer's {name}, heads "
                                  f"split (B, H, T, Dh): {failure.message}", mistake, failure.details) from None


def module_rules(run: Run) -> None:
    """No forbidden call, with a cache or without."""
    script = ModuleScript(run, no_cache_first=True)
    check_rules(script.called, run.ctx.forbidden.get(run.step.id, ()), run.ctx.source, source_of(run.ctx.source, run.step.id))
    script.expect_right()


def module_end_to_end(run: Run) -> None:
    """The module with the candidate's own KVCache and decode_mask: does the whole thing decode?"""
    try:
        ModuleScript(run, splits=(3, 2, 1, 1), nan=True).expect_right()
    except CheckFailed as failure:
        calls = ["KVCache"] + (["decode_mask"] if "decode_mask" in source_of(run.ctx.source, run.step.id) else [])
        # With a step it calls broken, what the outputs look like says little about the module itself
        mistake = failure.mistake if all(run.ctx.passed(name) for name in calls) else None
        raise CheckFailed(failure.message, mistake, {**failure.details, "calls": calls}, failure.outcome) from None


WHOLE_BUFFER_MASKED = Mistake(
    "CachedSelfAttention.whole_buffer_masked", "attended over the whole buffer with its unused slots masked: a masked slot "
    "still multiplies its value by 0, and 0 · NaN is NaN; attend over the positions filled so far only (what append returns)")
APPENDED_TWICE = Mistake(
    "CachedSelfAttention.appended_twice", "appended each call's keys and values to the cache twice: append once, and "
    "attend over what that append returns", _variant("appended_twice"))
CACHED_SCALED_KEYS = Mistake(
    "CachedSelfAttention.cached_scaled_keys", "the cache holds k / √Dh: it holds the keys as w_k gives them, heads split; "
    "scale the scores (q @ kᵀ / √Dh) instead")

MODULE = StepSpec(
    "CachedSelfAttention", module_inputs, cached, module=True, prefix="module", answered=("decode_mask",),
    checks=(
        prop("structure", 2, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, H), "an nn.Linear")),
        values("no_cache", 3, FLOATS), prop("decode", 5, _module_check(splits=(4, 1, 1, 1))),
        prop("every_split", 6, every_split), prop("chunked", 6, _module_check(splits=(3, 2, 2))),
        prop("unused_slots_nan", 4, _module_check(nan=True)), prop("cache_contents", 4, cache_contents),
        prop("half", 2, _module_check(dtype=torch.float16)), prop("rules", 2, module_rules),
        prop("device", 2, lambda run: ModuleScript(run, device=run.ctx.device).expect_right()),
        prop("gradients", 3, gradients()), prop("end_to_end", 3, module_end_to_end, end_to_end=True),
    ),
    mistakes=(
        Mistake("CachedSelfAttention.top_left_mask", TOP_LEFT.replace("new token i", "with a cache, new token i", 1),
                _variant("top_left")),
        Mistake("CachedSelfAttention.length_after_append", "past_len was read after the append, which already counts the new "
                "tokens: the mask came out (T, past_len + 2T), and cut to fit the scores it lets every new token see every "
                "key, its future ones too; read cache.length before appending", _variant("length_after_append"),
                raises=Raises(message=r"must match the size|broadcast|shape mismatch|Expected size", source=r"\.append\([\s\S]*\.length\b")),
        Mistake("CachedSelfAttention.square_mask", "a (T, T) causal mask ([:T, :T] of a bigger one) with T new tokens after a "
                "cache: the scores are (T, past_len + T); use decode_mask(T, past_len)",
                raises=Raises(message=r"must match the size|broadcast|shape mismatch",
                              line=r"\[\s*:\s*\w+\s*,\s*:\s*\w+\s*\]|\(\s*\w+\s*,\s*\w+\s*(,\s*dtype[^)]*)?\)\.tril\(\)")),
        Mistake("CachedSelfAttention.no_mask_with_cache", "no mask when a cache is given: one new token may see every key, "
                "but several new tokens (a chunked prefill) must not see the ones after them; use decode_mask(T, past_len)",
                lambda *a, **k: [cached(*a, **k, bug=form) for form in ("no_mask_with_cache", "no_mask_given_a_cache")]),
        Mistake("CachedSelfAttention.keys_attended_twice", "the new keys were attended twice (append's answer, which holds "
                "them already, concatenated with them again): attend over what append returns, as it is",
                _variant("keys_attended_twice")),
        Mistake("CachedSelfAttention.cache_ignored", "attended over this call's tokens only: the cache's keys and values are "
                "the point; attend over what append returns", _variant("cache_ignored")),
        Mistake("CachedSelfAttention.no_mask_without_cache", "no causal mask without a cache: a call without one is a "
                "whole sequence, and each token must not see the ones after it; mask with decode_mask(T, 0) then too",
                _variant("no_mask_without_cache")),
        Mistake("CachedSelfAttention.unscaled", "scores not scaled: divide q @ kᵀ by √Dh", _variant("unscaled")),
        Mistake("CachedSelfAttention.scaled_by_embed_dim", "scaled by √embed_dim instead of √head_dim",
                _variant("scaled_by_embed_dim")),
        Mistake("CachedSelfAttention.softmax_query_axis", "softmax over the query axis (dim=-2): each query's weights "
                "must sum to 1 over the keys, dim=-1", _variant("softmax_query_axis")),
        Mistake("CachedSelfAttention.merge_no_transpose", "merged the heads without moving the head axis back: (B, H, T, Dh) "
                "reshaped to (B, T, D) mixes tokens and heads; transpose(1, 2) before the reshape",
                _variant("merge_no_transpose")),
        Mistake("CachedSelfAttention.no_output_projection", "forgot the output projection: apply w_o after merging the heads",
                _variant("no_output_projection")),
        WHOLE_BUFFER_MASKED, APPENDED_TWICE, CACHED_SCALED_KEYS,
    ),
)

# -- kv_cache_bytes -----------------------------------------------------------------------


def bytes_inputs(gen, dtype, b=1, layers=32, kv_heads=8, head_dim=128, seq_len=8192, of=torch.bfloat16):
    return Call((b, layers, kv_heads, head_dim, seq_len, of),
                names=("batch_size", "num_layers", "num_kv_heads", "head_dim", "seq_len", "dtype"))


def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _bytes(b, layers, kv_heads, head_dim, seq_len, dtype, *, factor=2, unit=1, itemsize=None):
    return factor * layers * b * kv_heads * head_dim * seq_len * (itemsize or _itemsize(dtype)) * unit


def bytes_check(**params):
    """A check: kv_cache_bytes gives the exact count, as an int."""

    def check(run: Run) -> None:
        call_ = run.inputs(**params)
        value = run.output(run.answer(call_))
        expected = _bytes(*call_.args)
        what = f"kv_cache_bytes({', '.join(map(repr, call_.args))})"
        if type(value) is not int:
            got = _type(value)
            raise CheckFailed(f"{what} returned {got}{f' {value!r}' if isinstance(value, float) else ''}; expected an int",
                              NOT_INT)
        if value != expected:
            mistake = next((m for m, wrong in BYTES_MISTAKES if wrong(*call_.args) == value), None)
            raise CheckFailed(f"{what} = {value:,}; expected {expected:,} ({expected / 2**30:g} GiB)", mistake,
                              {"expected": expected, "got": value})

    return check


NOT_INT = Mistake("kv_cache_bytes.not_int", "returned a float or a tensor: a count of bytes is an int (// not /, and "
                  "int(...) around a tensor's numel)")
NO_FACTOR_TWO = Mistake("kv_cache_bytes.no_factor_two", "counted the keys only: the cache holds keys and values, a factor 2")
IN_BITS = Mistake("kv_cache_bytes.in_bits", "counted bits (itemsize · 8, or finfo(dtype).bits): the answer is in bytes")
FIXED_ITEMSIZE = Mistake("kv_cache_bytes.fixed_itemsize", "assumed 2 bytes per element whatever the dtype: use the dtype's "
                         "own (torch.empty((), dtype=dtype).element_size(), or dtype.itemsize)")
BYTES_MISTAKES = (
    (NO_FACTOR_TWO, lambda *a: _bytes(*a, factor=1)),
    (IN_BITS, lambda *a: _bytes(*a, unit=8)),
    (FIXED_ITEMSIZE, lambda *a: _bytes(*a, itemsize=2)),
)

BYTES = StepSpec(
    "kv_cache_bytes", bytes_inputs, _bytes,
    checks=(
        prop("llama_8b_gqa", 3, bytes_check()), prop("llama_8b_mha", 2, bytes_check(kv_heads=32)),
        prop("batch_and_float32", 3, bytes_check(b=4, layers=2, kv_heads=3, head_dim=64, seq_len=100, of=torch.float32)),
        prop("int8", 2, bytes_check(b=2, layers=3, kv_heads=1, head_dim=16, seq_len=7, of=torch.int8)),
    ),
    mistakes=(NOT_INT, NO_FACTOR_TWO, IN_BITS, FIXED_ITEMSIZE),
)

SPEC = Spec((CACHE, MASK, MODULE, BYTES))
