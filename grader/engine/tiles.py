"""What a tiled step may create (`tiles_only`): the shapes of the tensors its torch calls made or were given, read
from the worker's record (`run.answer(call, shapes=True)`).

A tile of scores is block_q × block_k. Nothing created may hold more elements per batch and head than a tile or
the inputs and outputs (padded to whole blocks); no matrix may be wider than a head on both axes (only scores are)
and larger than a tile; no strip of scores (a few rows against every key, or a few columns against every query)
may be larger than a tile; and what makes scores or their probabilities (a product of two tensors, exp, its
relatives, a softmax) is judged harder, so that a strip of a head's width of queries against every key fails too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from grader.engine.failure import CheckFailed
from grader.engine.rules import expect_seen
from grader.engine.spec import Mistake

# A tile's positions counted a whole block from its start (arange(j, j + block_k), j + arange(block_k)): the
# line a `positions_past_the_end` mistake's error comes from uses it (Raises.uses).
TILE_POSITIONS = r"arange\([^()\n]*block_[qk]"


def _padded(length: int, block: int) -> int:
    """`length` rounded up to whole blocks."""
    return -(-length // block) * block


@dataclass(frozen=True)
class TileSizes:
    """The memory check's sizes: tiles, score rows, score columns, the full matrix and the inputs all different."""

    b: int
    h: int
    t_q: int
    t_k: int
    d: int
    dv: int
    block_q: int
    block_k: int

    @property
    def tile(self) -> int:
        return self.block_q * self.block_k

    @property
    def allowed(self) -> int:
        """Elements per batch and head: a tile, or the inputs and outputs padded to whole blocks."""
        return max(self.tile, *(_padded(self.t_q, self.block_q) * w for w in (self.d, self.dv)),
                   *(_padded(self.t_k, self.block_k) * w for w in (self.d, self.dv)))

    def per_batch_and_head(self, size) -> int:
        """A tensor's elements per batch and head: divided by B·H when its axes before the last two hold a multiple
        of B·H (batched, or batch and heads flattened, or stacked blocks of them), or when it has a batch axis and a
        head axis wherever they are ((B, T, H, D), flash-attn's own layout, or scores (B, Tq, H, Tk)); divided by H
        or B when they hold a multiple of that (a loop over the batch, or over the heads); else all of them (a loop
        over the batch and heads, or a (Tq, Tk) mask shared by all)."""
        lead = math.prod(size[:-2]) if len(size) > 2 else 1
        rest = list(size)
        heads_after_batch = self.b in rest and self.h in rest[rest.index(self.b) + 1:]
        whole = math.prod(size)
        if lead % (self.b * self.h) == 0 or heads_after_batch:
            return whole // (self.b * self.h)
        # one batch's heads, or one head of every batch (a loop over the other): the leading axes are those
        return next((whole // n for n in (self.h, self.b) if n > 1 and lead % n == 0), whole)

    def too_large(self, size) -> str:
        """Why a created tensor is more than a tile holds ('' if it is not)."""
        n = self.per_batch_and_head(size)
        if n > self.allowed:
            return f"{n} elements per batch and head, more than the inputs and outputs hold ({self.allowed})"
        if len(size) >= 2 and min(size[-2:]) > max(self.d, self.dv) and size[-2] * size[-1] > self.tile:
            return f"a {size[-2]} × {size[-1]} matrix of scores, larger than a block_q × block_k tile"
        return ""

    def strip(self, size, scores: bool = True) -> str:
        """Why a tensor is a strip of scores, more than a tile ('' if it is not): its last two axes hold more than a
        tile and one of them is a sequence's length, the other no head's width and no count of batches or heads
        (the inputs, the outputs and every query's running statistics are those). What a product or an exponential
        returned (`scores`) is judged harder: against every key, any strip is one (no product of attention's gives
        one entry per key), and the inputs' own layouts are no products; one entry per query, of a head's width,
        is the output."""
        if len(size) < 2 or size[-2] * size[-1] <= self.tile:
            return ""
        keys, queries = {self.t_k, _padded(self.t_k, self.block_k)}, {self.t_q, _padded(self.t_q, self.block_q)}
        a, z = size[-2:]
        kept = {1, self.b, self.h, self.b * self.h, self.d, self.dv}  # lanes of statistics, a head's width
        along_keys = (a in keys and (scores or z not in kept)) or (z in keys and (scores or a not in kept))
        along_queries = (a in queries and z not in kept) or (z in queries and a not in kept)
        if along_keys or along_queries:
            return f"a {a} × {z} strip of scores, more than a block_q × block_k tile"
        return ""

    def crowded(self, size) -> str:
        """Why what a product or an exponential returned holds more than one tile's worth of every batch and head
        together ('' if it does not): a tile of scores, a tile's rows or columns against a head's width, or one
        statistic per query or key, B·H times. Judged by the total, whatever the layout: a leading axis that is a
        multiple of B·H may be key groups of one head (the thirty-third review's f03, (18, 45, 6)), not heads."""
        width = max(self.d, self.dv)
        most = max(self.tile, self.block_q * width, self.block_k * width, _padded(self.t_q, self.block_q),
                   _padded(self.t_k, self.block_k))
        n = math.prod(size)
        if n > self.b * self.h * most:
            return f"{n} scores made at once, more than a tile for every batch and head ({self.b * self.h * most})"
        return ""

    def distinct(self) -> bool:
        """No length (padded or not) is a width, a block or a count of batches or heads: sizes at which the strip
        rules read a tensor's axes unambiguously, as they do at tiles_only's own."""
        lengths = {self.t_q, self.t_k, _padded(self.t_q, self.block_q), _padded(self.t_k, self.block_k)}
        return not lengths & {1, self.b, self.h, self.b * self.h, self.d, self.dv, self.block_q, self.block_k}

    def whole(self, size) -> bool:
        """The tensor spans a whole row or column of the scores, or more than the inputs: not a tile too large."""
        return max(size[-2:], default=0) >= min(self.t_q, self.t_k) or self.per_batch_and_head(size) > self.allowed

    @classmethod
    def of(cls, q, k, v, block_q: int, block_k: int) -> "TileSizes":
        """The sizes a call's q (..., Tq, D), k (..., Tk, D) and v (..., Tk, Dv) and its blocks imply: the first
        leading axis the batch, the others the heads (none of them: one of each)."""
        lead = tuple(q.shape[:-2])
        return cls(lead[0] if lead else 1, math.prod(lead[1:]) if len(lead) > 1 else 1, q.shape[-2], k.shape[-2],
                   q.shape[-1], v.shape[-1], block_q, block_k)

    def violation(self, record: dict, strips: bool = True) -> tuple[tuple, str] | None:
        """The first tensor a call's record (Answer.shapes) shows to be more than a tile, and why; None if none.
        Without `strips`, only what is larger than the inputs and outputs or a matrix larger than a tile: the strip
        rules need sizes at which no width is a length (`distinct`)."""
        if record["more"]:
            return (), f"more than {len(record['created'])} different shapes: too many to check what it materialises"
        if not strips:
            found = [(s, self.too_large(s)) for s in record["created"]]
            found += [(s, self.too_large(s) or self.crowded(s)) for s in record["scores"]]
            return next(((tuple(size), why) for size, why in found if why), None)
        found = [(s, self.too_large(s) or self.strip(s, scores=False)) for s in record["created"]]
        found += [(s, self.crowded(s) or self.strip(s)) for s in record["scores"]]
        return next(((tuple(size), why) for size, why in found if why), None)

    def describe(self, causal: bool) -> str:
        return (f"Tq={self.t_q}, Tk={self.t_k}, block_q={self.block_q}, block_k={self.block_k}"
                + (", causal" if causal else ""))


EMPTY = {"created": [], "more": 0, "scores": [], "blocks": [], "loaded": 0, "blocks_alive": 0, "held": 0, "alive": 0,
         "largest": []}
# Sizes at which the scores a call keeps alive show as growth: a block much taller than a head is wide, so a strip
# of a query block against every key (or of a key block against every query), in pieces, grows with Tk (Tq) far
# faster than a copy of an input does (2 numbers per key), or partial outputs kept one per key block do
# (bq/bk · (Dv + 1) = 6). The length that grows is whole blocks, before and after, so the tiles alive at the peak
# are whole tiles both times; causal, every query sees a key at both lengths (Tq <= Tk: a correct file that treats
# rows with no key apart held 124 columns more with them), and every block of keys but the last is seen by every
# query at both (a backward with keys outer that skips the rows a key block's first key cannot see made tiles of
# half a block at the shorter length only, and held one tile more at the longer: 71 rows, blind set 60's c06).
KEPT_ROWS = TileSizes(b=1, h=1, t_q=128, t_k=256, d=2, dv=2, block_q=128, block_k=64)
# KEPT_COLUMNS' blocks are KEPT_ROWS': a backward that keeps one dk and dv partial per query block until the end (the
# deterministic way) grows by Tk·(D + Dv) numbers per query block, 16 columns a query in float64 with query blocks of
# 128, where with blocks of 64 it held 52 and failed (the seventy-eighth review's F1); a strip of a key block against
# every query grows by block_k = 64; a tile of 128 × 128 would be more than the grader answers of online_softmax_update
KEPT_COLUMNS = TileSizes(b=1, h=1, t_q=128, t_k=256, d=2, dv=2, block_q=128, block_k=64)
LONGER = 128  # keys (queries) added
KEPT = 48  # rows (columns) of scores against every key (query) a call may keep alive at once (a correct file: 25)


def tiles_only(sizes: TileSizes, full: Mistake, ignored: Mistake, what: str = "its torch calls",
               answer: Callable | None = None) -> Callable:
    """The tiles_only check: causal and not, at `sizes`, nothing the call created more than a tile holds (`full`
    named where it spans a whole row or column, `ignored` for tiles of other sizes), and the answer right; then
    every call the step's other checks made, judged at its own sizes where the step says how (StepSpec.tiles), so
    a file that tiles only at these sizes keeps nothing. `answer(run, call, shapes=True)` gets the answer with its
    record (default: the step's own call)."""

    def check(run) -> None:
        for causal in (False, True):
            call, got = _asked(run, answer, sizes, causal, full)
            found = sizes.violation(got.shapes or EMPTY)
            if found:
                _untiled(sizes, sizes.describe(causal), *found, full, ignored, what)
            run.expect_right(run.output(got), call)
        # At these lengths the grader answers every question a right composite asks of a step it answers: a call
        # that fails here fails the check, whatever it raised or made the grader refuse (reviews 76 and 77 raised at
        # these sizes alone, the second after asking a question too large, once an answered step lost a point)
        for causal in (False, True):
            _kept(run, answer, sizes, causal, full)
        untiled = run.ctx.untiled.get(run.step.id)
        if untiled:
            _untiled(*untiled, full, ignored, what)

    return check


def _asked(run, answer: Callable | None, sizes: TileSizes, causal: bool, full: Mistake, steer: bool = True):
    """The call at `sizes` and the file's answer to it, with its record; a record the call hid fails the check."""
    call = run.inputs(t_q=sizes.t_q, t_k=sizes.t_k, d=sizes.d, dv=sizes.dv, causal=causal, block_q=sizes.block_q,
                      block_k=sizes.block_k)
    got = answer(run, call, shapes=True, steer=steer) if answer else run.answer(call, shapes=True, steer=steer)
    expect_seen(got, full)
    return call, got


def _kept(run, answer: Callable | None, sizes: TileSizes, causal: bool, full: Mistake) -> None:
    """The rows of scores against every key a call keeps alive at once, from how much more its storages held with
    LONGER more keys, and the columns against every query, with LONGER more queries. A two-pass softmax that keeps a
    query block's tiles (in a list, each one a tile) holds a block_q × Tk strip, which grows by block_q rows of
    scores (the thirty-fifth review's f03); an online softmax holds the same tiles whatever the lengths."""
    for keys, base in ((True, KEPT_ROWS), (False, KEPT_COLUMNS)):
        short = replace(base, b=sizes.b, h=sizes.h)
        long = replace(short, t_k=short.t_k + LONGER) if keys else replace(short, t_q=short.t_q + LONGER)
        held = []
        for each in (short, long):
            call, got = _asked(run, answer, each, causal, full, steer=False)  # its values read by no check
            held.append((got.shapes or EMPTY)["alive"])
            width = call.args[0].element_size()
        kept = (held[1] - held[0]) / (sizes.b * sizes.h * LONGER * width)
        if kept > KEPT:
            lines, others = ("rows", "key") if keys else ("columns", "query")
            raise CheckFailed(
                f"with {long.describe(causal)}: its tensors held {held[1] - held[0]} bytes more at once than with "
                f"{'Tk' if keys else 'Tq'}={short.t_k if keys else short.t_q}: {kept:.0f} {lines} of scores against "
                f"every {others} kept alive together (a block's tiles kept, in a list, say); hold one tile at a time, "
                f"as an online softmax does", full, {lines: round(kept, 1), "allowed": KEPT})


def judge_tiles(ctx, step_id: str, sizes: TileSizes | None, call_sizes: str, record) -> None:
    """Keep the first call of a step that made more than a tile, for its tiles_only check (Context.untiled): a strip
    of scores too, at sizes where one tells (`TileSizes.distinct`)."""
    if sizes is None or step_id in ctx.untiled:
        return
    found = sizes.violation(record or EMPTY, strips=sizes.distinct())
    if found:
        ctx.untiled[step_id] = (sizes, call_sizes, *found)


def _untiled(sizes: TileSizes, where: str, size: tuple, why: str, full: Mistake, ignored: Mistake, what: str):
    if not size:
        raise CheckFailed(f"with {where}: the call created tensors of {why}", full)
    raise CheckFailed(
        f"with {where}: a tensor of shape {size} was created by {what}, {why}; a tile holds {sizes.tile} "
        f"scores (the full score matrix: {sizes.t_q * sizes.t_k})", full if sizes.whole(size) else ignored,
        {"shape": list(size), "elements": sizes.per_batch_and_head(size), "allowed": sizes.allowed})
