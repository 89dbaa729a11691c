"""The checks of `kv_cache`: the cache, the decode mask, self-attention that decodes with the cache, and its size.

The cache and the module keep state between calls, so most checks here are scripts
(grader/engine/script.py): build the candidate's objects in one worker, call them in order,
read what they hold, and compare every result here. The unused slots of a cache are filled
with NaN where a check says so: nothing the cache or the module returns may depend on them.

A cache script's record (CacheScript) is the answer its mistakes' tests read, and the module's
outputs are matched with its mistakes' wrong answers, which `cached` computes: both are named
through Run.explain, as every other step's answers are.

The module is graded on its own wiring: while the candidate's KVCache has lost points it
runs with the stand-in cache (stand_ins.py beside this file: the stub's contract, nothing
more), and while decode_mask has lost points the grader answers its calls, so their bugs are
charged to them. Only the end-to-end check runs the candidate's own cache and mask, and the check of
what the module reads (`reads_cache`) always runs the stand-in, whose k and v are what append returns.
"""

import math

import torch

from grader.engine import (
    ON_META,
    Call,
    CandidateError,
    CheckFailed,
    Mistake,
    Raises,
    Run,
    Script,
    Spec,
    StepSpec,
    attention,
    check_rules,
    chunks,
    defaults,
    device_of,
    diagnose,
    exactly,
    expect_chunks,
    expect_close,
    expect_count,
    expect_joined,
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

from .cache import CACHE, CHUNKS, DH, FLOATS, KV, MAX_LEN, B, D, H, X, _pair, _shape, fill_unused  # noqa: F401

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
        raise CheckFailed(f"expected the mask on {where}, the device asked for, got it on {got}",
                          diagnose.RESULT_ON_CPU)
    run.expect_right(value, mask_inputs(run.gen, None), where)


def _ones(t_new, past_len):
    return torch.ones(t_new, past_len + t_new, dtype=torch.bool)


TOP_LEFT = "aligned to the top-left (new token i sees keys 0 … i): use tril(diagonal=past_len)"
AT_PAST_LEN = "New token i sits at position past_len + i and sees every cached key too, keys 0 … past_len + i."

MASK = StepSpec(
    "decode_mask", mask_inputs, mask_reference,
    checks=(
        shape(2), values("prefill", 3, t_new=5, past_len=0), values("one_token", 3, t_new=1, past_len=6),
        values("chunk", 4, t_new=3, past_len=5), prop("device", 3, mask_on_device, gated=ON_META),
    ),
    mistakes=(
        Mistake("decode_mask.top_left", TOP_LEFT, lambda t, p, device=None: _ones(t, p).tril(), why=AT_PAST_LEN),
        Mistake("decode_mask.square", "returned a (t_new, t_new) mask: the keys are every cached token and the new "
                "ones, (t_new, past_len + t_new)", lambda t, p, device=None: torch.ones(t, t, dtype=torch.bool).tril(),
                why="A causal mask of the new tokens alone, or [:T, :T] of a bigger one, leaves out the cached keys."),
        Mistake("decode_mask.inverted", "mask convention inverted: True must mean 'may attend'",
                lambda t, p, device=None: ~ref.decode_mask(t, p)),
        Mistake("decode_mask.no_diagonal", "a new token cannot see its own key (< where <= belongs, or "
                "tril(diagonal=past_len - 1)): use tril(diagonal=past_len)",
                lambda t, p, device=None: _ones(t, p).tril(p - 1),
                why="New token i sits at position past_len + i and sees keys 0 … past_len + i, itself included."),
        Mistake("decode_mask.not_causal", "every new token may see every key: a new token must not see the new tokens "
                "after it; use tril(diagonal=past_len)", lambda t, p, device=None: _ones(t, p),
                why="Only with t_new = 1 is the mask all True."),
    ),
)

# -- CachedSelfAttention ------------------------------------------------------------------

T = sum(CHUNKS)  # tokens in a module check's sequence
EVERY_SPLIT = [(s,) + (1,) * (T - s) for s in range(1, T)]  # a prefill of s tokens, then one a call


def module_inputs(gen, dtype, bias=True, t=T):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": torch.as_tensor(gen.randn(D, D, dtype=dtype, scale=D**-0.5)) for n in names}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(D, dtype=dtype, scale=0.1)) for n in names})
    x = gen.randn(B, t, D, dtype=dtype)
    return Call((x,), {}, X, init=(D, H), init_kwargs={"bias": bias}, state=state)


def _heads(y):
    b, t, _ = y.shape
    return y.view(b, t, H, DH).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)


