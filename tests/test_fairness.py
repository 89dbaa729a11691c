"""Fair to real code: what correct code written the way libraries write it does must not cost points.

flash_attention's `tiles_only` counts each created tensor's elements per batch and head. A (B, T, H, D) view of
q, k or v (flash-attn's own layout) has its head axis away from the batch axis, and was once counted as one block
of B·T·H·D elements: a correct file that made one failed as "materialises the full score matrix".
"""

import pytest

from grader.course.flash_attention import spec as flash

B, H = flash.B, flash.H
TQ, TK, D, DV = flash.MEM_TQ, flash.MEM_TK, flash.MEM_D, flash.MEM_DV
PAD = lambda t, b: -(-t // b) * b  # noqa: E731
ALLOWED = max(flash.MEM_BQ * flash.MEM_BK, *(PAD(TQ, flash.MEM_BQ) * w for w in (D, DV)),
              *(PAD(TK, flash.MEM_BK) * w for w in (D, DV)))


@pytest.mark.parametrize("size", [(B, TQ, H, D), (B, TK, H, D), (B, TK, H, DV), (B, H, TQ, D), (B * H, TK, DV),
                                  (B, H, flash.MEM_BQ, flash.MEM_BK)])
def test_inputs_in_any_layout_and_tiles_are_allowed(size):
    assert flash._too_large(size, B * H, ALLOWED) == ""


@pytest.mark.parametrize("size", [(B, H, TQ, TK), (B, TQ, H, TK), (B * H, TQ, TK), (TQ, TK), (B, TQ, TK),
                                  (B, H, flash.MEM_BQ, TK)])
def test_score_matrices_in_any_layout_still_fail(size):
    assert flash._too_large(size, B * H, ALLOWED)


FLASH_WITH_BTHD_VIEW = """
_flash_reference = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    q_bthd = q.transpose(1, 2)  # flash-attn's layout, (B, T, H, D): made, never used
    v_bthd = v.transpose(1, 2).contiguous()
    return _flash_reference(q, k, v, causal, block_q, block_k)
"""

FLASH_WITH_FULL_SCORES = """
_flash_reference = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    scores = torch.einsum("bhqd,bhkd->bqhk", q, k)  # (B, Tq, H, Tk): the whole score matrix, heads in the middle
    return _flash_reference(q, k, v, causal, block_q, block_k)
"""


def test_a_bthd_view_of_q_keeps_tiles_only(grade_source):
    result = grade_source(FLASH_WITH_BTHD_VIEW, base=flash_source(), name="flash_attention.py")
    assert result.score == 100, [(c.name, c.mistake) for s in result.steps for c in s.checks if c.points < c.max_points]


def test_a_score_matrix_with_heads_in_the_middle_still_fails(grade_source):
    result = grade_source(FLASH_WITH_FULL_SCORES, base=flash_source(), name="flash_attention.py")
    lost = {c.name: c.mistake_id for s in result.steps for c in s.checks if c.points < c.max_points}
    assert lost.get("flash_attention_tiles_only") == "flash_attention.full_score_matrix", lost


def flash_source() -> str:
    from tests.conftest import ROOT

    return (ROOT / "solutions" / "flash_attention.py").read_text()
