"""The checks of `paged_attention`: the block pool, paged decoding, packed variable-length attention, and
self-attention that serves a batch from the pool.

The pool and the module keep state between calls, so their checks are scripts
(grader/engine/script.py): build the candidate's objects in one worker, call them in order,
read what they hold, and compare every result here (the pool's in cache.py beside this file).
The two functions are checked as any function step is (functions.py), their inputs a pool of
shuffled blocks and packed batches whose lengths differ and do not divide the block size.

The module is graded on its own wiring: while the candidate's PagedKVCache has lost points it
runs with the stand-in pool (stand_ins.py beside this file: the stub's contract, nothing more),
and while paged_decode or varlen_attention has lost points the grader answers their calls, so
their bugs are charged to them. Only the end-to-end check runs the candidate's own pool and
functions.
"""

import math
from typing import NamedTuple

import torch

from grader.engine import (
    ALWAYS,
    Call,
    CheckFailed,
    Mistake,
    Raises,
    Run,
    Script,
    Spec,
    StepSpec,
    Tolerance,
    diagnose,
    expect_close,
    expect_form,
    linear_layers,
    matches_any,
    prop,
    source_of,
    type_name,
)

from .cache import BLOCK, CACHE, DH, H
from .functions import DECODE, VARLEN, _cu

D = H * DH  # model width
STREAMS = (9, 8, 10)  # each sequence's tokens in all
SEQ_IDS = (11, 4, 7)  # the ids the module is given for them
POOL_BLOCKS = 10  # room for all three, two blocks to spare
PREFILL_DECODE = ({0: 5, 1: 3, 2: 8}, {0: 1, 1: 1, 2: 1}, {0: 1, 1: 1, 2: 1})  # a batch prefilled, decoded twice
JOINING = ({0: 4}, {0: 1}, {1: 6, 0: 1}, {1: 1, 0: 2}, {2: 3}, {0: 1, 1: 1, 2: 1})  # sequences joining, chunks
# mixed with single tokens (a batch whose first sequence brings one token is no decode), a batch whose order is not
# the ids', decoding all three at the end
X = ("x",)
K_FILL, V_FILL = 0.5, -1.5  # what the grader writes into every slot of the pool after the first call (`reads_pool`)
# reads_pool's: after the refill, a decode and then a batch of chunks, so that both paths must read the pool (review
# 71's F2 prefilled from keys of its own and decoded from the pool)
REFILLED = (*PREFILL_DECODE[:2], {0: 2, 1: 3, 2: 1})


def module_inputs(gen, dtype, bias=True):
    names = ("w_q", "w_k", "w_v", "w_o")
    state = {f"{n}.weight": torch.as_tensor(gen.randn(D, D, dtype=dtype, scale=D**-0.5)) for n in names}
    if bias:
        state.update({f"{n}.bias": torch.as_tensor(gen.randn(D, dtype=dtype, scale=0.1)) for n in names})
    streams = tuple(torch.as_tensor(gen.randn(n, D, dtype=dtype)) for n in STREAMS)
    return Call((streams,), {}, X, init=(D, H), init_kwargs={"bias": bias}, state=state)


def _proj(state, y, name, bias=True, stored=False):
    """y through the layer `name`; `stored`: its weight multiplied as nn.Linear stores it, (out, in)."""
    weight = state[f"{name}.weight"]
    return y @ (weight if stored else weight.T) + (state.get(f"{name}.bias", 0) if bias else 0)