def _proj(state, y, name):
    return y @ state[f"{name}.weight"].T + state.get(f"{name}.bias", 0)


def cached(state, x, splits=None, *, bug: str | None = None, form: int = 0):
    """The module's outputs for x fed in chunks of `splits` (None: one call, no cache), from the contract.

    `bug`, the id of one of the step's mistakes, makes its wrong answer instead (`form`: which of its forms).
    """
    with_cache = splits is not None
    splits = splits or (x.shape[1],)
    ks, vs, outs, past = [], [], [], 0
    for t, chunk in zip(splits, chunks(x, splits), strict=True):
        q, k, v = (_heads(_proj(state, chunk, n)) for n in ("w_q", "w_k", "w_v"))
        ks.append(k)
        vs.append(v)
        keys, vals = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
        mask = ref.decode_mask(t, past)  # past: the tokens before this call
        if bug == TOP_LEFT_MASK.id:
            mask = attention.causal_mask(t, past + t, top_left=True)
        elif bug == NO_MASK_WITH_CACHE.id and (past if form == 0 else with_cache):  # once it holds some; given one
            mask = _ones(t, past)
        elif bug == KEYS_ATTENDED_TWICE.id and with_cache:  # the cache's answer, and this call's keys again
            keys, vals = torch.cat([keys, k], dim=2), torch.cat([vals, v], dim=2)
            mask = ref.decode_mask(t, past + t)
        elif bug == APPENDED_TWICE.id and with_cache:  # every call's keys twice in the cache, all of them attended
            ks.append(k)
            vs.append(v)
            keys, vals = torch.cat(ks, dim=2), torch.cat(vs, dim=2)
            mask = ref.decode_mask(t, keys.shape[2] - t)
        elif bug == CACHE_IGNORED.id:
            keys, vals, mask = k, v, ref.decode_mask(t, 0)
        elif bug == NO_MASK_WITHOUT_CACHE.id and not with_cache:
            mask = _ones(t, 0)
        elif bug == LENGTH_AFTER_APPEND.id and with_cache:  # decode_mask(T, past_len + T), its first columns kept
            mask = ref.decode_mask(t, past + t)[:, :past + t]
        width = {UNSCALED.id: 1, SCALED_BY_EMBED_DIM.id: D}.get(bug)
        y = attention.attend(q, keys, vals, mask, width=width, softmax_dim=-2 if bug == SOFTMAX_QUERY_AXIS.id else -1,
                             empty_rows="nan")
        merged = y.reshape(chunk.shape) if bug == MERGE_NO_TRANSPOSE.id else y.transpose(1, 2).reshape(chunk.shape)
        outs.append(merged if bug == NO_OUTPUT_PROJECTION.id else _proj(state, merged, "w_o"))
        past += t
    return torch.cat(outs, dim=1)


def _mistake(name: str, message: str, forms: int = 1, **recognisers) -> Mistake:
    """A mistake of the module, whose wrong answer `cached` makes under the mistake's id (of several forms, a list)."""
    mistake_id = f"CachedSelfAttention.{name}"

    def variant(state, x, splits=None):
        answers = [cached(state, x, splits, bug=mistake_id, form=form) for form in range(forms)]
        return answers if forms > 1 else answers[0]

    return Mistake(mistake_id, message, variant, **recognisers)


class ModuleScript:
    """The module built with the grader's weights, then x fed in chunks of `splits` with a cache (the candidate's, or
    the stand-in); `splits` may be a list of them, each fed with a fresh cache."""

    def __init__(self, run: Run, splits=(3, 1, 2, 1), dtype=torch.float32, device: str = "cpu", nan: bool = False,
                 contents: bool = False, bias: bool = True, no_cache_first: bool = False):
        self.run, self.device = run, device
        self.feeds = [tuple(splits)] if isinstance(splits[0], int) else [tuple(s) for s in splits]
        self.splits = self.feeds[0]
        self.call = run.inputs(dtype=dtype, bias=bias, t=sum(self.splits))
        x = self.call.args[0]
        own = run.check.end_to_end or run.ctx.passed("KVCache")  # a cache that lost points is the stand-in's to play
        script = Script()
        module = script.build("CachedSelfAttention", *self.call.init, state=self.call.state, **self.call.init_kwargs)
        self.outputs = []  # for each feed, the index of each call's output
        for feed in self.feeds:
            cache = script.build("KVCache", B, H, DH, MAX_LEN, stand_in=not own, dtype=dtype,
                                 **({"device": device} if device != "cpu" else {}))
            if nan:  # a cache that could not be filled is the cache's loss, in its own checks
                fill_unused(script, cache)
            if no_cache_first:  # a call without a cache first: the rules hold on both paths
                script.call(module, "__call__", x, names=X)
            self.outputs.append([])
            for chunk in chunks(x, feed):
                self.outputs[-1].append(script.call(module, "__call__", chunk, names=X, refs={"cache": cache}))
                if contents:
                    for name in ("length", "k", "v"):
                        script.get(cache, name)
        answer = run.script(script, device=device)
        self.results, self.called = answer.value, answer.called

    def expect_right(self) -> None:
        for feed, indices in zip(self.feeds, self.outputs, strict=True):
            expect_chunks(self.run, self.call, feed, [self.results[i] for i in indices], self.device)


