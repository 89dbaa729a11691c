"""The search (grader/engine/search.py): a wrong answer no step listed is named from the step's own reference and
arguments, in the step's words, after the step's own mistakes, within its bounds, and never a right-looking guess.

Each test builds a step from a small reference, hands Run.explain a wrong answer made by one generic change, and
reads the name. No candidate runs: the diagnosis works on the answer alone.
"""

import math

import pytest
import torch

from grader.engine import Call, Mistake, Spec, StepSpec, search, values
from grader.engine.runner import Context, Run


def attend(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1) @ v


def frequencies(head_dim: int, base: float = 10000.0):
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def window_mask(t: int, window: int | None = None):
    p, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    return (j <= p) & (j > p - (t if window is None else window))


def with_weights(x, w):
    return x @ w, torch.softmax(x, -1)


def run_for(reference, call: Call, mistakes=(), module: bool = False, outputs=()) -> Run:
    step = StepSpec("step", lambda gen, dtype: call, reference, (values("values", 1),), mistakes, outputs=outputs,
                    module=module)
    context = Context(candidate=None, seed=0, device="cpu", source="", forbidden={})
    return Run(context, Spec((step,)), step, step.checks[0], None, "step_values")


def named(reference, call: Call, value, **options):
    mistake = run_for(reference, call, **options).explain(value, call)
    return mistake and mistake.id, mistake and mistake.message


def qkv(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=dtype) for _ in range(3))
    return Call((q, k, v), names=("q", "k", "v"))


def test_keys_passed_as_values():
    call = qkv()
    q, k, v = call.args
    mistake, message = named(attend, call, attend(q, v, k))
    assert mistake == "arguments_swapped" and "`k` and `v`" in message and "keys passed as values" in message


def test_one_argument_copied_in_place_of_another():
    call = qkv()
    q, k, _ = call.args
    mistake, message = named(attend, call, attend(q, k, k))
    assert mistake == "argument_duplicated" and "`k` was used in place of `v`" in message


def test_an_argument_with_no_effect_is_named_with_its_default():
    call = Call((8,), {"base": 500000.0}, ("head_dim",))
    mistake, message = named(frequencies, call, frequencies(8))
    assert mistake == "argument_ignored" and "`base`" in message and "10000.0" in message


def test_an_ignored_mask():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, 5, 5, generator=g) < 0.6
    mask[..., 0] = True
    call = Call((q, k, v, mask), names=("q", "k", "v", "mask"))
    mistake, message = named(attend, call, attend(q, k, v))
    assert mistake == "argument_ignored" and "`mask`" in message


def test_a_whole_number_one_off_and_none_read_as_zero():
    assert named(window_mask, Call((7, 3)), window_mask(7, 4))[0] == "off_by_one"
    assert named(window_mask, Call((7, 3)), window_mask(7, 2))[0] == "off_by_one"
    assert named(window_mask, Call((7, None)), window_mask(7, 0))[0] == "none_read_as_zero"


def test_a_bool_answer_with_its_edge_moved_by_one():
    def padding(lengths, t: int):
        return torch.arange(t) < lengths[:, None]

    lengths = torch.tensor([5, 2, 7])
    mistake, _ = named(padding, Call((lengths, 7)), torch.arange(7) < lengths[:, None] - 1)
    assert mistake == "mask_edge_off_by_one"


def test_an_input_read_transposed():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 4, 4, generator=g, dtype=torch.float64), torch.randn(4, 6, generator=g, dtype=torch.float64)
    mistake, message = named(lambda x, w: x @ w, Call((x, w), names=("x", "w")), x.transpose(-2, -1) @ w)
    assert mistake == "input_transposed" and "`x`" in message


def test_parts_of_a_tuple_in_another_order_even_of_other_shapes():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 5, generator=g, dtype=torch.float64), torch.randn(5, 2, generator=g, dtype=torch.float64)
    out, weights = with_weights(x, w)
    mistake, message = named(with_weights, Call((x, w)), (weights, out), outputs=("out", "weights"))
    assert mistake == "outputs_reordered" and "(weights, out)" in message


def test_float64_computed_in_float32():
    call = qkv()
    value = attend(*(x.float() for x in call.args)).double()
    mistake, message = named(attend, call, value)
    assert mistake == "computed_in_float32" and "`step`" in message


def test_a_module_s_layers_swapped_and_copied():
    g = torch.Generator().manual_seed(4)
    state = {f"{n}.weight": torch.randn(4, 4, generator=g, dtype=torch.float64) for n in ("w_q", "w_k", "w_v")}
    x = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)

    def module(state, x):
        q, k, v = (x @ state[f"{n}.weight"].T for n in ("w_q", "w_k", "w_v"))
        return attend(q, k, v)

    call = Call((x,), names=("x",), state=state)
    swapped = {**state, "w_k.weight": state["w_v.weight"], "w_v.weight": state["w_k.weight"]}
    mistake, message = named(module, call, module(swapped, x), module=True)
    assert mistake == "arguments_swapped" and "`w_k` and `w_v`" in message
    copied = {**state, "w_v.weight": state["w_k.weight"]}
    mistake, message = named(module, call, module(copied, x), module=True)
    assert mistake == "argument_duplicated" and "`w_k` was used in place of `w_v`" in message


def test_the_step_s_own_mistake_comes_first():
    call = qkv()
    q, k, v = call.args
    own = Mistake("step.values_are_keys", "multiplied the weights by the keys: use v",
                  lambda q, k, v, mask=None: attend(q, k, k))
    assert named(attend, call, attend(q, k, k), mistakes=(own,))[0] == "step.values_are_keys"


def test_no_name_for_an_answer_no_change_explains():
    call = qkv()
    value = attend(*call.args) + 0.01 * torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(5),
                                                    dtype=torch.float64)
    assert named(attend, call, value) == (None, None)


def test_the_search_is_bounded(monkeypatch):
    call = qkv()
    q, k, v = call.args
    run = run_for(attend, call)
    monkeypatch.setattr(search, "MAX_VARIANTS", 0)
    assert run.explain(attend(q, k, k), call) is None
    monkeypatch.setattr(search, "MAX_VARIANTS", 160)
    run.ctx.shared[search.SPENT] = search.GRADE_BUDGET_S + 1  # the grade's searches have had their time
    assert run.explain(attend(q, k, k), call) is None


@pytest.mark.parametrize("mistake", search.GENERIC, ids=lambda m: m.id)
def test_every_generic_mistake_is_catalogued(mistake):
    from grader.catalogue import general_mistakes

    assert mistake.id in {e.id for e in general_mistakes()}