def served(state, streams, schedule=PREFILL_DECODE, *, refilled: bool = False, bug: str | None = None,
           only: str | None = None, merged_inner: bool = False):
    """Every call's outputs of `schedule`, concatenated in call order, from the contract: each new token attends
    causally to its own sequence. `refilled`: after the first call every key and value the pool holds is K_FILL and
    V_FILL (the grader wrote them there). `bug`, the id of one of the module's mistakes, makes its wrong answer
    instead; with `only` ("decode" or "prefill"), in that path's calls only (a module with two paths may get one of
    them wrong); `merged_inner`: the heads merged back as (Dh, H), as the split inner undone."""
    split = (lambda y: y.view(-1, DH, H).transpose(1, 2)) if bug == HEADS_SPLIT_INNER.id else (
        lambda y: y.view(-1, H, DH))  # (N, H, Dh): heads outer, or the features read as (Dh, H)
    heads = [tuple(split(_proj(state, x, n, bug != BIAS_DROPPED.id)) for n in ("w_q", "w_k", "w_v")) for x in streams]
    if bug == QKV_PER_HEAD.id:  # one fused projection, [q | k | v], read as (N, H, 3, Dh): each head's thirds
        heads = [tuple(torch.cat([_proj(state, x, n) for n in ("w_q", "w_k", "w_v")], -1).view(-1, H, 3, DH).unbind(2))
                 for x in streams]
    done, outputs = [0] * len(streams), []
    for call in schedule:
        ids = [i for i, t in call.items() if t]
        decoding = all(call[i] == 1 for i in ids)
        wrong = bug if only is None or only == ("decode" if decoding else "prefill") else None
        packed = [torch.cat([heads[i][n][:done[i] + call[i]] for i in ids]) for n in (1, 2)]  # every key, gathered
        first = 0  # where the sequence's new tokens start among the call's
        width = -(-(done[ids[0]] + call[ids[0]]) // BLOCK)  # the first sequence's blocks, after the append
        for i in ids:
            q, k, v = heads[i]
            past, t = done[i], call[i]
            offset, first = first, first + t
            for p in range(past, past + t):
                lo, hi = 0, p  # the keys token p reads, first and last
                if wrong == NOT_CAUSAL.id and not decoding:
                    hi = past + t - 1
                elif wrong == NEW_ONLY.id:
                    lo = past
                elif wrong == LENGTHS_BEFORE.id:
                    hi = p - t
                elif wrong == TABLES_CUT.id and decoding:
                    hi = min(hi, width * BLOCK - 1)
                keys = slice(lo, max(hi + 1, lo))  # none when hi < lo
                read_k, read_v = k[keys], v[keys]
                if wrong == NEW_KEYS_TWICE.id:  # the pool's keys (the new ones included), then the new ones again
                    read_k, read_v = (torch.cat([x[:past + t], x[past:p + 1]]) for x in (k, v))
                if wrong == VALUES_FROM_KEYS.id:
                    read_v = read_k
                if wrong == KEYS_AT_QUERIES.id:  # the packed keys where its queries are, causally, as if no cache
                    read_k, read_v = (x[offset:offset + p - past + 1] for x in packed)
                scale = DH if wrong == SCALED_TWICE.id else math.sqrt(DH)  # q scaled, then the scores again
                scores = torch.einsum("hd,nhd->hn", q[p], read_k) / scale  # (H, keys)
                y = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), read_v)  # (H, Dh), 0 for no key
                y = (y.T if merged_inner else y).reshape(D)
                outputs.append(y if wrong == NO_OUTPUT_PROJECTION.id else
                               _proj(state, y, "w_o", stored=wrong == OUTPUT_AS_STORED.id))
            done[i] += t
        if refilled and call is schedule[0]:
            heads = [(q, _filled(k, K_FILL, n), _filled(v, V_FILL, n))
                     for (q, k, v), n in zip(heads, done, strict=True)]
    return torch.stack(outputs)


def _filled(t: torch.Tensor, value: float, n: int) -> torch.Tensor:
    """t with its first n positions set to value."""
    t = t.clone()
    t[:n] = value
    return t  # (all the new tokens of every call, D)


def _mistake(name: str, message: str, why: str = "") -> Mistake:
    mistake_id = f"PagedSelfAttention.{name}"
    return Mistake(mistake_id, message, lambda *a, **kw: [served(*a, **kw, bug=mistake_id, only=only)
                                                          for only in (None, "decode", "prefill")], why=why)


BIAS_DROPPED = _mistake(
    "bias_dropped", "right with bias=False, wrong with the default bias=True: the q, k and v projections' biases were "
    "left out (a fused product of the weights alone); add each layer's bias", why="A fused projection "
    "x @ cat([w_q.weight, w_k.weight, w_v.weight]).T needs the biases concatenated too.")