def _module_check(**options):
    return lambda run: ModuleScript(run, **options).expect_right()


def cache_contents(run: Run) -> None:
    """After each call the cache holds every token's keys and values so far, heads split, as w_k and w_v give them."""
    script = ModuleScript(run, contents=True)
    x, state = script.call.args[0], script.call.state
    keys, vals = (_heads(_proj(upcast(state), upcast(x), n)) for n in ("w_k", "w_v"))
    start = 0
    for number, (index, t) in enumerate(zip(script.outputs[0], script.splits, strict=True), 1):
        start += t
        length, k, v = script.results[index + 1:index + 4]
        if not exactly(length, start):  # a tensor of several entries has no truth value (the thirty-ninth review's f01)
            raise CheckFailed(f"after calls of {', '.join(map(str, script.splits[:number]))} tokens the cache's length "
                              f"is {length!r}; expected {start}: append each call's keys once",
                              APPENDED_TWICE if exactly(length, 2 * start) else None)
        for name, buffer, want in (("k", k, keys), ("v", v, vals)):
            if not isinstance(buffer, torch.Tensor) or buffer.dim() != 4 or buffer.shape[2] < start:
                raise CheckFailed(f"the cache's {name} is not a (B, H, max_len, Dh) tensor")
            try:
                expect_close(buffer[:, :, :start], want[:, :, :start])
            except CheckFailed as failure:
                scaled = buffer[:, :, :start].double() * math.sqrt(DH)
                scaled_keys = (name == "k" and scaled.shape == want[:, :, :start].shape
                               and torch.allclose(scaled, want[:, :, :start], atol=1e-5))
                raise CheckFailed(f"after {start} tokens, the cache's {name}[:, :, :{start}] is not this layer's "
                                  f"{name}, heads split (B, H, T, Dh): {failure.message}",
                                  CACHED_SCALED_KEYS if scaled_keys else None, failure.details) from None


def module_rules(run: Run) -> None:
    """No forbidden call, with a cache or without."""
    script = ModuleScript(run, no_cache_first=True)
    check_rules(script.called, run.ctx.forbidden.get(run.step.id, ()), run.ctx.source,
                source_of(run.ctx.source, run.step.id))
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


K_FILL, V_FILL = 0.5, -1.5  # what the grader writes into a cache's keys and values after a prefill


def _over_filled(state, x, prefill: int):
    """The outputs for the tokens after `prefill` when the cache's keys and values of the prefill's positions are
    K_FILL and V_FILL: attention over what the cache holds, whatever computed it."""
    t = x.shape[1] - prefill
    q, k, v = (_heads(_proj(state, x, n)) for n in ("w_q", "w_k", "w_v"))
    k, v = k.clone(), v.clone()
    k[:, :, :prefill], v[:, :, :prefill] = K_FILL, V_FILL
    y = attention.attend(q[:, :, prefill:], k, v, ref.decode_mask(t, prefill))
    return _proj(state, y.transpose(1, 2).reshape(x.shape[0], t, D), "w_o")


