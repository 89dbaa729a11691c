"""Every answer from the worker is untrusted data (issue 17).

A worker answer forged to pass the outer checks (the frame's framing, its JSON, its tags) must cost the
candidate only the check that asked for it, named as malformed: never a crash of the grader (exit 3).
Each test forges, at the grader's side, every answer of one kind as the grader reads it off the pipe.
"""

import copy

import pytest

from grader.candidate import MALFORMED, Candidate
from tests.conftest import ROOT, explain, lost

KV_CACHE = (ROOT / "solutions" / "kv_cache.py").read_text()
SCRIPTED = {"KVCache", "CachedSelfAttention"}  # kv_cache's steps checked with scripts


def forge(monkeypatch, op: str, change) -> list:
    """Every successful answer to a request of `op` ("call", "module", "script") has its encoded value passed
    through `change` before the grader reads it; returns the list of forged answers, to show some were."""
    forged, asked = [], {}
    call_child, read_answer = Candidate._call_child, Candidate._read_answer

    def spy_call(self, header, *rest):
        asked["op"] = header.get("op")
        return call_child(self, header, *rest)

    def spy_read(self, *rest):
        frame, blobs = read_answer(self, *rest)
        if asked.get("op") == op and frame.get("ok") is True:
            value = change(copy.deepcopy(frame.get("value")))
            if value is not None:
                forged.append(value)
                frame = dict(frame, value=value)
        return frame, blobs

    monkeypatch.setattr(Candidate, "_call_child", spy_call)
    monkeypatch.setattr(Candidate, "_read_answer", spy_read)
    return forged


def malformed_messages(result) -> list[str]:
    return [c.message for s in result.steps for c in s.checks if MALFORMED in c.message]


def assert_costs_only(result, steps: set[str], forged: list) -> None:
    assert forged, "nothing was forged: the test no longer reaches the answers it means to"
    assert set(lost(result)) and set(lost(result)) <= steps, explain(result)
    assert malformed_messages(result), explain(result)
    assert "internal error" not in explain(result)


def digits_as(table: str):
    """A script's errors keyed by digits that pass str.isdigit() but are no ASCII ('²', '٣')."""
    to = str.maketrans("0123456789", table)

    def change(value):
        last = str(len(value["items"]["results"]["items"]) - 1).translate(to)  # the last action, in those digits
        error = {"kind": "dict", "items": {"type": "ValueError", "message": "forged", "line": None}}
        value["items"]["raised"]["items"][last] = error
        return value

    return change


@pytest.mark.parametrize("table", ["⁰¹²³⁴⁵⁶⁷⁸⁹", "٠١٢٣٤٥٦٧٨٩"], ids=["superscript", "arabic-indic"])
def test_a_script_error_keyed_by_a_digit_that_is_no_ascii_costs_that_check(grade_source, monkeypatch, table):
    forged = forge(monkeypatch, "script", digits_as(table))
    result = grade_source(base=KV_CACHE, name="kv_cache.py")  # a GraderBug would raise here (exit 3)
    assert_costs_only(result, SCRIPTED, forged)


def test_a_script_with_one_result_too_few_costs_that_check(grade_source, monkeypatch):
    def one_too_few(value):
        value["items"]["results"]["items"] = value["items"]["results"]["items"][:-1]
        return value

    forged = forge(monkeypatch, "script", one_too_few)
    result = grade_source(base=KV_CACHE, name="kv_cache.py")
    assert_costs_only(result, SCRIPTED, forged)
    assert any("sent" in m and "results" in m for m in malformed_messages(result)), explain(result)


def without(field: str):
    def change(value):
        if field not in value["items"]:
            return None
        del value["items"][field]
        return value

    return change


def layers_as_numbers(value):
    value["items"]["children"]["items"] = {name: 5 for name in value["items"]["children"]["items"]}
    return value


@pytest.mark.parametrize("change", [without("children"), without("unloaded"), without("output"), layers_as_numbers],
                         ids=["no layers", "no unloaded", "no output", "layer classes a number"])
def test_a_module_answer_missing_a_field_or_with_layers_of_the_wrong_type_costs_that_check(
        grade_source, monkeypatch, change):
    forged = forge(monkeypatch, "module", change)
    result = grade_source()
    assert_costs_only(result, {"MultiHeadAttention"}, forged)


def test_a_module_answer_with_a_gradient_too_few_costs_that_check(grade_source, monkeypatch):
    def one_gradient_too_few(value):
        if "arg_grads" not in value["items"]:
            return None
        value["items"]["arg_grads"]["items"] = value["items"]["arg_grads"]["items"][:-1]
        return value

    forged = forge(monkeypatch, "module", one_gradient_too_few)
    result = grade_source()
    assert_costs_only(result, {"MultiHeadAttention"}, forged)
    names = {c.name for s in result.steps for c in s.checks if MALFORMED in c.message}
    assert len(names) == 1 and "gradients" in names.pop(), explain(result)


# Issue 12: text from the candidate is sanitised for every format. ---------------------------------------------