NEW_KEYS_TWICE = _mistake(
    "new_keys_twice", "the new tokens' keys and values were added again after the ones gathered from the pool, which "
    "holds them already after the append: attend over the pool's keys only")
NOT_CAUSAL = _mistake(
    "not_causal", "several new tokens of a sequence attended to each other's future: call varlen_attention with "
    "causal=True", why="One new token may see every key; a prefill or a chunk must not see the tokens after it.")
NEW_ONLY = _mistake(
    "new_tokens_only", "attended over this call's keys only: the new tokens see every key their sequence holds, read "
    "from the pool after the append")
LENGTHS_BEFORE = _mistake(
    "lengths_before_append", "read the sequences' lengths before appending: the new tokens then miss their own keys; "
    "append first, then read seq_len (in the decode path too)",
    why="The context of a new token includes itself; a decode path that builds context_lens for paged_decode before "
        "the append leaves each new token without its own key.")
NO_OUTPUT_PROJECTION = _mistake("no_output_projection",
                                "forgot the output projection: apply w_o after merging the heads")
QKV_PER_HEAD = _mistake(
    "fused_qkv_split_per_head", "a fused [q | k | v] projection was viewed as (N, H, 3, Dh): view it as (N, 3, H, "
    "Dh), or split(D, dim=-1) first", why="Its thirds are q, k and v whole, each head's features inside each.")
OUTPUT_AS_STORED = _mistake(
    "output_weight_as_stored", "multiplied by w_o's weight as nn.Linear stores it, (out, in): y @ w_o.weight.T, or "
    "call self.w_o(y)", why="The model width in and out is the same, so the product runs and is wrong.")
KEYS_AT_QUERIES = _mistake(
    "key_offsets_from_queries", "cut the gathered keys with the queries' cu_seqlens: each sequence holds seq_len "
    "keys, so pass cu_seqlens_k of those lengths, not cu_seqlens",
    why="After a cache, a sequence has more keys than new tokens: the packed keys' offsets are their own.")
VALUES_FROM_KEYS = _mistake(
    "values_from_key_pool", "read the values from the key pool (k_cache where v_cache belongs): gather each "
    "sequence's values from cache.v_cache")
TABLES_CUT = _mistake(
    "tables_cut_to_first", "padded the decode's block tables to the first sequence's width: make them as wide as the "
    "longest table, so no sequence loses its later blocks",
    why="Sequences of one batch hold different numbers of blocks; a later, longer one would attend to its first "
        "blocks' keys only.")
SCALED_TWICE = _mistake(
    "scaled_twice", "the queries were scaled by 1/√Dh before paged_decode or varlen_attention, which scale the "
    "scores themselves: pass q as projected", why="Each function's contract includes the 1/√Dh; scaling q as well "
    "divides the scores by Dh.")
CU_SEQLENS_MALFORMED = Mistake(
    "PagedSelfAttention.cu_seqlens_malformed", "varlen_attention was given cu_seqlens that do not run from 0 to the "
    "packed rows: build them as [0, *cumsum(lengths)], B + 1 entries",
    raises=Raises(message=r"cu_seqlens must run from 0"))


