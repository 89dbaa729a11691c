"""The worker's script op, through Candidate.script: stateful actions on a candidate's objects, plain data back.

(The kv_cache exercise's checks are its main user: grader/course/kv_cache/spec.py; the worker's side is
grader/sandbox/scripts.py.)
"""

import math

import pytest
import torch

from grader import candidate as candidate_module
from grader.candidate import Candidate, CandidateError
from grader.exercise import GraderBug
from tests.conftest import ROOT

KV = (ROOT / "solutions" / "kv_cache.py").read_text()
KV_STAND_INS = ROOT / "grader" / "course" / "kv_cache" / "stand_ins.py"
B, H, DH = 1, 2, 3


def build(cls, *init, stand_in=False, state=None, **init_kwargs):
    return {"do": "build", "class": cls, "init": list(init), "init_kwargs": init_kwargs, "state": state,
            "stand_in": stand_in}


def call(obj, method, *args, may_raise=False, refs=None):
    return {"do": "call", "object": obj, "method": method, "args": list(args), "kwargs": {}, "refs": refs or {},
            "may_raise": may_raise}


def get(obj, attribute):
    return {"do": "get", "object": obj, "attribute": attribute}


def fill(obj, attributes, axis, start="length", value="nan"):
    return {"do": "fill", "object": obj, "attributes": list(attributes), "axis": axis, "start": start, "value": value}


@pytest.fixture
def kv(tmp_path, zygote):
    def open_(extra: str = "", stand_ins=KV_STAND_INS):
        path = tmp_path / "kv_cache.py"
        path.write_text(KV + "\n\n" + extra)
        return Candidate(path, zygote=zygote, stand_ins=stand_ins)

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
    assert torch.equal(k_then[:, :, :2], k1.double())
    assert torch.equal(k_then[:, :, 2:], torch.zeros(B, H, 2, DH, dtype=torch.float64))
    assert torch.equal(k_now[:, :, 2:3], k2.double())  # the later read sees the later write; the earlier one did not


def test_an_action_that_may_raise_is_recorded_and_the_script_goes_on(kv):
    k = torch.randn(B, H, 3, DH)
    actions = [build("KVCache", B, H, DH, 4), call(0, "append", k, k), call(0, "append", k, k, may_raise=True),
               get(0, "length")]
    with kv() as candidate:
        results = candidate.script("KVCache", actions).value
    assert isinstance(results[2], CandidateError)
    assert results[2].type == "ValueError" and "max_len" in results[2].message
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


def test_fill_puts_nan_in_the_slots_after_the_objects_length(kv):
    k = torch.randn(B, H, 2, DH)
    actions = [build("KVCache", B, H, DH, 5), call(0, "append", k, k), fill(0, ("k", "v"), axis=2), get(0, "v")]
    with kv() as candidate:
        answer = candidate.script("KVCache", actions)
    v = answer.value[3]
    assert answer.value[2] is None and torch.equal(v[:, :, :2], k) and torch.isnan(v[:, :, 2:]).all()


BUFFERS = """
class Buffers:
    def __init__(self):
        self.a = torch.zeros(2, 5)
        self.b = torch.zeros(2, 5, dtype=torch.float64)
        self.counts = torch.zeros(2, 5, dtype=torch.int64)
        self.used = 3
        self.label = "three"
"""


@pytest.mark.parametrize("axis, start, value, filled", [
    (1, "used", "nan", (slice(None), slice(3, None))),  # an axis, from an attribute of the object
    (0, 1, "-inf", (slice(1, None),)),  # another axis, from an int
    (1, 0, 7.5, (slice(None), slice(0, None))),  # a number
])
def test_fill_sets_each_floating_tensor_from_start_on_along_its_axis(kv, axis, start, value, filled):
    actions = [build("Buffers"), fill(0, ("a", "b", "counts"), axis, start, value), get(0, "a"), get(0, "b"),
               get(0, "counts")]
    with kv(BUFFERS) as candidate:
        a, b, counts = candidate.script("KVCache", actions).value[2:]
    expected = torch.zeros(2, 5)
    expected[filled] = {"nan": math.nan, "-inf": -math.inf}.get(value, value)
    assert torch.equal(a.isnan(), expected.isnan()) and torch.equal(a.nan_to_num(), expected.nan_to_num())
    assert torch.equal(b.isnan(), expected.isnan()) and torch.equal(b.nan_to_num(), expected.double().nan_to_num())
    assert torch.equal(counts, torch.zeros(2, 5, dtype=torch.int64))  # not floating point: left as it is