# an escape sequence, characters XML has no place for, a lone surrogate, Markdown, a line of its own
HOSTILE_TEXT = "'bad\\x1b[31m\\x0b\\ufffe\\udcff|*x*`y` <b>z</b>\\n## Heading'"
RAISES = f"def softmax(scores, dim=-1):\n    raise ValueError({HOSTILE_TEXT})\n"
# a type name of the candidate's (type() itself refuses a lone surrogate)
HOSTILE_NAME = HOSTILE_TEXT.replace("\\udcff", "")
RETURNS = f"def merge_heads(x):\n    return type({HOSTILE_NAME}, (), {{}})()\n"


def rendered(result, fmt: str) -> str:
    """The report as the CLI writes it, which must be UTF-8 that decodes strictly."""
    from grader import report

    text = report.render(fmt, result)
    return text.encode("utf-8").decode("utf-8")  # UnicodeEncodeError for a lone surrogate


@pytest.fixture(scope="module")
def hostile_grade(zygote, tmp_path_factory):
    from grader.grade import grade
    from tests.conftest import REFERENCE

    path = tmp_path_factory.mktemp("hostile") / "mha.py"
    path.write_text(REFERENCE + "\n\n" + RAISES + RETURNS)
    return grade(path, zygote=zygote, device="cpu")


def test_the_candidates_text_reaches_the_messages_escaped(hostile_grade):
    messages = [c.message for s in hostile_grade.steps for c in s.checks if c.points < c.max_points]
    assert any("ValueError: bad" in m for m in messages) and any("<candidate.bad" in m or "candidate.bad" in m
                                                                 for m in messages), messages
    for message in messages:
        assert message.isprintable(), ascii(message)  # no control character, no lone surrogate, no newline


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "gradescope", "github", "html"])
def test_every_format_of_a_report_with_the_candidates_text_is_valid(hostile_grade, fmt):
    import json
    import xml.etree.ElementTree as ET

    import click

    from grader import report

    if fmt not in report.FORMATS:
        pytest.skip(f"no {fmt} format here")
    text = rendered(hostile_grade, fmt)
    if fmt == "text":
        assert all(c.isprintable() for line in click.unstyle(text).splitlines() for c in line)
        assert not any(line.startswith("## Heading") for line in text.splitlines())
    elif fmt in ("json", "gradescope", "github"):
        json.loads(text)
    elif fmt == "junit":
        ET.fromstring(text.encode())
    elif fmt == "html":
        assert "<b>z</b>" not in text, "the candidate's markup must be escaped"


def test_markdown_escapes_the_candidates_text(hostile_grade):
    text = rendered(hostile_grade, "markdown")
    assert "*x*" not in text and "<b>" not in text, text


def test_a_file_name_is_sanitised_in_every_format(zygote, tmp_path):
    import os

    from grader import report
    from grader.grade import grade
    from tests.conftest import REFERENCE

    folder = tmp_path / "x\nTotal: 100" / os.fsdecode(b"100\xff")  # a path that says "...\nTotal: 100/100\xff/mha.py"
    folder.mkdir(parents=True)
    (folder / "mha.py").write_text(REFERENCE + "\n\n" + RAISES)
    result = grade(folder / "mha.py", zygote=zygote, device="cpu")
    failures = []
    for fmt in report.FORMATS:
        try:
            text = rendered(result, fmt)
        except UnicodeError as error:
            failures.append(f"{fmt}: {error}")
            continue
        if any(line.startswith("Total: 100/100") for line in text.splitlines()):
            failures.append(f"{fmt}: a forged total line")
    assert not failures, failures


# Issue 10: a question's sizes are bounded whatever their type. -----------------------------------------------


def ask(name: str, *args, exercise: str = "local_attention", **kwargs) -> dict:
    """The oracle's reply to a composite asking for step `name` of `exercise`, as the worker would ask, the oracle
    made as the check runner makes it (the spec's reference, its signature or the contract's)."""
    import importlib
    import inspect

    from grader import wire
    from grader.oracle import Oracle

    spec = importlib.import_module(f"grader.course.{exercise}.spec").SPEC
    reference = next(s.reference for s in spec.steps if s.id == name)
    contract = importlib.import_module(spec.contract) if spec.contract else None
    oracle = Oracle({name: reference}, {name: inspect.signature(getattr(contract, name) if contract else reference)})
    blobs: list[bytes] = []
    frame = {"op": "answer", "name": name, "args": wire.encode(args, blobs), "kwargs": wire.encode(kwargs, blobs)}
    return oracle.reply(frame, blobs, [])


def size_forms():
    import numpy as np
    import torch

    return [torch.tensor(40000), torch.tensor(40000.0), 40000.0, np.array(40000), torch.tensor([40000]),
            torch.tensor(float("inf")), torch.full((1000,), 3), True * 40000]


@pytest.mark.parametrize("form", range(8), ids=["0-dim int tensor", "0-dim float tensor", "float", "0-dim array",
                                                "1-element tensor", "infinite", "many numbers", "int"])