def _stale_rows(schedule) -> list[int]:
    """The rows of `served`'s outputs whose sequence holds more blocks than after the first call it was in: those a
    block table kept from that call no longer covers."""
    done, first, rows, row = {}, {}, [], 0
    for call in schedule:
        for i in (i for i, t in call.items() if t):
            done[i] = done.get(i, 0) + call[i]
            blocks = -(-done[i] // BLOCK)
            first.setdefault(i, blocks)
            rows += range(row, row + call[i]) if blocks > first[i] else []
            row += call[i]
    return rows


def _wrong_only_at(rows_of):
    """A mistake's test: the answer is wrong somewhere, and only at the rows `rows_of(schedule)` lists."""

    def test(value, state, streams, schedule=PREFILL_DECODE, refilled=False) -> bool:
        right = served(state, streams, schedule, refilled=refilled).to(value.dtype)
        if value.shape != right.shape:
            return False
        wrong = ~torch.isclose(value, right, rtol=1e-3, atol=1e-4).all(dim=-1)
        expected = torch.zeros_like(wrong)
        expected[rows_of(schedule)] = True
        return bool(wrong.any()) and bool((wrong <= expected).all())

    return test


TABLES_MEMOISED = Mistake(
    "PagedSelfAttention.tables_memoised", "kept each sequence's block table from the first call it was in: ask the "
    "cache for block_table(seq_id) at every call, after the append", test=_wrong_only_at(_stale_rows),
    why="The table grows whenever the sequence takes a new block; a copy kept from its first call misses every later "
        "block's keys.")
HEADS_SPLIT_INNER = Mistake(
    "PagedSelfAttention.heads_split_inner", "the projections were split as (N, Dh, H), heads inner: head h owns "
    "features h·Dh … (h + 1)·Dh − 1, so view(N, H, Dh)",
    lambda *a, **kw: [served(*a, **kw, bug=HEADS_SPLIT_INNER.id, merged_inner=inner) for inner in (False, True)],
    why="view(N, Dh, H).transpose(1, 2) has the right shape, but each head gets every H-th feature, and w_o's "
        "columns expect heads outer.")
HEADS_MERGED_INNER = Mistake(
    "PagedSelfAttention.heads_merged_inner", "the heads were merged as (N, Dh, H), heads inner: the output here is "
    "(N, H, Dh), so reshape(N, H·Dh) as it is", lambda *a, **kw: served(*a, **kw, merged_inner=True),
    why="A transpose(1, 2) kept from the (B, H, T, Dh) layout puts each head's features apart, and w_o's columns "
        "expect head h's at h·Dh … (h + 1)·Dh − 1.")


def _walked_by_id(state, streams, schedule=PREFILL_DECODE, refilled: bool = False, appended: bool = False):
    """The outputs of a module that walked each call's sequences in the order of their ids, sorted, while x's rows
    and cu_seqlens stay in the order given: the b-th slice of rows goes to the b-th sequence by id, its keys appended
    there and its queries attending there; `appended`, each sequence's own tokens appended right, and only the
    lengths, tables and keys read in the order of ids (slice b's queries over that sequence's keys, bottom-right).
    The same order at every call of the same sequences is right by chance (each sequence keeps one stream's tokens);
    a batch of others mixes them."""
    heads = [tuple(_proj(state, x, n).view(-1, H, DH) for n in ("w_q", "w_k", "w_v")) for x in streams]
    done, held, outputs = [0] * len(streams), {}, []
    for call in schedule:
        ids = [i for i, t in call.items() if t]
        rows = []
        for i in ids:
            rows.append(tuple(part[done[i]:done[i] + call[i]] for part in heads[i]))
            done[i] += call[i]
        by_id = sorted(ids, key=lambda i: SEQ_IDS[i])
        for owner, (_, k, v) in zip(ids if appended else by_id, rows, strict=True):
            keys, values = held.get(owner, (k[:0], v[:0]))
            held[owner] = (torch.cat([keys, k]), torch.cat([values, v]))
        for owner, (q, _, _) in zip(by_id, rows, strict=True):
            keys, values = held[owner]
            for r in range(len(q)):
                seen = max(len(keys) - len(q) + r + 1, 0)  # bottom-right: the last query sees every key
                scores = torch.einsum("hd,nhd->hn", q[r], keys[:seen]) / math.sqrt(DH)  # (H, keys)
                y = torch.einsum("hn,nhd->hd", torch.softmax(scores, -1), values[:seen])  # (H, Dh), 0 for no key
                outputs.append(_proj(state, y.reshape(D), "w_o"))
        if refilled and call is schedule[0]:
            held = {i: (torch.full_like(k, K_FILL), torch.full_like(v, V_FILL)) for i, (k, v) in held.items()}
    return torch.stack(outputs)


BATCH_REORDERED = Mistake(
    "PagedSelfAttention.batch_reordered", "walked the batch's sequences in another order than seq_ids gives (sorted, "
    "say) while x's rows stay as given: sequence b is seq_ids[b], its rows cu_seqlens[b]:cu_seqlens[b + 1]",
    lambda *a, **kw: [_walked_by_id(*a, **kw, appended=appended) for appended in (False, True)],
    why="A batch whose order never changes hides it: each sequence keeps the same rows. A server batches whichever "
        "sequences are ready, in any order (blind sets 59's b08 and, its appends right, 60's b10).")


def _opening_rows(schedule) -> list[int]:
    """The rows of `served`'s outputs that are one-token decodes opening a new block (their position a multiple of
    BLOCK): the tokens whose own key sits in a block their table gets only at the append."""
    done, rows, row = {}, [], 0
    for call in schedule:
        ids = [i for i, t in call.items() if t]
        decoding = all(call[i] == 1 for i in ids)
        for i in ids:
            for p in range(done.get(i, 0), done.get(i, 0) + call[i]):
                if decoding and p % BLOCK == 0:
                    rows.append(row)
                row += 1
            done[i] = done.get(i, 0) + call[i]
    return rows


TABLE_BEFORE_APPEND = Mistake(
    "PagedSelfAttention.table_before_append", "took the block tables before appending: a decoded token that opens a "
    "new block finds -1 where its own key's block belongs; append first, then read block_table and seq_len",
    why="Only the tokens at a multiple of block_size show it: every other new token lands in a block the table "
        "already holds; a prefill, whose sequence has no block yet, finds none at all.",
    test=_wrong_only_at(_opening_rows),
    raises=Raises(types=("IndexError", "KeyError", "RuntimeError"), line=r"table|block",
                  # a table short of a block (too few keys to reshape), read before the cache's append (a sequence
                  # id first: a list's append takes one argument, the seventy-eighth review's F3; a method of that
                  # name defined above, or a read in another method, is none, the seventy-ninth's F3)
                  source=r"(?<!def )block_table\((?:(?!\n\s*def )[\s\S])*\.append\(\s*[\w.]+(\[[^\]\n]*\])?\s*,"))
NAN_READ = Mistake(
    "PagedSelfAttention.unused_slots_read", "read slots of the pool no sequence holds (a whole block, or a −1 of a "
    "table): gather each sequence's first seq_len tokens only",
    why="The grader fills the pool with NaN before anything is appended: a slot read before it is written shows.",
    test=lambda value, *_, **__: bool(torch.isnan(value.double()).any()))

POOL_INTERNALS = Mistake(
    "PagedSelfAttention.pool_internals_read", "read an attribute of the pool its contract does not name: use only "
    "append, seq_len, block_table, k_cache and v_cache, since the grader may hand over a pool of its own",
    why="The module serves whatever pool the server owns; a pool's bookkeeping (its tables, lengths, free list) is "
        "its own business, named as its author chose.",
    raises=Raises(types=("AttributeError",), message=r"'PagedKVCache' object has no attribute"))


class ServeScript:
    """The module built with the grader's weights and a pool (the candidate's, or the stand-in), then the calls of
    `schedule`: each one the new tokens of some sequences, packed."""

    def __init__(self, run: Run, schedule=PREFILL_DECODE, nan: bool = False, bias: bool = True,
                 refill: bool = False, answers=None):
        self.run, self.schedule, self.refill = run, schedule, refill
        self.call = run.inputs(bias=bias)
        streams = self.call.args[0]
        # a pool that lost points is the stand-in's; so is the one refilled, whose k_cache and v_cache are the pool
        own = (run.check.end_to_end or run.ctx.passed("PagedKVCache")) and not refill
        script = Script()
        module = script.build("PagedSelfAttention", *self.call.init, state=self.call.state, **self.call.init_kwargs)
        pool = script.build("PagedKVCache", POOL_BLOCKS, BLOCK, H, DH, stand_in=not own)
        if nan:
            script.fill(pool, ("k_cache", "v_cache"), axis=0, start=0)
        done, self.outputs, self.sizes = [0] * len(streams), [], []
        for call in schedule:
            ids = [i for i, t in call.items() if t]
            x = torch.cat([streams[i][done[i]:done[i] + call[i]] for i in ids])
            kwargs = {"seq_ids": [SEQ_IDS[i] for i in ids], "cu_seqlens": _cu([call[i] for i in ids])}
            self.outputs.append(script.call(module, "__call__", x, kwargs=kwargs, refs={"cache": pool}, names=X))
            if refill and not self.sizes:
                script.fill(pool, ("k_cache",), axis=0, start=0, value=K_FILL)
                script.fill(pool, ("v_cache",), axis=0, start=0, value=V_FILL)
            self.sizes.append(len(x))
            for i in ids:
                done[i] += call[i]
        self.results = run.script(script, answers=answers).value

    def expect_right(self) -> None:
        whole = Call(self.call.args, {"schedule": self.schedule, "refilled": self.refill}, X, state=self.call.state)
        native, exact = self.run.reference(whole, exact=False), self.run.reference(whole)
        got, start = [], 0
        try:
            for number, (index, n) in enumerate(zip(self.outputs, self.sizes, strict=True), 1):
                try:
                    expect_form(self.results[index], native[start:start + n])
                except CheckFailed as failure:
                    raise CheckFailed(f"call {number} of {n} new tokens: {failure.message}",
                                      diagnose.form(self.results[index], native[start:start + n])) from None
                got.append(self.results[index])
                start += n
            expect_close(torch.cat(got), exact, None, Tolerance.of(native, exact))
        except CheckFailed as failure:
            mistake = failure.mistake
            if mistake is None and len(got) == len(self.sizes):
                unfilled = self.run.reference(Call(self.call.args, {"schedule": self.schedule}, X,
                                                   state=self.call.state), exact=False) if self.refill else None
                # the outputs of a module that kept its own keys and values are the pool's as it was before refilling
                mistake = POOL_NOT_READ if self.refill and matches_any(torch.cat(got), [unfilled]) else (
                    self.run.explain(torch.cat(got), whole))
            calls = "; ".join(", ".join(f"{SEQ_IDS[i]}: +{t}" for i, t in c.items()) for c in self.schedule)
            if self.refill:
                calls += f"; after the first, the grader set every key in the pool to {K_FILL}, every value to {V_FILL}"
            raise CheckFailed(f"calls of new tokens by sequence ({calls}): {failure.message}", mistake,
                              failure.details) from None


def _serve_check(**options):
    return lambda run: ServeScript(run, **options).expect_right()


DECODE_SCALE = 2.0  # what the grader multiplies every answer of paged_decode by in decode_path


def decode_path(run: Run) -> None:
    """Each call of one new token per sequence is decoded by paged_decode on the pool, as the contract says: the
    grader answers the module's calls of paged_decode and varlen_attention here, keeps what paged_decode was asked,
    and doubles its answers. Every question must be decoded tokens' own (their queries, their lengths, the pool's
    slots their tables reach), every decoded token must be asked, and the decoded outputs must follow the answers
    exactly, w_o(2·y); outputs wrong where it prefills fail too. Review 57's F3 gathered every sequence's keys for
    varlen_attention at every call, decoding included (20/20); review 58's F4 called paged_decode too and threw its
    answer away; review 59's F2 added the answer of a call on a pool of its own, review 60's F2 of a question with
    q = 0 (which told it the doubling); review 61's F1 asked of one sequence's token only and doubled the rest
    itself, its F2 got the prefill wrong once it saw the doubling, which this check once took as the other checks'
    to judge."""
    oracle = run.answering(("paged_decode", "varlen_attention"))
    oracle.scales["paged_decode"], oracle.kept["paged_decode"] = DECODE_SCALE, []
    served = ServeScript(run, answers=oracle)
    right = run.reference(Call(served.call.args, {"schedule": PREFILL_DECODE}, X, state=served.call.state)).double()
    bias = served.call.state.get("w_o.bias", torch.zeros(D)).double()
    where = "a batch prefilled, then decoded twice one token per sequence"
    reached = oracle.counts.get("paged_decode", 0)
    if reached < 2:
        raise CheckFailed(f"{where}: paged_decode was called {reached} times", DECODE_SKIPPED,
                          {"paged_decode": reached})
    tokens = decoded_tokens(served.call.state, served.call.args[0])
    asked = set()
    for number, (args, _) in enumerate(oracle.kept["paged_decode"], 1):
        rows = _decodes(args, tokens)
        if rows is None:
            raise CheckFailed(f"{where}: question {number} to paged_decode was not the decoded tokens' queries over "
                              "the pool, each sequence's block table and length", DECODE_SKIPPED)
        asked |= rows
    if len(asked) < len(tokens):
        raise CheckFailed(f"{where}: paged_decode was asked of {len(asked)} of the {len(tokens)} decoded tokens: "
                          "decode every sequence of the batch with it", DECODE_SKIPPED)
    start = 0
    for call, index, n in zip(PREFILL_DECODE, served.outputs, served.sizes, strict=True):
        got, want = served.results[index], right[start:start + n]
        if not (isinstance(got, torch.Tensor) and got.shape == (n, D)):
            raise CheckFailed(f"{where}: with the grader answering paged_decode and varlen_attention, a call returned "
                              f"{type_name(got)} where ({n}, {D}) belongs")
        if not all(t == 1 for t in call.values()):
            if not torch.allclose(got.double(), want, atol=1e-3, rtol=1e-3):
                raise CheckFailed(f"{where}: with the grader answering paged_decode and varlen_attention, the "
                                  "outputs where it prefills were wrong")
        elif not torch.allclose(got.double(), DECODE_SCALE * want - (DECODE_SCALE - 1) * bias, atol=1e-3, rtol=1e-3):
            kept = torch.allclose(got.double(), want, atol=1e-3, rtol=1e-3)
            raise CheckFailed(f"{where}: with paged_decode's answers doubled, the decoded tokens' outputs "
                              + ("stayed as they were: its answer was not used" if kept else
                                 "were not w_o of them: they are not paged_decode's answers"), DECODE_SKIPPED)
        start += n


class Decoded(NamedTuple):
    """One token decoded by PREFILL_DECODE: its query, its sequence's length with it, and the keys and values then."""

    query: torch.Tensor  # (H, Dh)
    length: int
    keys: torch.Tensor  # (length, H, Dh)
    values: torch.Tensor


def decoded_tokens(state, streams) -> list[Decoded]:
    heads = [tuple(_proj(state, x, n).view(-1, H, DH).double() for n in ("w_q", "w_k", "w_v")) for x in streams]
    done, tokens = [0] * len(streams), []
    for call in PREFILL_DECODE:
        for i, t in call.items():
            if all(n == 1 for n in call.values()):
                q, k, v = heads[i]
                tokens.append(Decoded(q[done[i]], done[i] + 1, k[:done[i] + 1], v[:done[i] + 1]))
            done[i] += t
    return tokens


def _decodes(args: tuple, tokens: list[Decoded]) -> set[int] | None:
    """Which decoded tokens a question to paged_decode (its arguments as the oracle bound them) asks of, each row one
    of theirs: its query, its length that token's, and the pool's slots its table and length reach holding that
    sequence's keys and values; None if some row is no decoded token's. Review 60's F2 asked with q = 0, whose
    answer, each sequence's mean value, told the module the grader's scale; its F1 gave a length past the batch that
    was no number (exit 3)."""
    try:
        q, k_cache, v_cache, tables, lengths = args[:5]
        tensors = (q, k_cache, v_cache, tables, lengths)
        if not all(isinstance(t, torch.Tensor) for t in tensors) or q.dim() != 3 or q.shape[1:] != (H, DH):
            return None
        if k_cache.shape != (POOL_BLOCKS, BLOCK, H, DH) or v_cache.shape != k_cache.shape:
            return None
        if tables.is_floating_point() or lengths.is_floating_point() or tables.dim() != 2:
            return None
        if lengths.shape != (len(q),) or len(tables) != len(q):
            return None
        found = set()
        for row, n, table in zip(q.double(), lengths.tolist(), tables.tolist(), strict=True):
            blocks = table[:-(-n // BLOCK)]
            if not all(0 <= b < POOL_BLOCKS for b in blocks) or len(blocks) * BLOCK < n:
                return None
            keys, values = (c[blocks].flatten(0, 1)[:n].double() for c in (k_cache, v_cache))
            same = [j for j, t in enumerate(tokens) if t.length == n and all(
                torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in ((row, t.query), (keys, t.keys),
                                                                         (values, t.values)))]
            if not same:
                return None
            found.update(same)
        return found
    except Exception:  # the question's parts are the candidate's: anything malformed is no decoded token's
        return None


def module_end_to_end(run: Run) -> None:
    """The module with the candidate's own pool and functions: does the whole thing serve?"""
    try:
        ServeScript(run, schedule=JOINING, nan=True).expect_right()
    except CheckFailed as failure:
        source = source_of(run.ctx.source, run.step.id)
        calls = ["PagedKVCache"] + [name for name in ("paged_decode", "varlen_attention") if name in source]
        mistake = failure.mistake if all(run.ctx.passed(name) for name in calls) else None
        raise CheckFailed(failure.message, mistake, {**failure.details, "calls": calls}, failure.outcome) from None


DECODE_SKIPPED = Mistake("PagedSelfAttention.decode_path_skipped", "one new token per sequence was not decoded by "
                        "paged_decode: call it on the pool with the block tables and lengths (varlen_attention is for "
                        "several tokens)", why="A decode reads each sequence's keys where they lie; gathering them "
                                               "into a packed copy at every token is what paging avoids.")
# What a check's failure says when prefill then decode is served right and no listed mistake explains it.
JOINING_WRONG = Mistake("PagedSelfAttention.joining_mishandled", "wrong when a sequence joins while others decode: "
                        "each sequence's positions, table and length are its own; prefill it alone, then decode it "
                        "with the batch")
BIAS_WRONG = Mistake("PagedSelfAttention.bias_mishandled", "wrong with bias=False: pass the bias argument on to "
                     "every nn.Linear the module makes")
POOL_NOT_READ = Mistake("PagedSelfAttention.pool_not_read", "attended over keys and values kept apart from the pool: "
                       "read each sequence's keys and values from the pool, by its block table, after the append",
                       why="The grader changed the pool's keys and values and the outputs did not follow. The pool is "
                           "the one copy: a server swaps, moves and shares its blocks, and a copy of the module's own "
                           "doubles the memory paging saves.")
NAN_SLOTS = Mistake("PagedSelfAttention.unused_slots_read", "right while the pool's free slots hold numbers, wrong "
                    "when they hold NaN: read only each sequence's own slots, through its table and length")

MODULE = StepSpec(
    "PagedSelfAttention", module_inputs, served, module=True, prefix="module",
    answered=("paged_decode", "varlen_attention"), plain="prefill_then_decode",
    checks=(
        prop("structure", 2, linear_layers(("w_q", "w_k", "w_v", "w_o"), (D, H), "an nn.Linear")),
        prop("prefill_then_decode", 3, _serve_check()), prop("decode_path", 2, decode_path, gated=ALWAYS),
        prop("joining", 3, _serve_check(schedule=JOINING), situation=JOINING_WRONG),
        prop("without_bias", 2, _serve_check(bias=False), situation=BIAS_WRONG),
        prop("unused_slots_nan", 3, _serve_check(nan=True), situation=NAN_SLOTS),
        prop("reads_pool", 2, _serve_check(refill=True, schedule=REFILLED), situation=POOL_NOT_READ),
        prop("end_to_end", 3, module_end_to_end, end_to_end=True),
    ),
    mistakes=(DECODE_SKIPPED, NOT_CAUSAL, BIAS_DROPPED, NEW_KEYS_TWICE, NEW_ONLY, LENGTHS_BEFORE, KEYS_AT_QUERIES,
              NO_OUTPUT_PROJECTION, OUTPUT_AS_STORED, QKV_PER_HEAD, HEADS_SPLIT_INNER, HEADS_MERGED_INNER,
              TABLE_BEFORE_APPEND, NAN_READ, POOL_INTERNALS, VALUES_FROM_KEYS, TABLES_CUT, TABLES_MEMOISED,
              SCALED_TWICE, CU_SEQLENS_MALFORMED, BATCH_REORDERED),
)

SPEC = Spec((CACHE, DECODE, VARLEN, MODULE))
