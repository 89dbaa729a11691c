"""What the tiled steps materialise (`tiles_only`), and flash_attention_backward's block sizes.

The worker records the shape of every tensor the call's torch functions create (`run.answer(call,
shapes=True)`, as flash_attention's spec uses it); none may hold more elements per batch and head than
a block_q × block_k tile or the inputs and outputs, padded to whole blocks, nor be a matrix wider than a
head on both axes (only scores are) larger than a tile.
"""

import math
from dataclasses import dataclass
from typing import Callable

from grader.engine import Call, CheckFailed, Mistake

B, H = 2, 3
# Tiles, score rows, score columns, the full matrix and the inputs all of different sizes; blocks wider than D and Dv.
MEM_TQ, MEM_TK, MEM_D, MEM_DV, MEM_BQ, MEM_BK = 90, 107, 8, 12, 16, 24


def per_batch_and_head(size, batch_heads):
    """A tensor's elements per batch and head: divided by B·H when its axes before the last two hold a multiple of
    B·H, else all of them (a loop over the heads, or a (Tq, Tk) mask shared by all)."""
    lead = math.prod(size[:-2]) if len(size) > 2 else 1
    return math.prod(size) // batch_heads if lead % batch_heads == 0 else math.prod(size)


def too_large(size, batch_heads, allowed):
    """Why a created tensor is more than a tile holds ('' if it is not)."""
    n = per_batch_and_head(size, batch_heads)
    if n > allowed:
        return f"{n} elements per batch and head, more than the inputs and outputs hold ({allowed})"
    if len(size) >= 2 and min(size[-2:]) > max(MEM_D, MEM_DV) and size[-2] * size[-1] > MEM_BQ * MEM_BK:
        return f"a {size[-2]} × {size[-1]} matrix of scores, larger than a block_q × block_k tile"
    return ""


@dataclass(frozen=True)
class TilesOnly:
    check: Callable
    full: Mistake
    ignored: Mistake


def tiles_only_check(step: str, inputs: Callable, forward_only: bool, answer: Callable | None = None) -> TilesOnly:
    """The tiles_only check of `step` and the two mistakes it names; `answer(run, call, shapes=True)` gets the
    answer with its record (default: the step's own call)."""
    full = Mistake(f"{step}.full_score_matrix", "materialises the full score matrix (or a whole row or column of "
                   "tiles, or a (Tq, Tk) mask): hold one block_q × block_k tile of scores at a time",
                   why="Mask each tile from the positions of its own rows and columns; recompute each tile's "
                       "probabilities from lse.")
    ignored = Mistake(f"{step}.block_sizes_ignored", "tiles larger than block_q × block_k (block sizes of its own, "
                      "or the arguments not used): use block_q queries and block_k keys per tile",
                      why="The caller picks the tile to fit its fast memory.")
    pad = lambda t, b: -(-t // b) * b  # noqa: E731
    allowed = max(MEM_BQ * MEM_BK, *(pad(MEM_TQ, MEM_BQ) * w for w in (MEM_D, MEM_DV)),
                  *(pad(MEM_TK, MEM_BK) * w for w in (MEM_D, MEM_DV)))
    what = "the forward's torch calls (the backward's are not recorded)" if forward_only else "its torch calls"

    def check(run) -> None:
        for causal in (False, True):
            call = run.inputs(t_q=MEM_TQ, t_k=MEM_TK, d=MEM_D, dv=MEM_DV, causal=causal, block_q=MEM_BQ,
                              block_k=MEM_BK)
            got = answer(run, call, shapes=True) if answer else run.answer(call, shapes=True)
            record = got.shapes or {"created": [], "more": 0}
            if record["more"]:
                raise CheckFailed(f"the call created tensors of more than {len(record['created'])} different "
                                  "shapes: too many to check what it materialises", full)
            for size in record["created"]:
                why = too_large(size, B * H, allowed)
                if why:
                    elements = per_batch_and_head(size, B * H)
                    whole = max(size[-2:], default=0) >= min(MEM_TQ, MEM_TK) or elements > allowed
                    sizes = f"Tq={MEM_TQ}, Tk={MEM_TK}, block_q={MEM_BQ}, block_k={MEM_BK}" + (", causal" * causal)
                    raise CheckFailed(
                        f"with {sizes}: a tensor of shape {tuple(size)} was created by {what}, {why}; a tile holds "
                        f"{MEM_BQ * MEM_BK} scores (the full score matrix: {MEM_TQ * MEM_TK})",
                        full if whole else ignored,
                        {"shape": list(size), "elements": per_batch_and_head(size, B * H), "allowed": allowed})
            run.expect_right(run.output(got), call)

    return TilesOnly(check, full, ignored)


BLOCK_SIZES = ((4, 4), (3, 10), (10, 3), (64, 64))


def block_sizes(run) -> None:
    """Causal, Tq < Tk, for block sizes square and not, odd, and larger than the sequence: always the reference's
    answer."""
    for bq, bk in BLOCK_SIZES:
        base = run.inputs(causal=True)
        call = Call(base.args, {**base.kwargs, "block_q": bq, "block_k": bk}, base.names)
        try:
            run.expect_right(run.output(run.answer(call)), call)
        except CheckFailed as failure:
            raise CheckFailed(f"with block_q={bq}, block_k={bk}: {failure.message}", failure.mistake,
                              failure.details) from None
