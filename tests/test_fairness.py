"""Fair to real code: what correct code written the way libraries write it does must not cost points.

flash_attention's `tiles_only` counts each created tensor's elements per batch and head. A (B, T, H, D) view of
q, k or v (flash-attn's own layout) has its head axis away from the batch axis, and was once counted as one block
of B·T·H·D elements: a correct file that made one failed as "materialises the full score matrix".
"""

import json
import subprocess
import sys

import pytest

from grader.course.flash_attention import spec as flash
from tests.conftest import ROOT

MEM = flash.MEM
B, H, TQ, TK, D, DV, BQ, BK = MEM.b, MEM.h, MEM.t_q, MEM.t_k, MEM.d, MEM.dv, MEM.block_q, MEM.block_k


@pytest.mark.parametrize("size", [(B, TQ, H, D), (B, TK, H, D), (B, TK, H, DV), (B, H, TQ, D), (B * H, TK, DV),
                                  (B, H, BQ, BK)])
def test_inputs_in_any_layout_and_tiles_are_allowed(size):
    assert MEM.too_large(size) == ""


@pytest.mark.parametrize("size", [(B, H, TQ, TK), (B, TQ, H, TK), (B * H, TQ, TK), (TQ, TK), (B, TQ, TK),
                                  (B, H, BQ, TK)])
def test_score_matrices_in_any_layout_still_fail(size):
    assert MEM.too_large(size)


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
    return (ROOT / "solutions" / "flash_attention.py").read_text()


@pytest.mark.parametrize("size", [(B, H, BQ, BK), (B, H, BK, BQ), (B, H, BQ, 11), (B, H, BQ), (B, H, BQ, 1),
                                  (B, H, TQ), (B * H, TQ), (B, H, TQ, 1), (TK,), (B, H, 3, TK)])
def test_scores_of_tiles_and_running_statistics_are_allowed(size):
    """exp of a tile (either way round, or a last, shorter one), of the running max's change, of every query's
    statistics, of one row's keys, or of a strip no larger than a tile."""
    assert MEM.strip(size) == ""


@pytest.mark.parametrize("size", [(B, H, D, TK), (B, H, DV, TK), (B, H, TK, D), (B, H, 4, TK), (TQ, BK),
                                  (B, H, DV, 120), (B * H, TK)])
def test_strips_of_scores_fail_even_a_head_wide(size):
    """A strip of a head's width of queries against every key (or of keys against every query) holds no more
    than the inputs, and is still not tiles."""
    assert MEM.strip(size)


@pytest.mark.parametrize("size", [(B, H, TQ, DV), (B, H, TQ, D), (B, TQ, H, DV), (B * H, TQ, DV)])
def test_a_product_of_every_query_and_a_heads_width_is_the_output_not_scores(size):
    """The ninth hostile review's f01: the concatenated output normalised by one einsum at the end."""
    assert MEM.strip(size) == ""


@pytest.mark.parametrize("size, strip", [((B, H, TK, D), False), ((B, H, D, TK), False), ((B, H, TQ, DV), False),
                                         ((B, H, 5, TK), True), ((B, H, TK, 5), True), ((B, H, TQ, BK), True)])
def test_anything_created_is_a_strip_only_against_a_sequence_and_not_a_heads_width(size, strip):
    """Any tensor, not only a product's: a few rows against every key is a strip; the inputs in any layout are not."""
    assert bool(MEM.strip(size, scores=False)) == strip


def test_torch_broadcast_shapes_runs_in_the_worker_whatever_the_device(tmp_path):
    """torch.broadcast_shapes imports torch's symbolic shapes (and sympy) lazily, which a worker child may not: a
    correct file of the thirty-first blind set that broadcast its mask with it lost 20 points under --device cpu,
    where the zygote had not put its stand-ins in place. They are in place on every device but CUDA (graded here
    as the command line grades, in a zygote of its own)."""
    broadcast = """
_attention_backward = attention_backward


def attention_backward(q, k, v, grad_out, mask=None):
    if mask is not None:
        shape = torch.broadcast_shapes(mask.shape, (*q.shape[:-1], k.shape[-2]))
        mask = torch.broadcast_to(mask, shape)
    return _attention_backward(q, k, v, grad_out, mask)
"""
    path = tmp_path / "attention_backward.py"
    path.write_text((ROOT / "solutions" / "attention_backward.py").read_text() + "\n\n" + broadcast)
    done = subprocess.run([sys.executable, "-c", "from grader.cli import entry; entry()", "grade", str(path),
                           "--device", "cpu", "--format", "json"], cwd=ROOT, capture_output=True, text=True)
    report = json.loads(done.stdout)
    assert report["score"] == 100, [c["message"] for s in report["steps"] for c in s["checks"] if c["message"]]