def reads_cache(run: Run, prefill: int = 4, splits=(1, 2)) -> None:
    """After a prefill the grader writes values of its own into every slot of the cache (the stand-in's: its k and
    v are the buffers); the calls after it must attend over them, not over keys and values the module kept."""
    call = run.inputs(t=prefill + sum(splits))
    x, state = call.args[0], call.state
    script = Script()
    module = script.build("CachedSelfAttention", *call.init, state=state, **call.init_kwargs)
    cache = script.build("KVCache", B, H, DH, MAX_LEN, stand_in=True)
    parts = chunks(x, (prefill, *splits))
    script.call(module, "__call__", parts[0], names=X, refs={"cache": cache})
    script.fill(cache, ("k",), axis=2, start=0, value=K_FILL)
    script.fill(cache, ("v",), axis=2, start=0, value=V_FILL)
    at = [script.call(module, "__call__", part, names=X, refs={"cache": cache}) for part in parts[1:]]
    results = run.script(script).value
    native, exact = _over_filled(state, x, prefill), _over_filled(upcast(state), upcast(x), prefill)
    what = (f"after a prefill of {prefill} tokens the grader set the cache's k to {K_FILL} and v to {V_FILL}; then "
            f"calls of {', '.join(map(str, splits))} tokens")
    got = []
    try:
        expect_joined([results[i] for i in at], splits, native, exact, got=got)
    except CheckFailed as failure:
        unfilled = cached(state, x, (prefill, *splits))[:, prefill:]  # over the module's own keys and values
        whole = torch.cat(got, dim=1) if len(got) == len(splits) else None  # every chunk of the right form
        mistake = CACHE_NOT_READ if whole is not None and matches_any(whole, [unfilled]) else None
        raise CheckFailed(f"{what}: {failure.message}", failure.mistake or mistake, failure.details) from None


def other_sequence_first(run: Run, splits=(3, 1, 2, 1)) -> None:
    """Another sequence runs through the module with a cache of its own first; then the checked one, with a fresh
    cache, must give what a fresh module gives: nothing of the first may stay on the module."""
    call = run.inputs(t=sum(splits))
    x = call.args[0]
    other = Call((-0.5 * x.flip(1),), call.kwargs, call.names, call.init, call.init_kwargs, call.state)
    own = run.ctx.passed("KVCache")
    script = Script()
    module = script.build("CachedSelfAttention", *call.init, state=call.state, **call.init_kwargs)
    feeds = []
    for seq, may_raise in ((other, False), (call, True)):  # the first sequence's own failures are said as usual
        cache = script.build("KVCache", B, H, DH, MAX_LEN, stand_in=not own)
        feeds.append([script.call(module, "__call__", part, names=X, refs={"cache": cache}, may_raise=may_raise)
                      for part in chunks(seq.args[0], splits)])
    results = run.script(script).value
    expect_chunks(run, other, splits, [results[i] for i in feeds[0]])
    outputs = [results[i] for i in feeds[1]]
    what = "after another sequence ran through the module, a sequence with a fresh cache"
    raised = next((o for o in outputs if isinstance(o, CandidateError)), None)
    if raised is not None:
        raise CheckFailed(f"{what} raised {raised.message}", STATE_ACROSS_SEQUENCES)
    try:
        expect_chunks(run, call, splits, outputs)
    except CheckFailed as failure:
        raise CheckFailed(f"{what}: {failure.message}", STATE_ACROSS_SEQUENCES, failure.details) from None


def no_bias(run: Run) -> None:
    """Built with bias=False, the module has no bias at all (the grader's weights fill every parameter), and decodes."""
    call = run.inputs(bias=False)
    result = run.answer(call).value
    if result.get("unloaded"):
        raise CheckFailed(f"built with bias=False, the module has {', '.join(map(str, result['unloaded']))}: pass "
                          "bias=bias to every nn.Linear", diagnose.PARAMETERS_NOT_LOADED)
    run.expect_right(result["output"], call)
    ModuleScript(run, bias=False).expect_right()


TOP_LEFT_MASK = _mistake("top_left_mask", TOP_LEFT.replace("new token i", "with a cache, new token i", 1),
                         why=AT_PAST_LEN)
LENGTH_AFTER_APPEND = _mistake(
    "length_after_append", "past_len was read after the append, which already counts the new tokens: read "
    "cache.length before appending",
    why="The mask came out (T, past_len + 2T); cut to fit the scores, it lets every new token see every key, its "
        "future ones too.",
    raises=Raises(message=r"must match the size|broadcast|shape mismatch|Expected size",
                  source=r"\.append\([\s\S]*\.length\b"))
SQUARE_MASK = Mistake(
    "CachedSelfAttention.square_mask", "a (T, T) causal mask ([:T, :T] of a bigger one) with T new tokens after a "
    "cache: the scores are (T, past_len + T); use decode_mask(T, past_len)",
    raises=Raises(message=r"must match the size|broadcast|shape mismatch",
                  line=r"\[\s*:\s*\w+\s*,\s*:\s*\w+\s*\]|\(\s*\w+\s*,\s*\w+\s*(,\s*dtype[^)]*)?\)\.tril\(\)"))