def test_a_size_of_any_type_past_the_bound_is_refused_before_the_answer_is_built(form):
    import resource

    size = size_forms()[form]
    ask("sliding_window_mask", 2, 2, 1)  # torch and the reference imported: what follows is the question alone
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    reply = ask("sliding_window_mask", size, size, 1)  # 40000 × 40000 bools had it been answered
    assert reply == {"ok": False, "error": "inputs too large to answer"}, reply
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # kB: nothing big was built


def test_offsets_held_as_data_past_the_bound_are_refused_before_the_answer_is_built():
    """Review 26's c01: PagedSelfAttention asked varlen_attention about three (2, 2, 4) tensors with cu_seqlens
    [0, 40000], and the reference built 40000 × 40000 masks in the grader (3.4 GB). The grader's varlen checks
    cu_seqlens against the contract (from 0 to the packed rows) before it builds anything; [0, 2] is answered."""
    import resource

    import torch

    t = torch.zeros(2, 2, 4)
    small = torch.tensor([0, 2], dtype=torch.int32)
    assert ask("varlen_attention", t, t, t, small, small, causal=True, exercise="paged_attention")["ok"] is True
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for dtype in (torch.int32, torch.float64):  # the twenty-seventh review's c02: whole numbers in a float tensor
        big = torch.tensor([0, 40000], dtype=dtype)
        reply = ask("varlen_attention", t, t, t, big, big, causal=True, exercise="paged_attention")
        assert reply["ok"] is False and "cu_seqlens must run from 0 to the 2 packed rows" in reply["error"], reply
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # kB: nothing big was built
    values = torch.full((2, 2, 4), 30000.5)  # data of any size: answered
    assert ask("varlen_attention", values, t, t, small, small, exercise="paged_attention")["ok"] is True


def test_an_answer_as_large_as_its_inputs_times_a_count_is_refused_before_it_is_built():
    """The twenty-eighth review's c05: repeat_kv of a (1, 1, 256, 256) tensor with n_rep 256 was bounded as 256² and
    built 16.8 M elements in the grader, six times (2.2 GB). The bound counts the inputs times the largest integer
    too; the same question with n_rep 2 is answered."""
    import resource

    import torch

    x = torch.zeros(1, 1, 256, 256, dtype=torch.float64)
    assert ask("repeat_kv", x, 2, exercise="gqa")["ok"] is True
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert ask("repeat_kv", x, 256, exercise="gqa") == {"ok": False, "error": "inputs too large to answer"}
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # kB: nothing big was built


def test_small_sizes_of_any_type_are_still_answered():
    import numpy as np
    import torch

    for size in (8, torch.tensor(8), 8.0, np.array(8)):
        reply = ask("sliding_window_mask", size, 8, 2)
        assert reply["ok"] is True, (size, reply)
    assert ask("alibi_bias", torch.ones(4), torch.tensor(6), 6)["ok"] is True  # a tensor's values are data


# Issue 11: an answer far larger than a check can read is refused unread. ---------------------------------------

BIG_ANSWERS = """
_BIG = 64 * 2**20 // 4  # 64 MiB of float32 from every step: the checks read kilobytes


def _big(*args, **kwargs):
    return torch.zeros(_BIG)


project = split_heads = attention_scores = scale_scores = apply_mask = softmax = weighted_sum = merge_heads = _big


class MultiHeadAttention(MultiHeadAttention):
    def forward(self, *args, **kwargs):
        return _big()
"""

MEASURED = """
import json, resource, sys, time
from pathlib import Path
from grader.grade import grade
started = time.monotonic()
result = grade(Path(sys.argv[1]), device="cpu")
print(json.dumps({"score": result.score, "seconds": time.monotonic() - started,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "messages": sorted({c.message for s in result.steps for c in s.checks if c.points < c.max_points})}))
"""


def test_huge_answers_from_every_step_cost_their_checks_quickly_and_never_the_graders_memory(tmp_path):
    """Before: 64 MiB from every step took the grader to 1.8 GB and 154 s (a normal grade: 0.25 GB, 10 s)."""
    import json
    import subprocess
    import sys

    from tests.conftest import REFERENCE

    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\n\n" + BIG_ANSWERS)
    run = subprocess.run([sys.executable, "-c", MEASURED, str(path)], capture_output=True, text=True, timeout=600,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.splitlines()[-1])
    assert measured["peak_mb"] < 1024, measured["peak_mb"]  # the grader's own process: the workers are apart
    assert measured["seconds"] < 90, measured["seconds"]
    assert measured["score"] <= 2  # the module's layers, built without a forward pass
    assert any(MALFORMED in m and "bytes of tensors" in m for m in measured["messages"]), measured["messages"]


def test_an_answer_nested_hundreds_deep_costs_its_checks_and_never_the_grader(grade_source):
    """A second hostile review's exit 3: 400 lists deep passed the worker and JSON, then overflowed a check."""
    code = """
    def merge_heads(x):
        nest = []
        for _ in range(400):
            nest = [nest]
        return nest
    """
    result = grade_source(code)
    assert set(lost(result)) == {"merge_heads", "MultiHeadAttention"}, explain(result)
    assert all(MALFORMED in c.message for s in result.steps if s.id == "merge_heads" for c in s.checks
               if c.points < c.max_points and not c.name.endswith("_rules")), explain(result)
