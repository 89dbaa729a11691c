"""The mha_numpy exercise's own tests: a rule kept by garbage earns nothing, no device checks, and the
NumPy model answer agrees with the torch one. Its buggy, rule-breaking and correct variants are graded
with every other exercise's in tests/test_variants.py."""

import ast

import numpy as np
import pytest
import torch

from solutions import mha as torch_ref
from solutions import mha_numpy as numpy_ref
from tests.conftest import ROOT, explain

BASE = (ROOT / "solutions" / "mha_numpy.py").read_text()


def test_reference_has_no_device_checks(grade_source):
    result = grade_source("", base=BASE, name="mha_numpy.py")
    assert result.full_marks and result.environment["device"] == "none", explain(result)
    assert not [c for s in result.steps for c in s.checks if c.name.endswith("_device")]


def test_a_rule_kept_by_garbage_earns_no_rule_points(grade_source):
    result = grade_source("def scale_scores(scores, head_dim):\n    return scores", base=BASE, name="mha_numpy.py")
    step = next(s for s in result.steps if s.id == "scale_scores")
    assert any(c.name == "scale_scores_rules" and c.points == 0 for c in step.checks), explain(result)


# -- the NumPy model answer agrees with the torch one -------------------------------------------

# float32: the grader's tolerance
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}
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
    for path in (ROOT / "solutions" / "mha_numpy.py", ROOT / "exercises" / "mha_numpy.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] in ("torch", "scipy") for n in names), (path, node.lineno)