def test_the_filling_is_the_graders_not_the_candidates(kv):
    with kv(BUFFERS) as candidate:
        answer = candidate.script("KVCache", [build("Buffers"), fill(0, ("a", "b"), 1, "used")])
    assert "zeros" in answer.called and not {"__setitem__", "dim", "is_floating_point"} & set(answer.called)


@pytest.mark.parametrize("change, error, says", [
    ({"attributes": "a"}, "ValueError", "list of 1 to"),
    ({"attributes": []}, "ValueError", "list of 1 to"),
    ({"attributes": ["_a"]}, "ValueError", "not a name an action may use"),
    ({"axis": -1}, "ValueError", "axis is an int"),
    ({"axis": "1"}, "ValueError", "axis is an int"),
    ({"axis": True}, "ValueError", "axis is an int"),
    ({"start": -1}, "ValueError", "non-negative int"),
    ({"start": 1.0}, "ValueError", "non-negative int"),
    ({"start": "__call__()"}, "ValueError", "not a name an action may use"),
    ({"value": "NaN"}, "ValueError", "value is one of nan, inf, -inf or a number"),
    ({"value": True}, "ValueError", "value is one of"),
    ({"value": 10 ** 400}, "ValueError", "value is one of"),
    ({"start": "label"}, "TypeError", "the object's label is builtins.str, not an int"),
    ({"attributes": ["a", "used"]}, "TypeError", "the object's used is not a torch.Tensor of more than 1 dimensions"),
    ({"axis": 2}, "TypeError", "the object's a is not a torch.Tensor of more than 2 dimensions"),
], ids=lambda v: str(v)[:30])
def test_a_fill_with_a_bad_field_is_refused_and_fills_nothing(kv, change, error, says):
    action = dict(fill(0, ("a",), 1, "used"), **change)
    with kv(BUFFERS) as candidate:
        with pytest.raises(CandidateError) as raised:
            candidate.script("KVCache", [build("Buffers"), action])
    assert raised.value.action == 1 and raised.value.type == error, raised.value.message
    assert says in raised.value.message, raised.value.message


STAND_INS = """
import torch


class Doubler:
    def __init__(self, n):
        self.weight = torch.full((n,), 2.0)

    def __call__(self, x):
        return torch.mul(x, self.weight)

    @property
    def total(self):
        return torch.sum(self.weight)

    @staticmethod
    def unit():
        return torch.ones(1)
"""

USES_A_HELPER = """
class UsesHelper:
    def run(self, x, helper):
        return torch.tanh(helper(x))
"""


def test_a_stand_in_is_loaded_by_path_and_its_torch_calls_are_not_the_candidates(kv, tmp_path):
    stand_ins = tmp_path / "stand_ins.py"
    stand_ins.write_text(STAND_INS)
    x = torch.randn(3)
    actions = [build("Doubler", 3, stand_in=True), build("UsesHelper"), call(1, "run", x, refs={"helper": 0}),
               get(0, "total"), call(0, "unit")]
    with kv(USES_A_HELPER, stand_ins=stand_ins) as candidate:
        answer = candidate.script("KVCache", actions)
    out, total, unit = answer.value[2:]
    assert torch.equal(out, torch.tanh(2 * x)) and total.item() == 6.0 and torch.equal(unit, torch.ones(1))
    assert "tanh" in answer.called  # the candidate's own call
    assert not {"full", "mul", "sum", "ones"} & set(answer.called), answer.called  # the stand-in's: its __init__,
    # a method called by the candidate's code, a property, a static method


def test_stand_ins_that_will_not_load_are_the_graders_fault(tmp_path):
    """The zygote loads the stand-ins (grader code) before any child runs: a broken file ends it as a bug of the
    grader's, never a candidate's error. Its own zygote: the shared one must live on."""
    stand_ins = tmp_path / "stand_ins.py"
    stand_ins.write_text("raise RuntimeError('a broken stand-in file')\n")
    path = tmp_path / "kv_cache.py"
    path.write_text(KV)
    with pytest.raises(GraderBug, match=r"(?s)exit code 70.*a broken stand-in file"):
        with Candidate(path, stand_ins=stand_ins) as candidate:
            candidate.script("KVCache", [build("KVCache", B, H, DH, 4)])


def test_a_stand_in_the_grader_did_not_name_is_refused(kv):
    with kv(stand_ins=None) as candidate:
        with pytest.raises(CandidateError) as raised:
            candidate.script("KVCache", [build("KVCache", B, H, DH, 4, stand_in=True)])
    assert raised.value.type == "LookupError" and "no stand-in KVCache" in raised.value.message


def test_the_stand_in_cache_is_the_exercises_and_its_torch_calls_are_not_the_candidates(kv):
    """A module runs with the exercise's stand-in cache, passed by reference; the candidate's KVCache is never built."""
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
