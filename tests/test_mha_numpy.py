"""The mha_numpy exercise: buggy variants lose points in their own step (and multi_head_attention, which
composes every step) and nowhere else, with the right named mistake; rule breakers lose only rule
points; unusual but correct variants score 100; the NumPy model answer agrees with the torch one."""

import ast

import numpy as np
import pytest
import torch

from grader.checks import mha_numpy as checks
from grader.checks.expect import KEPT_FLOAT64, Mistake
from grader.exercise import load_manifest
from grader.grade import grade
from solutions import mha as torch_ref
from solutions import mha_numpy as numpy_ref
from tests.conftest import ROOT, explain, lost, mistakes
from tests.variants_mha_numpy import BUGGY, CORRECT, MHA, RULES_ONLY

SOLUTION = ROOT / "solutions" / "mha_numpy.py"
BASE = SOLUTION.read_text()
STEPS = [s.id for s in load_manifest()["mha_numpy"].steps]

LOST_CHECKS: dict[str, set[str]] = {}  # variant -> the checks it failed, for the coverage test below
ALL_CHECKS: set[str] = set()


@pytest.fixture
def grade_numpy(grade_source):
    def run(code: str = "", **options):
        return grade_source(code, base=BASE, name="mha_numpy.py", **options)

    return run


def _lost_checks(result) -> set[str]:
    return {c.name for s in result.steps for c in s.checks if c.points < c.max_points}


def _record(variant, result):
    ALL_CHECKS.update(c.name for s in result.steps for c in s.checks)
    LOST_CHECKS[variant.name] = _lost_checks(result)


@pytest.mark.parametrize("variant", BUGGY, ids=str)
def test_buggy_variant_loses_points_in_its_own_step(grade_numpy, variant):
    result = grade_numpy(variant.code)
    _record(variant, result)
    assert variant.step in lost(result), explain(result)
    assert set(lost(result)) <= {variant.step, MHA}, explain(result)
    if variant.mistake:
        assert variant.mistake in mistakes(result, variant.step), explain(result)


@pytest.mark.parametrize("variant", RULES_ONLY, ids=str)
def test_rule_breaker_loses_only_rule_points(grade_numpy, variant):
    result = grade_numpy(variant.code)
    _record(variant, result)
    lost_checks = _lost_checks(result)
    assert lost_checks and all(name.endswith("_rules") for name in lost_checks), explain(result)
    if variant.step is None:  # a torch import costs every step its rule check
        assert set(lost(result)) == set(STEPS), explain(result)
    else:
        assert variant.step in lost(result) and set(lost(result)) <= {variant.step, MHA}, explain(result)


@pytest.mark.parametrize("variant", CORRECT, ids=str)
def test_correct_variant_scores_full_marks(grade_numpy, variant):
    result = grade_numpy(variant.code)
    assert result.full_marks, explain(result)


def test_reference_scores_100_without_device_checks(grade_numpy):
    result = grade_numpy()
    assert [s.id for s in result.steps] == STEPS
    assert (result.score, result.max_score) == (100, 100), explain(result)
    assert result.environment["device"] == "none"
    assert not [c for s in result.steps for c in s.checks if c.name.endswith("_device")]
    assert {c.outcome for s in result.steps for c in s.checks} == {"passed"}


def test_stub_scores_0_and_every_step_says_not_implemented(zygote):
    result = grade(ROOT / "exercises" / "mha_numpy.py", zygote=zygote)
    assert result.score == 0 and [s.id for s in result.steps] == STEPS
    for step in result.steps:
        assert all(c.outcome == "error" and "not implemented yet" in c.message for c in step.checks), step.id


def test_a_rule_kept_by_garbage_earns_no_rule_points(grade_numpy):
    result = grade_numpy("def scale_scores(scores, head_dim):\n    return scores")
    assert "scale_scores_rules" in _lost_checks(result), explain(result)


def test_named_mistakes_cover_every_step_and_each_has_a_variant():
    named = {m.id for value in vars(checks).values() for m in (value if isinstance(value, tuple) else (value,))
             if isinstance(m, Mistake)} | {KEPT_FLOAT64.id}
    assert len(named) >= 10
    assert {"weighted_sum.wrong_axis", "kept_float64"} <= named
    assert named == {v.mistake for v in BUGGY if v.mistake}  # every named mistake is shown by a variant
    assert {v.step for v in BUGGY} == set(STEPS)


