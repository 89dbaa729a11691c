"""The worker's script op, through Candidate.script: stateful actions on a candidate's objects, plain data back.

(The kv_cache exercise's checks are its main user: grader/checks/kv_cache.py.)
"""

import math

import pytest
import torch

from grader import candidate as candidate_module
from grader.candidate import Candidate, CandidateError
from tests.conftest import ROOT

KV = (ROOT / "solutions" / "kv_cache.py").read_text()
B, H, DH = 1, 2, 3


def build(cls, *init, stand_in=False, state=None, **init_kwargs):
    return {"do": "build", "class": cls, "init": list(init), "init_kwargs": init_kwargs, "state": state, "stand_in": stand_in}


def call(obj, method, *args, may_raise=False, refs=None):
    return {"do": "call", "object": obj, "method": method, "args": list(args), "kwargs": {}, "refs": refs or {},
            "may_raise": may_raise}


def get(obj, attribute):
    return {"do": "get", "object": obj, "attribute": attribute}


@pytest.fixture
def kv(tmp_path, zygote):
    def open_(extra: str = ""):
        path = tmp_path / "kv_cache.py"
        path.write_text(KV + "\n\n" + extra)
        return Candidate(path, zygote=zygote)

    return open_


def test_a_script_keeps_its_objects_and_answers_each_action_as_it_was_then(kv):
    k1, k2 = torch.randn(B, H, 2, DH), torch.randn(B, H, 1, DH)
    actions = [build("KVCache", B, H, DH, 4, dtype=torch.float64), call(0, "append", k1, -k1), get(0, "k"),
               call(0, "append", k2, -k2), get(0, "length"), get(0, "k")]
    with kv() as candidate:
        results = candidate.script("KVCache", actions).value
    assert results[0] is None and results[4] == 3
    (rk, rv), k_then, k_now = results[1], results[2], results[5]
    assert rk.dtype == torch.float64 and torch.equal(rk, k1.double()) and torch.equal(rv, -k1.double())
    assert torch.equal(k_then[:, :, :2], k1.double()) and torch.equal(k_then[:, :, 2:], torch.zeros(B, H, 2, DH, dtype=torch.float64))
    assert torch.equal(k_now[:, :, 2:3], k2.double())  # the later read sees the later write; the earlier one did not


def test_an_action_that_may_raise_is_recorded_and_the_script_goes_on(kv):
    k = torch.randn(B, H, 3, DH)
    actions = [build("KVCache", B, H, DH, 4), call(0, "append", k, k), call(0, "append", k, k, may_raise=True),
               get(0, "length")]
    with kv() as candidate:
        results = candidate.script("KVCache", actions).value
    assert isinstance(results[2], CandidateError) and results[2].type == "ValueError" and "max_len" in results[2].message
    assert results[3] == 3


def test_any_other_exception_ends_the_script_and_says_which_action_raised(kv):
    k = torch.randn(B, H, 3, DH)
    actions = [build("KVCache", B, H, DH, 4), call(0, "append", k, k), call(0, "append", k, k), get(0, "length")]
    with kv() as candidate:
        with pytest.raises(CandidateError) as raised:
            candidate.script("KVCache", actions)
    error = raised.value
    assert error.kind == "raised" and error.type == "ValueError" and error.action == 2
    assert len(error.results) == 2 and error.results[0] is None and isinstance(error.results[1], tuple)
    assert error.line is not None  # the candidate's own line that raised


def test_fill_unused_puts_nan_in_the_slots_after_length(kv):
    k = torch.randn(B, H, 2, DH)
    actions = [build("KVCache", B, H, DH, 5), call(0, "append", k, k), {"do": "fill_unused", "object": 0}, get(0, "v")]
    with kv() as candidate:
        v = candidate.script("KVCache", actions).value[3]
    assert torch.equal(v[:, :, :2], k) and torch.isnan(v[:, :, 2:]).all()


def test_the_stand_in_cache_is_the_workers_and_its_torch_calls_are_not_the_candidates(kv):
    """A module runs with the worker's own cache, passed by reference; the candidate's KVCache is never built."""
    torch.manual_seed(0)
    d = H * DH
    state = {f"{n}.{p}": torch.randn(d, d) if p == "weight" else torch.randn(d)
             for n in ("w_q", "w_k", "w_v", "w_o") for p in ("weight", "bias")}
    x = torch.randn(B, 3, d)
    broken = "class KVCache:\n    def __init__(self, *a, **k):\n        raise RuntimeError('never built')\n"
    actions = [build("CachedSelfAttention", d, H, state=state), build("KVCache", B, H, DH, 8, stand_in=True),
               call(0, "__call__", x[:, :2], refs={"cache": 1}), call(0, "__call__", x[:, 2:], refs={"cache": 1}),
               get(1, "length"), call(0, "__call__", x)]
    with kv(broken) as candidate:
        answer = candidate.script("CachedSelfAttention", actions)
    first, second, length, whole = answer.value[2], answer.value[3], answer.value[4], answer.value[5]
    assert length == 3
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)  # decoding in two calls = one causal call
    assert "zeros" not in answer.called and "linear" in answer.called  # the stand-in's torch.zeros is not recorded


def test_a_missing_class_is_said_as_missing(kv):
    with kv("del KVCache\n") as candidate:
        with pytest.raises(CandidateError) as raised:
            candidate.script("CachedSelfAttention", [build("KVCache", B, H, DH, 4)])
    assert raised.value.kind == "missing" and "KVCache" in candidate.missing


@pytest.mark.parametrize("action", [
    {"do": "call", "object": 0, "method": "__class__", "args": [], "kwargs": {}},
    {"do": "get", "object": 0, "attribute": "_private"},
    {"do": "get", "object": 7, "attribute": "k"},
    {"do": "launch"},
])
def test_actions_outside_the_vocabulary_are_refused_in_the_worker(kv, action):
    with kv() as candidate:
        with pytest.raises(CandidateError) as raised:
            candidate.script("KVCache", [build("KVCache", B, H, DH, 4), action])
    assert raised.value.action == 1 and raised.value.type == "ValueError"


def test_a_script_is_bounded_on_both_sides(kv, monkeypatch):
    many = [build("KVCache", B, H, DH, 4)] + [get(0, "length")] * candidate_module.MAX_SCRIPT_ACTIONS
    with kv() as candidate:
        with pytest.raises(ValueError):  # the grader never sends one
            candidate.script("KVCache", many)
        monkeypatch.setattr(candidate_module, "MAX_SCRIPT_ACTIONS", math.inf)  # and the worker refuses one anyway
        with pytest.raises(CandidateError) as raised:
            candidate.script("KVCache", many)
    assert raised.value.type == "ValueError" and "at most" in raised.value.message