NO_MASK_WITH_CACHE = _mistake(
    "no_mask_with_cache", "no mask when a cache is given: new tokens must not see the ones after them; use "
    "decode_mask(T, past_len)", forms=2,
    why="One new token may see every key, but several (a chunked prefill) must not see those after them.")
KEYS_ATTENDED_TWICE = _mistake(
    "keys_attended_twice", "the new keys were attended twice (append's answer, which holds them already, concatenated "
    "with them again): attend over what append returns, as it is")
CACHE_IGNORED = _mistake(
    "cache_ignored", "attended over this call's tokens only: the cache's keys and values are the point; attend over "
    "what append returns")
NO_MASK_WITHOUT_CACHE = _mistake(
    "no_mask_without_cache", "no causal mask without a cache: mask with decode_mask(T, 0) then too",
    why="A call without a cache is a whole sequence, and each token must not see the ones after it.")
UNSCALED = _mistake("unscaled", "scores not scaled: divide q @ kᵀ by √Dh")
SCALED_BY_EMBED_DIM = _mistake("scaled_by_embed_dim", "scaled by √embed_dim: scale by √head_dim, one head's width")
SOFTMAX_QUERY_AXIS = _mistake(
    "softmax_query_axis", "softmax over the query axis (dim=-2): each query's weights must sum to 1 over the keys, "
    "dim=-1")
MERGE_NO_TRANSPOSE = _mistake(
    "merge_no_transpose", "merged the heads without moving the head axis back: (B, H, T, Dh) reshaped to (B, T, D) "
    "mixes tokens and heads; transpose(1, 2) before the reshape")
NO_OUTPUT_PROJECTION = _mistake(
    "no_output_projection", "forgot the output projection: apply w_o after merging the heads")
WHOLE_BUFFER_MASKED = Mistake(
    "CachedSelfAttention.whole_buffer_masked", "attended over the whole buffer with its unused slots masked: attend "
    "over the positions filled so far only (what append returns)",
    why="A masked slot still multiplies its value by 0, and 0 · NaN is NaN: the grader fills the unused slots with "
        "NaN.",
    test=lambda value, state, x, splits=None: splits is not None and bool(torch.isnan(value.double()).any()))
APPENDED_TWICE = _mistake(
    "appended_twice", "appended each call's keys and values to the cache twice: append once, and attend over what "
    "that append returns")
CACHE_NOT_READ = Mistake(
    "CachedSelfAttention.cache_not_read", "attended over keys and values the module kept itself (on self, or "
    "recomputed), not over the cache's: attend over what cache.append returns",
    why="The cache is the one record of the sequence: a caller may trim it, move it or fill it from elsewhere, and "
        "a copy on the module holds every token twice.")
STATE_ACROSS_SEQUENCES = Mistake(
    "CachedSelfAttention.state_across_sequences", "a fresh cache gave other answers after another sequence ran "
    "through the module: it kept state of its own (a position counter, keys); read the position from cache.length",
    why="One module serves many sequences, each with its own cache: everything a sequence needs lives in its cache.")
CACHED_SCALED_KEYS = Mistake(
    "CachedSelfAttention.cached_scaled_keys", "the cache holds k / √Dh: it holds the keys as w_k gives them, heads "
    "split; scale the scores (q @ kᵀ / √Dh) instead")