def test_every_check_is_failed_by_some_buggy_variant():
    """A check that no candidate can fail is not a check (runs after the variant tests above)."""
    if set(LOST_CHECKS) != {v.name for v in BUGGY + RULES_ONLY}:
        pytest.skip("needs every buggy variant graded in this session")
    never_failed = ALL_CHECKS - set().union(*LOST_CHECKS.values())
    assert not never_failed, f"no buggy variant fails these checks: {sorted(never_failed)}"


# -- the NumPy model answer agrees with the torch one -------------------------------------------

TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}  # the grader's float32 tolerance
B, H, TQ, TK, D = 2, 4, 5, 7, 16


def _torch(name, *args, **kwargs):
    convert = lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a  # noqa: E731
    return getattr(torch_ref, name)(*map(convert, args), **{k: convert(v) for k, v in kwargs.items()}).numpy()


def _same(got, expected, dtype):
    assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **TOL[dtype])


def _masks(g):
    yield None
    yield g.random((B, H, TQ, TK)) < 0.6  # fully blocked rows likely somewhere
    yield np.tril(np.ones((TQ, TK), dtype=bool), k=TK - TQ)  # causal, bottom-right aligned
    yield (np.arange(TK) < np.array([TK, 3])[:, None])[:, None, None, :]  # (B, 1, 1, Tk) padding


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_numpy_solution_agrees_with_the_torch_solution(seed, dtype):
    g = np.random.default_rng(seed)
    rand = lambda *shape, scale=1.0: (g.standard_normal(shape) * scale).astype(dtype)  # noqa: E731
    x, w, b = rand(B, TQ, 6), rand(D, 6), rand(D)
    for args in ((x, w, b), (x, w), (rand(2, 3, 4, 6), w, b)):
        _same(numpy_ref.project(*args), _torch("project", *args), dtype)
    x = rand(B, TQ, D)
    for heads in (1, 2, H):
        _same(numpy_ref.split_heads(x, heads), _torch("split_heads", x, heads), dtype)
        _same(numpy_ref.merge_heads(numpy_ref.split_heads(x, heads)), x, dtype)
    y = rand(B, H, TQ, D // H)
    _same(numpy_ref.merge_heads(y), _torch("merge_heads", y), dtype)
    q, k = rand(B, H, TQ, D // H), rand(B, H, TK, D // H)
    _same(numpy_ref.attention_scores(q, k), _torch("attention_scores", q, k), dtype)
    scores = rand(B, H, TQ, TK, scale=3.0)
    for head_dim in (4, 8):
        _same(numpy_ref.scale_scores(scores, head_dim), _torch("scale_scores", scores, head_dim), dtype)
    for mask in _masks(g):
        masked = numpy_ref.apply_mask(scores, mask)
        _same(masked, _torch("apply_mask", scores, mask), dtype)
        _same(numpy_ref.softmax(masked), _torch("softmax", masked), dtype)
    for axis in (-1, -2, 0, 1):
        _same(numpy_ref.softmax(scores, axis=axis), _torch("softmax", scores, dim=axis), dtype)
    big = rand(B, TQ, TK) * 1e4
    _same(numpy_ref.softmax(big), _torch("softmax", big), dtype)
    weights = numpy_ref.softmax(scores)
    v = rand(B, H, TK, 6)
    _same(numpy_ref.weighted_sum(weights, v), _torch("weighted_sum", weights, v), dtype)


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("bias", [True, False])
def test_numpy_function_matches_the_torch_module(seed, dtype, bias):
    g = np.random.default_rng(seed)
    torch.manual_seed(seed)
    module = torch_ref.MultiHeadAttention(D, H, bias=bias).to(getattr(torch, np.dtype(dtype).name))
    params = []
    for name in ("w_q", "w_k", "w_v", "w_o"):
        linear = getattr(module, name)
        params += [linear.weight.detach().numpy(), None if linear.bias is None else linear.bias.detach().numpy()]
    query, key, value = (g.standard_normal((B, t, D)).astype(dtype) for t in (TQ, TK, TK))
    for mask in _masks(g):
        if mask is not None:
            mask = np.broadcast_to(mask, (B, H, TQ, TK)).copy()
            mask[..., 0] = True  # rows blocked entirely are not part of the contract
        got = numpy_ref.multi_head_attention(query, key, value, *params, H, mask=mask)
        with torch.no_grad():
            expected = module(*(torch.from_numpy(a) for a in (query, key, value)),
                              mask=None if mask is None else torch.from_numpy(mask)).numpy()
        _same(got, expected, dtype)


def test_numpy_files_import_no_torch():
    for path in (SOLUTION, ROOT / "exercises" / "mha_numpy.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("torch", "scipy") for n in names), (path, node.lineno)
