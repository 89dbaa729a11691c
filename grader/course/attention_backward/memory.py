"""What the tiled steps materialise (`tiles_only`, the engine's, at these sizes), and flash_attention_backward's
block sizes.
"""

from dataclasses import dataclass
from typing import Callable

from grader.engine import Call, CheckFailed, Mistake, TileSizes, tiles_only

B, H = 2, 3
# Tiles, score rows, score columns, the full matrix and the inputs all of different sizes; blocks wider than D and Dv.
MEM = TileSizes(b=B, h=H, t_q=45, t_k=107, d=8, dv=12, block_q=16, block_k=24)


@dataclass(frozen=True)
class TilesOnly:
    check: Callable
    full: Mistake
    ignored: Mistake


def tiles_only_check(step: str, answer: Callable | None = None) -> TilesOnly:
    """The tiles_only check of `step` and the two mistakes it names; `answer(run, call, shapes=True)` gets the
    answer with its record (default: the step's own call)."""
    full = Mistake(f"{step}.full_score_matrix", "materialises the full score matrix (or a whole row or column of "
                   "tiles, or a (Tq, Tk) mask): hold one block_q × block_k tile of scores at a time",
                   why="Mask each tile from the positions of its own rows and columns; recompute each tile's "
                       "probabilities from lse.")
    ignored = Mistake(f"{step}.block_sizes_ignored", "tiles larger than block_q × block_k (block sizes of its own, "
                      "or the arguments not used): use block_q queries and block_k keys per tile",
                      why="The caller picks the tile to fit its fast memory.")
    return TilesOnly(tiles_only(MEM, full, ignored, answer=answer), full, ignored)


# 3 × 10 first: a tile skipped from the block's first query and one skipped at its last query's own key (blind set
# 61's b03) skip the same tiles of 4 × 4 here, and the first block size that fails is the one named
BLOCK_SIZES = ((3, 10), (4, 4), (10, 3), (64, 64))


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