MODULE = StepSpec(
    "CachedSelfAttention", module_inputs, cached, module=True, prefix="module", answered=("decode_mask",),
    checks=(
        prop("structure", 1, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, H), "an nn.Linear")),
        prop("no_bias", 2, no_bias), prop("defaults", 2, defaults()),
        values("no_cache", 2, FLOATS), prop("decode", 3, _module_check(splits=(4, 1, 1, 1))),
        prop("every_split", 5, _module_check(splits=EVERY_SPLIT)), prop("chunked", 4, _module_check(splits=(3, 2, 2))),
        prop("unused_slots_nan", 3, _module_check(nan=True)), prop("cache_contents", 3, cache_contents),
        prop("reads_cache", 4, reads_cache), prop("other_sequence_first", 2, other_sequence_first),
        prop("half", 2, _module_check(dtype=torch.float16)), prop("rules", 2, module_rules),
        prop("device", 2, lambda run: ModuleScript(run, device=run.ctx.device).expect_right(), gated=ON_META),
        prop("gradients", 3, gradients()), prop("end_to_end", 3, module_end_to_end, end_to_end=True),
    ),
    mistakes=(TOP_LEFT_MASK, LENGTH_AFTER_APPEND, SQUARE_MASK, NO_MASK_WITH_CACHE, KEYS_ATTENDED_TWICE, CACHE_IGNORED,
              NO_MASK_WITHOUT_CACHE, UNSCALED, SCALED_BY_EMBED_DIM, SOFTMAX_QUERY_AXIS, MERGE_NO_TRANSPOSE,
              NO_OUTPUT_PROJECTION, WHOLE_BUFFER_MASKED, APPENDED_TWICE, CACHED_SCALED_KEYS, CACHE_NOT_READ,
              STATE_ACROSS_SEQUENCES),
)

# -- kv_cache_bytes -----------------------------------------------------------------------


def bytes_inputs(gen, dtype, b=1, layers=32, kv_heads=8, head_dim=128, seq_len=8192, of=torch.bfloat16, drawn=False):
    """`drawn`: every size drawn with inputs.Gen.unknown (the file's text under the draw key), so that no table of
    counts passes: one learned from earlier grades changes the file, and so the sizes."""
    if drawn:
        b, layers, kv_heads, seq_len = (int(torch.randint(1, top, (), generator=gen.unknown))
                                        for top in (9, 49, 17, 9000))
        head_dim = 16 * int(torch.randint(1, 17, (), generator=gen.unknown))
    return Call((b, layers, kv_heads, head_dim, seq_len, of),
                names=("batch_size", "num_layers", "num_kv_heads", "head_dim", "seq_len", "dtype"))


def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _bytes(b, layers, kv_heads, head_dim, seq_len, dtype, *, factor=2, unit=1, itemsize=None, one_layer=False):
    layers = 1 if one_layer else layers
    return factor * layers * b * kv_heads * head_dim * seq_len * (itemsize or _itemsize(dtype)) * unit


def _same_count(value, expected, *_) -> None:
    """A count of bytes is right only exactly, as an int (how Run.explain matches it with a mistake's count too)."""
    if type(value) is not int or value != expected:
        raise CheckFailed(f"expected {expected:,}, got {value!r}")


def bytes_check(**params):
    """A check: kv_cache_bytes gives the exact count, as an int, for the sizes given and for sizes drawn."""

    def check(run: Run) -> None:
        for drawn in (False, True):
            expect_count(run, run.inputs(**params, drawn=drawn), NOT_INT, lambda n: f" ({n / 2**30:g} GiB)")

    return check


NOT_INT = Mistake("kv_cache_bytes.not_int", "returned a float or a tensor: a count of bytes is an int (// not /, and "
                  "int(...) around a tensor's numel)")

BYTES = StepSpec(
    "kv_cache_bytes", bytes_inputs, _bytes, compare=_same_count,
    checks=(
        prop("llama_8b_gqa", 3, bytes_check()), prop("llama_8b_mha", 2, bytes_check(kv_heads=32)),
        prop("batch_and_float32", 3,
             bytes_check(b=4, layers=2, kv_heads=3, head_dim=64, seq_len=100, of=torch.float32)),
        prop("int8", 2, bytes_check(b=2, layers=3, kv_heads=1, head_dim=16, seq_len=7, of=torch.int8)),
    ),
    mistakes=(
        NOT_INT,
        Mistake("kv_cache_bytes.no_factor_two", "counted the keys only: the cache holds keys and values, a factor 2",
                lambda *a: _bytes(*a, factor=1)),
        Mistake("kv_cache_bytes.in_bits", "counted bits (itemsize · 8, or finfo(dtype).bits): the answer is in bytes",
                lambda *a: _bytes(*a, unit=8)),
        Mistake("kv_cache_bytes.layers_left_out", "counted one layer's cache: every layer keeps its own keys and "
                "values, so multiply by num_layers", lambda *a: _bytes(*a, one_layer=True)),
        Mistake("kv_cache_bytes.fixed_itemsize", "assumed 2 bytes per element whatever the dtype: use the dtype's own "
                "(torch.empty((), dtype=dtype).element_size(), or dtype.itemsize)", lambda *a: _bytes(*a, itemsize=2)),
    ),
)

SPEC = Spec((CACHE, MASK, MODULE, BYTES))
