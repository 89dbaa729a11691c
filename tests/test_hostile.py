"""Hostile and broken candidate files: every case ends in bounded time with true scores for the rest.

Each test is one candidate (the reference with something appended, which runs at import
or replaces a step) and the outcome it must get. Numbers refer to the cases of issue 3.
"""

import ast
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from grader import cli, keys, report
from grader.candidate import NOT_IMPORTED, Candidate
from grader.exercise import GraderBug, load_course
from grader.grade import grade
from grader.pool import Zygote
from grader.sandbox.worker import BUG_EXIT
from tests.conftest import PORTABLE, REFERENCE, ROOT, explain, lost, mistakes, needs_namespaces, report_but_when

REFERENCE_PATH = ROOT / "solutions" / "mha.py"

STEPS_OF_MODULE = {"MultiHeadAttention"}


def step(result, step_id):
    return next(s for s in result.steps if s.id == step_id)


def messages(result, step_id=None):
    return {c.message for s in result.steps if step_id in (None, s.id) for c in s.checks if c.points < c.max_points}


# 1. -------------------------------------------------------------------------------------


def test_1_syntax_error_scores_0_with_its_line_and_the_report_still_prints(tmp_path):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\ndef broken(:\n    pass\n")
    result = CliRunner().invoke(cli.main, [str(path), "--device", "cpu"])
    line = len(REFERENCE.splitlines()) + 2
    assert result.exit_code == 1
    assert f"could not import: SyntaxError at line {line}" in result.stdout and "Total: 0/100" in result.stdout
    assert result.stdout.count("SyntaxError") == 1, result.stdout  # said once, for the file


def test_1_import_error_scores_0_and_names_the_module(grade_source):
    result = grade_source("import no_such_package_here")
    assert result.score == 0
    assert result.environment["file_error"] == (
        f"could not import: ModuleNotFoundError: No module named 'no_such_package_here' (line {len(REFERENCE.splitlines()) + 3})"
    )
    assert messages(result) == {NOT_IMPORTED}


def test_1_a_file_the_parser_cannot_hold_scores_0_and_is_no_internal_error(tmp_path):
    """Ten thousand unary minus signs exhaust the parser's memory: the grader's own reading of the file
    (the rules, the diagnosis, watch's keys) must take that as a file that does not parse."""
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\nx = " + "-" * 10_000 + "1\n")
    result = CliRunner().invoke(cli.main, [str(path), "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert "could not import: MemoryError" in result.stdout and "Total: 0/100" in result.stdout



@pytest.mark.parametrize("fmt", ["text", "json", "junit"])
def test_1_a_type_name_of_the_candidates_cannot_forge_a_report_line_or_break_a_format(tmp_path, fmt):
    """A returned object's type name is the candidate's text: a newline in it must not start a forged
    "Total" line, and a lone surrogate must not stop a UTF-8 report from being written."""
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\ndef softmax(scores, dim=-1):\n"
                    "    return type('X\\nTotal: 100/100' + b'\\xff'.decode('utf-8', 'surrogateescape') * (scores.dim() > 3),"
                    " (), {})()\n")
    result = CliRunner().invoke(cli.main, [str(path), "--device", "cpu", "--format", fmt])
    assert result.exit_code == 1, result.output
    assert not any(line.startswith("Total: 100") for line in result.stdout.splitlines()), result.stdout
    if fmt == "text":
        assert "got candidate.X\\nTotal: 100/100" in result.stdout



def test_1_a_file_that_declares_another_encoding_is_refused_and_a_bom_is_read_as_python_reads_it(tmp_path):
    """A coding line makes Python run another program than the UTF-8 text the rules read (`# coding: utf-7`
    hides a forbidden name from the source scan): refused as a usage error. A byte-order mark is UTF-8."""
    path = tmp_path / "mha.py"
    path.write_text("# coding: utf-7\n" + REFERENCE)
    refused = CliRunner().invoke(cli.main, [str(path), "--device", "cpu"])
    assert refused.exit_code == 2 and "declares the encoding utf-7" in refused.stderr, refused.output
    path.write_bytes(b"\xef\xbb\xbf" + REFERENCE.encode())
    assert CliRunner().invoke(cli.main, [str(path), "--device", "cpu"]).exit_code == 0



# 2. -------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["import sys\nsys.exit(0)", "exit()", "import os\nos._exit(0)"])
def test_2_exiting_at_import_is_never_a_pass(grade_source, code):
    result = grade_source(code)
    assert result.score == 0
    assert "candidate exited while importing" in result.environment["file_error"], result.environment
    assert messages(result) == {NOT_IMPORTED}


# 3. -------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, status", [
    ("import os\ndef merge_heads(x):\n    os._exit(0)", "exit code 0"),
    ("import sys\ndef merge_heads(x):\n    sys.setrecursionlimit(10**8)\n    nest = []\n    for _ in range(10**6):\n"
     "        nest = [nest]\n    return str(nest)", "killed by signal SIGSEGV"),  # the C stack overflows
])
def test_3_a_worker_dying_in_one_step_costs_only_that_step(grade_source, code, status):
    result = grade_source(code)
    assert set(lost(result)) == {"merge_heads"} | STEPS_OF_MODULE, explain(result)
    assert step(result, "merge_heads").score == 0
    assert all(f"worker died ({status})" in m for m in messages(result, "merge_heads")), explain(result)


def test_3_a_crash_on_one_input_costs_only_that_check(grade_source):
    code = """
    import ctypes
    _merge_heads = merge_heads
    def merge_heads(x):
        if x.dtype == torch.float64:
            ctypes.string_at(0)
        return _merge_heads(x)
    """
    result = grade_source(code)
    failed = {c.name for c in step(result, "merge_heads").checks if c.points < c.max_points}
    assert failed == {"merge_heads_values[float64]"}, explain(result)


# 4. and 5. ------------------------------------------------------------------------------

HANGS = """
import signal
for _number in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
    try:  # refused in a worker (grader/sandbox/guard.py): a hang must be killed whatever the file tried
        signal.signal(_number, signal.SIG_IGN)
    except Exception as error:
        print("signal:", error)

def softmax(scores, dim=-1):
    while True:
        pass

def attention_scores(q, k):
    big = torch.ones(12000, 12000)
    return big @ big  # one long torch op: minutes on one thread
"""


def test_4_5_hangs_are_killed_at_their_timeout_and_the_run_stays_bounded(grade_source):
    start = time.monotonic()
    result = grade_source(HANGS, timeout=1.0)
    elapsed = time.monotonic() - start
    assert set(lost(result)) == {"softmax", "attention_scores"} | STEPS_OF_MODULE, explain(result)
    for step_id in ("softmax", "attention_scores"):
        assert step(result, step_id).score == 0
        assert all("timed out after 1 s" in m for m in messages(result, step_id)), explain(result)
    # The module's own wiring is graded with the grader's steps; only its end-to-end run, with the
    # hanging steps, times out, and says it lost only through them.
    lost_module = [c for c in step(result, "MultiHeadAttention").checks if c.points < c.max_points]
    assert [c.name for c in lost_module] == ["module_end_to_end"], explain(result)
    assert "timed out after 1 s" in lost_module[0].message and "already charged" in lost_module[0].message
    # each hanging call is waited on for its timeout, then killed: no check that timed out took much longer (a fresh
    # worker child, with CUDA its start, is the rest), and the grade ends, where an unkilled hang never would
    timed_out = [c for s in result.steps for c in s.checks if "timed out after 1 s" in c.message]
    assert timed_out and all(c.seconds < 1.0 + (8 if torch.cuda.is_available() else 3) for c in timed_out), [
        (c.name, c.seconds) for c in timed_out]
    assert elapsed < 60, elapsed


def test_whole_file_timeout_fires_and_is_reported(grade_source):
    slow = "import time\ndef project(x, weight, bias=None):\n    time.sleep(0.4)\n    return x @ weight.T + (0 if bias is None else bias)"
    start = time.monotonic()
    result = grade_source(slow, timeout=5.0, file_timeout=1.0)
    assert time.monotonic() - start < 10
    assert any("whole-file time limit (1 s) ran out" in m for m in messages(result)), explain(result)


# 6. -------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [
    "def softmax(scores, dim=-1):\n    hoard = []\n    while True:\n        hoard.append(bytearray(50_000_000))",
    "def softmax(scores, dim=-1):\n    return torch.empty(10**11)",
    # root may raise a hard limit; a worker holds no capability that would let it
    "import resource\ndef softmax(scores, dim=-1):\n    try:\n        resource.setrlimit(resource.RLIMIT_DATA, (-1, -1))\n"
    "    except (ValueError, OSError):\n        pass\n    return [bytearray(100_000_000) for _ in range(20)]",
])
def test_6_memory_bombs_hit_the_memory_limit(grade_source, code):
    result = grade_source(code, memory_limit_mb=1024)
    assert set(lost(result)) == {"softmax"} | STEPS_OF_MODULE, explain(result)
    assert all("memory limit exceeded (1024 MB)" in m for m in messages(result, "softmax")), explain(result)


# 7. -------------------------------------------------------------------------------------

ESCAPES = """
import os, subprocess, sys
def merge_heads(x):
    if os.path.exists("escaped"):  # once a worker is enough (each has a folder of its own): the limit holds them
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).reshape(B, T, H * Dh)
    open("escaped", "w").close()
    # The interpreter, not sleep(1): the worker's file system holds no /usr/bin.
    sleep = "import time; time.sleep({})"
    subprocess.Popen([sys.executable, "-c", sleep.format(4242)], start_new_session=True)  # holding our output pipe
    if os.fork() == 0:  # a double fork whose grandchild outlives its parent
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", sleep.format(4243)])
        os._exit(0)
    for _ in range(300):  # a fork bomb, held back by the process limit
        try:
            if os.fork() == 0:
                import time
                time.sleep(4244)
        except OSError:
            break
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)
"""


@needs_namespaces  # the kernel's filter (seccomp.py) is Linux's
@pytest.mark.parametrize("how", [
    "os.fork()", "subprocess.Popen([sys.executable, '-c', 'pass'])",
    # no audit event: only the kernel refuses it (the thirty-fourth review's F1)
    "import _posixsubprocess; r, w = os.pipe(); _posixsubprocess.fork_exec([b'/x'], [b'/x'], False, (), None, None,"
    " -1, -1, -1, -1, -1, -1, r, w, False, False, 0, None, None, None, -1, lambda: os._exit(0), False)",
])
def test_7_a_process_started_in_a_step_is_refused_and_says_so(grade_source, how):
    """What a process of the candidate's computes, no record sees (untiled attention in a fork, sent back through a
    pipe, kept every point): the kernel refuses it, and the step that tried fails."""
    result = grade_source(f"""
    import os, subprocess, sys
    def merge_heads(x):
        {how}
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).reshape(B, T, H * Dh)
    """)
    assert set(lost(result)) == {"merge_heads"} | STEPS_OF_MODULE, explain(result)
    said = messages(result, "merge_heads")
    assert all("refuses starting a process" in m or "Operation not permitted" in m for m in said), explain(result)


@needs_namespaces  # a subreaper (Linux) finds what left its session; see docs/sandbox.md
def test_7_no_process_the_candidate_started_outlives_the_grade(grade_with_processes):
    """Where a child may start processes (Triton's compilers, on CUDA), none outlives the grade."""
    mark = f"424{os.getpid()}"  # this run's own: another suite on the machine starts the same processes
    start = time.monotonic()
    result = grade_with_processes(ESCAPES.replace("424", mark))
    assert time.monotonic() - start < 60
    assert result.full_marks, explain(result)
    # the last child's are swept as the grade ends (the zygote answers the kill first): wait for that, bounded
    deadline = time.monotonic() + 30
    while True:
        left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        sleepers = [line for line in left.splitlines() if mark in line and "sleep" in line]
        if not sleepers or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not sleepers, left


# 8. -------------------------------------------------------------------------------------


def test_8_threads_are_refused_and_say_so(grade_source):
    """A thread runs where the worker's record of torch calls cannot see (it is per thread): refused, at
    import (the file then cannot be imported) as in a step (that step fails), with a message that says so."""
    at_import = grade_source("import threading\nthreading.Thread(target=lambda: None).start()")
    assert at_import.score == 0 and "the sandbox refuses" in at_import.environment["file_error"], explain(at_import)
    in_step = grade_source("""
    import threading
    def merge_heads(x):
        threading.Thread(target=lambda: None).start()
        B, H, T, Dh = x.shape
        return x.transpose(1, 2).reshape(B, T, H * Dh)
    """)
    assert set(lost(in_step)) == {"merge_heads"} | STEPS_OF_MODULE, explain(in_step)
    assert all("the sandbox refuses" in m for m in messages(in_step, "merge_heads")), explain(in_step)


# 9. -------------------------------------------------------------------------------------


def test_9_patching_comparisons_and_builtins_earns_nothing(grade_source):
    code = """
    import builtins, math, numpy, torch
    torch.allclose = lambda *a, **k: True
    torch.equal = lambda *a, **k: True
    torch.testing.assert_close = lambda *a, **k: None
    numpy.allclose = lambda *a, **k: True
    math.isclose = lambda *a, **k: True
    torch.Tensor.__eq__ = lambda self, other: True
    def scale_scores(scores, head_dim):
        builtins.isinstance = lambda *a: True
        return scores * 0
    def weighted_sum(weights, v):
        return torch.zeros(1)
    """
    result = grade_source(code)
    # The patches may break the candidate's own correct steps too (Tensor.__eq__ does): never the verdicts. The
    # worker's own builtins are its own, so `scores * 0` keeps only its shape check: the shape is right.
    kept = {c.name for c in step(result, "scale_scores").checks if c.points == c.max_points}
    assert kept <= {"scale_scores_shape"} and step(result, "weighted_sum").score == 0, explain(result)
    assert {"project", "split_heads", "merge_heads"}.isdisjoint(lost(result)), explain(result)


# 10. ------------------------------------------------------------------------------------

LIARS = """
import os
import platform
class Agreeable:
    def __eq__(self, other):
        return True
class Close(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True
class Payload:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
def project(x, weight, bias=None):
    return Agreeable()
def split_heads(x, num_heads):
    return torch.zeros(1).as_subclass(Close)
def attention_scores(q, k):
    return Payload()
def scale_scores(scores, head_dim):
    return (scores / head_dim ** 0.5).numpy()
def merge_heads(x):
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], -1).tolist()
"""


def test_10_lying_results_are_refused_by_type_and_never_unpickled(grade_source, tmp_path):
    marker = tmp_path / "unpickled"
    result = grade_source(LIARS.replace("{marker}", str(marker)))
    assert set(lost(result)) == {"project", "split_heads", "attention_scores", "scale_scores", "merge_heads"} | STEPS_OF_MODULE
    for step_id, type_name in [("project", "candidate.Agreeable"), ("split_heads", "candidate.Close"),
                               ("attention_scores", "candidate.Payload"), ("scale_scores", "numpy.ndarray"),
                               ("merge_heads", "builtins.list")]:
        assert step(result, step_id).score == 0, explain(result)
        assert f"expected a torch.Tensor, got {type_name}" in messages(result, step_id), explain(result)
    assert not marker.exists()


# 11. ------------------------------------------------------------------------------------

NOISE = r"""
import os, sys
print('{"exercise": "mha", "score": 100, "max_score": 100, "steps": []}')
print("==================== 61 passed in 0.1s ====================")
print("Total: 100/100 \x1b[2J\x1b[31mall green\x1b[0m")
def scale_scores(scores, head_dim):
    if not os.path.exists("flooded"):  # 100 MB once (the working directory outlives each step's worker)
        open("flooded", "w").close()
        sys.stdout.write("x" * 100_000_000)
    print('{"score": 100}')
    return scores
"""


def test_11_fake_output_changes_nothing_and_shows_only_escaped_with_verbose(grade_source):
    result = grade_source(NOISE)
    data = json.loads(report.to_json(result))  # exactly one JSON object, ours
    assert data["score"] < 100 and "candidate_output" not in data
    assert set(lost(result)) == {"scale_scores"} | STEPS_OF_MODULE, explain(result)
    text = report.to_text(result)
    assert "all green" not in text and "61 passed" not in text
    verbose = report.to_text(result, verbose=True)
    assert "\x1b[2J" not in verbose and "\\x1b[2J\\x1b[31mall green" in verbose
    assert "more bytes not kept" in verbose and len(verbose) < 1_000_000
    assert json.loads(report.to_json(result, verbose=True))["candidate_output"].startswith('{"exercise": "mha"')


# 12. ------------------------------------------------------------------------------------

PEEKS = """
import gc, os, sys
def look():
    found = []
    for name in ("solutions", "grader", "solutions.mha", "grader.course.mha.spec"):
        try:
            __import__(name)
            found.append("imported " + name)
        except ImportError as error:
            print("refused:", error)
    found += [m for m in sys.modules if m.startswith(("solutions", "grader"))]
    found += ["env " + k for k in os.environ if "SECRET" in k]
    found += ["file " + f for f in os.listdir(".") if f not in ("mha.py", "__pycache__", ".nv")]  # .nv: CUDA's empty cache folder
    try:  # the object graph is refused in a worker (grader/sandbox/guard.py)
        found += ["big tensor" for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.numel() > 10**4]
    except Exception as error:
        print("refused:", error)
    kit = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))  # grader/sandbox/worker.py
    found += [name for name in sys.modules if name.startswith("_attn_grade")] + [n for n in vars(sys.modules["__main__"])
                                                                      if not n.startswith("__")]
    for beside in ("solutions", "tests", ".git"):
        if os.path.isdir(os.path.join(kit, beside)):
            found += [beside + "/" + f for f in os.listdir(os.path.join(kit, beside))]
    print("FOUND:", found)
def softmax(scores, dim=-1):
    look()
    m = scores.amax(dim, keepdim=True).detach()
    e = torch.exp(scores - m.masked_fill(m == float("-inf"), 0.0))
    return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
"""


def test_12_peeking_finds_nothing_that_helps(grade_source, monkeypatch):
    monkeypatch.setenv("ATTN_GRADE_SECRET_TOKEN", "hunter2")
    result = grade_source(PEEKS)
    # gc.get_objects is a way to reach the worker's call record too: the rules checks say so, nothing else fails
    failed = [c for s in result.steps for c in s.checks if c.points < c.max_points]
    assert failed and all(c.name.endswith("_rules") and "get_objects" in c.message for c in failed), explain(result)
    if PORTABLE:  # no file-system isolation (the report says so): the kit's folders are in sight, and nothing else
        found = [ast.literal_eval(line[len("FOUND: "):]) for line in result.candidate_output.splitlines() if line.startswith("FOUND")]
        assert found and all(f.startswith(("solutions/", "tests/", ".git/")) for f in sum(found, [])), found
    else:
        assert "FOUND: []" in result.candidate_output and "FOUND: ['" not in result.candidate_output
    assert "refused: the candidate may not import 'solutions' while being graded" in result.candidate_output
    assert "refused: the sandbox refuses gc.get_objects" in result.candidate_output


# 13. ------------------------------------------------------------------------------------


def test_13_planted_files_beside_the_candidate_change_nothing(grade_source, tmp_path):
    (tmp_path / "conftest.py").write_text(
        "import pytest\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    return True\n"
    )
    (tmp_path / "pytest.py").write_text("raise SystemExit('planted pytest')\n")
    (tmp_path / "torch.py").write_text("raise SystemExit('planted torch')\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:python\n")
    buggy = grade_source("def scale_scores(scores, head_dim):\n    return scores")
    assert set(lost(buggy)) == {"scale_scores"} | STEPS_OF_MODULE, explain(buggy)
    assert grade_source("").full_marks  # and the next candidate from the same folder


# 14. ------------------------------------------------------------------------------------

RNG_GAMES = """
import random
def _drain():
    torch.manual_seed(1234)
    torch.rand(1000)
    random.seed(5)
_drain()
_project = project
def project(x, weight, bias=None):
    _drain()
    return _project(x, weight, bias)
"""


def test_14_rng_games_leave_the_inputs_alone_and_the_report_identical(grade_source, tmp_path):
    plain = report_but_when(grade_source(""))  # the file's hash differs, and the time; every result is the same
    games = [report_but_when(grade_source(RNG_GAMES)) for _ in range(2)]
    assert games[0] == games[1] == plain


# 15. ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code, step_id, called", [
    ("import torch.nn.functional as F\ndef project(x, weight, bias=None):\n    return F.linear(x, weight, bias)",
     "project", "linear"),
    ("from torch.nn.functional import linear as lin\ndef project(x, weight, bias=None):\n    return lin(x, weight, bias)",
     "project", "linear"),
    ("def softmax(scores, dim=-1):\n    return getattr(torch, 'soft' + 'max')(scores, dim).nan_to_num(0.0)",
     "softmax", "softmax"),
    ("def softmax(scores, dim=-1):\n    return scores.softmax(dim).nan_to_num(0.0)", "softmax", "softmax"),
    ("def softmax(scores, dim=-1):\n    return torch._safe_softmax(scores, dim)", "softmax", "_safe_softmax"),
    ("def softmax(scores, dim=-1):\n    return torch.nn.functional.softmin(-scores, dim).nan_to_num(0.0)", "softmax",
     "softmin"),  # the ninth hostile review's a01
    ("def softmax(scores, dim=-1):\n    return torch.nn.Softmax(dim)(scores).nan_to_num(0.0)", "softmax", "softmax"),
    ("""
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention")
        H = self.num_heads
        q, k, v = (split_heads(project(t, l.weight, l.bias), H) for t, l in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))
        return project(merge_heads(sdpa(q, k, v, attn_mask=mask)), self.w_o.weight, self.w_o.bias)
""", "MultiHeadAttention", "scaled_dot_product_attention"),
    ("""
class MultiHeadAttention(MultiHeadAttention):  # the twelfth hostile review's b1: SDPA's own CPU kernel, by its name
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        H = self.num_heads
        q, k, v = (split_heads(project(t, l.weight, l.bias), H) for t, l in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))
        bias = None if mask is None else torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf")).expand(
            q.shape[0], H, q.shape[2], k.shape[2])
        out, _ = torch._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
        return project(merge_heads(out), self.w_o.weight, self.w_o.bias)
""", "MultiHeadAttention", "_scaled_dot_product_flash_attention_for_cpu"),
    ("""
class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        D, H = self.embed_dim, self.num_heads
        m = torch.nn.MultiheadAttention(D, H, batch_first=True, bias=self.w_q.bias is not None).to(query)
        with torch.no_grad():
            m.in_proj_weight.copy_(torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight]))
            m.out_proj.weight.copy_(self.w_o.weight)
            if self.w_q.bias is not None:
                m.in_proj_bias.copy_(torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias]))
                m.out_proj.bias.copy_(self.w_o.bias)
        return m(query, key, value, attn_mask=None if mask is None else ~mask.expand(query.shape[0], H, query.shape[1], key.shape[1]).reshape(-1, query.shape[1], key.shape[1]), need_weights=False)[0]
""", "MultiHeadAttention", "multi_head_attention_forward"),
])
def test_15_forbidden_shortcuts_lose_the_rule_points_whatever_their_name(grade_source, code, step_id, called):
    result = grade_source(code)
    rules = [c for c in step(result, step_id).checks if c.name.endswith("_rules")]
    assert rules and all(c.outcome == "failed" and called in c.message for c in rules), explain(result)
    assert set(lost(result)) <= {step_id} | STEPS_OF_MODULE, explain(result)


# 16. ------------------------------------------------------------------------------------


def test_16_mutating_inputs_in_place_is_named_and_does_not_touch_the_graders_copies(grade_source):
    code = """
    _softmax, _project = softmax, project
    def softmax(scores, dim=-1):
        out = _softmax(scores, dim)
        scores.zero_()  # vandalise the input after use
        return out
    def project(x, weight, bias=None):
        out = _project(x, weight, bias)
        if not weight.requires_grad:  # in the module, the weights are parameters: in-place is an error there
            weight.fill_(float("nan"))
        return out
    """
    result = grade_source(code)
    # The grader's copies are untouched: every check passes but the two that ask whether the call left its
    # arguments alone, which name the change (a side effect the caller would see).
    failed = {(c.name, c.mistake_id) for s in result.steps for c in s.checks if c.points < c.max_points}
    assert failed == {("project_values[float32]", "input_changed_in_place"),
                      ("softmax_values[float32]", "input_changed_in_place")}, explain(result)


# 17. ------------------------------------------------------------------------------------


@needs_namespaces
def test_17_the_worker_has_no_network_where_the_system_allows(grade_source):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    port = server.getsockname()[1]
    code = f"""
    import socket
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=2)
        print("NETWORK: connected")
    except OSError as error:
        print("NETWORK: refused", error)
    """
    result = grade_source(code)
    server.close()
    if os.geteuid() != 0 and "NETWORK: connected" in result.candidate_output:
        pytest.skip("this system allows no network namespace to a non-root user (see docs/sandbox.md)")
    assert "NETWORK: refused" in result.candidate_output and "NETWORK: connected" not in result.candidate_output


# Found in review: ways around the cases above. ----------------------------------------------


FIND_ANCESTORS = """
import os, signal

def _parent(pid):
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])

def _worker(pid):
    return b"worker.py" in open(f"/proc/{pid}/cmdline", "rb").read()

def zygote():  # the oldest forked worker.py, found through /proc (a worker with a /proc of its own finds no parent)
    pid = int(os.readlink("/proc/self"))
    while _worker(_parent(pid)):
        pid = _parent(pid)
    return pid

def grader():
    return _parent(zygote())
"""


@pytest.fixture(scope="session")
def in_pid_namespace(zygote, tmp_path_factory):
    """Whether workers run in a PID namespace of their own here (root, or user namespaces allowed)."""
    path = tmp_path_factory.mktemp("probe") / "mha.py"
    path.write_text("import os\nprint('PID', os.getpid())\n")
    return "PID 1\n" in grade(path, zygote=zygote, device="cpu").candidate_output


@pytest.fixture(scope="module")
def zygote_without_pid_namespace():
    """Workers as on a system that allows them no PID namespace: the zygote is within their reach."""
    with Zygote(pid_namespace=False) as zygote:
        yield zygote


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_signalling_the_zygote_costs_only_the_steps_that_do_it(grade_source, signal_name, in_pid_namespace):
    code = FIND_ANCESTORS + f"def softmax(scores, dim=-1):\n    os.kill(zygote(), signal.{signal_name})\n"
    result = grade_source(code)
    assert set(lost(result)) == {"softmax"} | STEPS_OF_MODULE, explain(result)
    # Out of reach (no such pid, or in the worker's own /proc not even a parent to find), or killed and noticed.
    expected = ("ProcessLookupError", "FileNotFoundError") if in_pid_namespace else ("zygote was killed",)
    assert any(e in step(result, "softmax").checks[0].message for e in expected), explain(result)


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP"])
def test_a_zygote_within_reach_that_is_signalled_costs_only_the_steps_that_do_it(
    tmp_path, zygote_without_pid_namespace, signal_name
):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + FIND_ANCESTORS + f"def softmax(scores, dim=-1):\n    os.kill(zygote(), signal.{signal_name})\n")
    result = grade(path, zygote=zygote_without_pid_namespace, device="cpu")
    assert set(lost(result)) == {"softmax"} | STEPS_OF_MODULE, explain(result)
    assert "zygote was killed or stopped while running softmax" in step(result, "softmax").checks[0].message
    assert zygote_without_pid_namespace.pid_namespace is False  # a restart keeps the setting


def test_a_zygote_within_reach_killed_at_import_costs_only_that_file(tmp_path, zygote_without_pid_namespace):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + FIND_ANCESTORS + "os.kill(zygote(), signal.SIGKILL)\n")
    result = grade(path, zygote=zygote_without_pid_namespace, device="cpu")
    assert result.score == 0
    assert result.environment["file_error"] == "the worker's zygote was killed or stopped while importing"
    assert messages(result) == {NOT_IMPORTED}, explain(result)
    path.write_text(REFERENCE)  # the next file, on the same (borrowed) zygote, gets its true score
    assert grade(path, zygote=zygote_without_pid_namespace, device="cpu").full_marks


@pytest.mark.parametrize("how", ["os.kill(grader(), signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)", "os.kill(0, signal.SIGKILL)"])
def test_the_grader_and_every_other_process_are_out_of_reach(grade_source, how, in_pid_namespace):
    if not in_pid_namespace:  # without one these would kill this test run (and, as root, the machine)
        pytest.skip("no PID namespace for workers on this system (see docs/sandbox.md)")
    code = FIND_ANCESTORS + f"def softmax(scores, dim=-1):\n    {how}\n    return scores\n"
    result = grade_source(code)
    assert set(lost(result)) <= {"softmax"} | STEPS_OF_MODULE, explain(result)
    assert step(result, "softmax").score < step(result, "softmax").max_score


REACH_OUT = FIND_ANCESTORS + """
import stat, sys

def _open_for_writing(path):  # opened, never written: nothing changes even where it succeeds
    os.close(os.open(path, os.O_WRONLY))

def _a_disk():
    disks = [f"/dev/{n}" for n in os.listdir("/dev") if stat.S_ISBLK(os.stat(f"/dev/{n}").st_mode)]
    if not disks:
        raise OSError("no disk in /dev")
    _open_for_writing(disks[0])

def softmax(scores, dim=-1):
    attempts = {
        "write a kernel setting": lambda: _open_for_writing("/proc/sys/kernel/core_pattern"),
        "write /etc/passwd": lambda: _open_for_writing("/etc/passwd"),
        "write the grader's code": lambda: _open_for_writing(sys.argv[0]),
        "write a disk": _a_disk,
        "grader environ": lambda: open(f"/proc/{grader()}/environ", "rb").read(),
        "grader memory": lambda: open(f"/proc/{grader()}/mem", "rb"),
        "enter the grader's PID namespace": lambda: open(f"/proc/{grader()}/ns/pid"),
        "leave the pids cgroup": lambda: open("/sys/fs/cgroup/pids/cgroup.procs", "w").write("0"),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            print("DID:", what)
        except OSError as error:
            print("refused:", what, type(error).__name__)
    return torch.zeros_like(scores)
"""

SHM_FILL = """
import os
import platform
def softmax(scores, dim=-1):
    written = 0
    try:
        for i in range(40):  # 40 files of 32 MB: past the worker's /dev/shm, each under RLIMIT_FSIZE
            with open(f"/dev/shm/attn-grade-test-fill-{os.getpid()}-{i}", "wb") as f:
                f.write(bytes(32 * 1024 * 1024))
            written += 32
    except OSError as error:
        print("SHM stopped at", written, "MB:", error.strerror)
    return scores.softmax(dim)
"""


def test_dev_shm_is_small_and_private(grade_source, in_pid_namespace):
    if not in_pid_namespace:
        pytest.skip("no namespaces for workers on this system (see docs/sandbox.md)")
    result = grade_source(SHM_FILL)
    assert "SHM stopped at" in result.candidate_output, result.candidate_output
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("attn-grade-test-fill-")]


def test_root_powers_are_dropped_in_the_worker(grade_source, in_pid_namespace, monkeypatch):
    if not in_pid_namespace:  # a plain child of the same user may read the grader's /proc files
        pytest.skip("no PID namespace for workers on this system (see docs/sandbox.md)")
    monkeypatch.setenv("ATTN_GRADE_SECRET_TOKEN", "hunter2")
    result = grade_source(REACH_OUT)
    assert "DID:" not in result.candidate_output and "hunter2" not in result.candidate_output, result.candidate_output
    # Unreadable, or (in a /proc of the worker's own) not there at all.
    assert re.search("refused: grader environ (PermissionError|FileNotFoundError)", result.candidate_output), result.candidate_output
    if os.geteuid() == 0 and os.access("/sys/fs/cgroup/pids", os.W_OK):
        assert "refused: leave the pids cgroup" in result.candidate_output, result.candidate_output


def _processes_working_in(folder: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(folder)):
                found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_grader_killed_mid_grade_leaves_no_process_or_folder_behind(tmp_path, how):
    (tmp_path / "mha.py").write_text(REFERENCE + "\ndef softmax(scores, dim=-1):\n    while True:\n        pass\n")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    command = [sys.executable, "-c", "from grader.cli import entry; entry()", str(tmp_path / "mha.py"), "--device", "cpu"]
    env = dict(os.environ, TMPDIR=str(temporary))
    grader = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith("attn-grade-worker-") for p in temporary.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(3)  # into the checks, softmax hanging
    grader.send_signal(how)
    grader.wait(timeout=30)
    deadline = time.monotonic() + 15
    while (list(temporary.iterdir()) or _processes_working_in(temporary)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(temporary.iterdir()) == [] and _processes_working_in(temporary) == []


def test_a_zygote_that_fails_on_its_own_is_a_grader_bug_not_a_zero(tmp_path):
    zygote = object.__new__(Zygote)  # its process replaced by one that exits as the zygote does on a bug
    zygote._private = str(tmp_path)
    zygote._process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({BUG_EXIT})"])  # not a signal
    zygote._process.wait()
    with pytest.raises(GraderBug, match="the worker zygote failed"):
        zygote._fail(OSError("it closed its socket"))


def test_a_worker_whose_sandbox_cannot_be_set_up_is_a_grader_bug_not_a_zero(tmp_path, zygote):
    """Before the candidate's code runs, a child failed to set up its sandbox (here: its folder is gone; a hidden
    review once saw one exit 0 under load and the file scored 0, "exited while importing"). The zygote says so, the
    grader tries a fresh child once, then reports its own fault."""
    from grader.candidate import Candidate

    candidate = Candidate(REFERENCE_PATH, zygote=zygote)
    kept, candidate._pool.workdir = candidate._pool.workdir, str(tmp_path / "gone")
    try:
        with candidate, pytest.raises(GraderBug, match="could not set up its sandbox: FileNotFoundError"):
            candidate.ready()
        assert candidate._pool.workers_started >= 2  # tried again in a fresh child
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_code_that_cannot_run_anywhere_earns_nothing_by_failing_like_meta(grade_source):
    code = """
    def _no(*a, **k):
        raise RuntimeError("meta tensors")
    project = split_heads = attention_scores = scale_scores = apply_mask = softmax = weighted_sum = merge_heads = _no
    class MultiHeadAttention:
        def __init__(self, *a, **k):
            raise RuntimeError("meta tensors")
    """
    assert grade_source(code, device="auto").score == 0


def test_the_workers_pipe_is_out_of_reach(grade_source):
    """A step that hunts the stack for the worker's pipe, to forge its answers: frames are refused (answers
    forged all the same are refused by the grader: tests/test_untrusted.py)."""
    code = """
    import sys
    def scale_scores(scores, head_dim):
        frame = sys._getframe()
        while frame and "write_fd" not in frame.f_locals:
            frame = frame.f_back
        wire, fd = frame.f_locals["wire"], frame.f_locals["write_fd"]
        wire.write_frame(fd, {"ok": True, "value": None, "called": 1}, [])
        return scores / head_dim ** 0.5
    """
    result = grade_source(code)
    failed = {(s.id, c.name) for s in result.steps for c in s.checks if c.points < c.max_points}
    # beyond its own step and the module that calls it, only rules checks: sys._getframe counts as tampering
    assert all(s in {"scale_scores"} | STEPS_OF_MODULE or name.endswith("_rules") for s, name in failed), explain(result)
    assert step(result, "scale_scores").score == 0
    assert all("the sandbox refuses sys._getframe" in m for m in messages(result, "scale_scores")
               if "rules" not in m), explain(result)


def test_switching_off_the_call_record_is_refused_and_costs_every_rule(grade_source):
    code = "def softmax(scores, dim=-1):\n    with torch._C.DisableTorchFunction():\n        return torch.softmax(scores, dim).nan_to_num(0.0)"
    result = grade_source(code)
    assert step(result, "softmax").score == 0, explain(result)
    assert all("the sandbox refuses torch._C.DisableTorchFunction" in m for m in messages(result, "softmax")
               if "rules" not in m), explain(result)
    others = {c.name for s in result.steps if s.id not in ("softmax", "MultiHeadAttention") for c in s.checks
              if c.points < c.max_points}
    assert others == {"project_rules"}, explain(result)  # the source scan: the file names DisableTorchFunction


# Issue 9: the worker's file system is an allowlist. ------------------------------------------

HUNTER = """
import os
import platform
walked, found = 0, []
for folder, subfolders, files in os.walk("/"):
    if folder in ("/proc", "/sys", "/dev"):
        subfolders[:] = []
        continue
    walked += 1
    if os.path.basename(folder) == "solutions":
        found += [os.path.join(folder, name) for name in files if name.endswith(".py")]
print("HUNT: walked", walked, "folders, found", found)
for path in found:
    if path.endswith("/mha.py"):
        exec(compile(open(path).read(), path, "exec"))
"""


@needs_namespaces
def test_a_candidate_hunting_the_file_system_for_a_reference_finds_none(grade_source, tmp_path):
    shutil.copytree(ROOT / "solutions", tmp_path / "another-clone" / "solutions")  # a second clone of the kit
    result = grade_source(HUNTER, base="")
    if os.geteuid() != 0 and not result.environment["fs_isolation"]:
        pytest.skip("this system allows a non-root worker no mount namespace (see docs/sandbox.md)")
    assert result.environment["fs_isolation"] is True
    assert "HUNT: walked" in result.candidate_output and "found []" in result.candidate_output, result.candidate_output
    assert result.score == 0, explain(result)
    assert report.NO_FS_ISOLATION not in report.to_text(result)


@pytest.fixture(scope="module")
def zygote_without_fs_isolation():
    """Workers as on a system that allows them no mount namespace."""
    with Zygote(fs_isolation=False) as zygote:
        yield zygote


def test_without_file_system_isolation_the_grade_runs_and_the_report_says_so(tmp_path, zygote_without_fs_isolation):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE)
    result = grade(path, zygote=zygote_without_fs_isolation, device="cpu")
    assert result.full_marks, explain(result)
    assert result.environment["fs_isolation"] is False
    assert report.NO_FS_ISOLATION in report.to_text(result)
    assert json.loads(report.to_json(result))["environment"]["fs_isolation"] is False


def test_questions_to_the_grader_are_bounded_and_a_step_it_does_not_answer_is_refused(grade_source):
    """A module's calls to a failing step are answered by the grader; one that asks too much, or asks for a
    step the grader does not answer there, gets a refusal as an error in its own checks, and the grade goes on."""
    code = """
def softmax(scores, dim=-1):
    return scores  # wrong: its checks fail, so the module's calls to it are answered by the grader

class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        softmax(torch.zeros(2100, 2100))  # 4.4 million elements: more than the grader computes for a question
        return super().forward(query, key, value, mask)
"""
    result = grade_source(code)
    module = step(result, "MultiHeadAttention")
    assert module.score == 1, explain(result)  # the layers (the width check is gated: no right answer beside it)
    assert {"softmax", "MultiHeadAttention"} <= set(lost(result)), explain(result)
    answered = [c for c in module.checks  # end to end: its own softmax; a gated check: no right answer beside it
                if c.points < c.max_points and not c.end_to_end and not c.gated]
    assert answered and all("inputs too large to answer" in c.message for c in answered), explain(result)
    for step_id in ("project", "split_heads", "attention_scores", "weighted_sum", "merge_heads"):
        assert step_id not in lost(result)


FORGE = """
def softmax(scores, dim=-1):
    raise NotImplementedError  # unwritten: the module's calls to it are answered by the grader

def _forge(header):
    proxy = globals()['softmax']  # the grader's proxy: its closure holds its way to ask the grader, and no more
    cells = dict(zip(proxy.__code__.co_freevars, (c.cell_contents for c in proxy.__closure__)))
    try:
        return cells['ask'](header)
    except RuntimeError as error:
        print("forged:", error)

class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        FORGED
        return super().forward(query, key, value, mask)
"""


@pytest.mark.parametrize("forged", [
    '_forge({"op": "answer", "name": ["x"], "args": None, "kwargs": None})',
    'softmax(torch.zeros(2, 3, requires_grad=True)); _forge({"op": "answer_grad", "index": 1, "grads": (torch.zeros(5),)})',
], ids=["unhashable name", "gradient of the wrong shape"])
def test_forged_questions_to_the_grader_never_crash_it(grade_source, forged):
    result = grade_source(FORGE.replace("FORGED", forged))  # a GraderBug would raise here (exit 3)
    assert "MultiHeadAttention" not in lost(result) or lost(result)["MultiHeadAttention"] <= 2, explain(result)


def test_a_module_calling_its_steps_by_its_own_parameter_names_is_answered_right(grade_source):
    code = """
def weighted_sum(w, values):  # the candidate's own names, not the contract's (weights, v)
    return (w @ values).to(torch.float32) if w.dtype == torch.float64 else w @ values  # wrong in float64: answered

class MultiHeadAttention(MultiHeadAttention):
    def forward(self, query, key=None, value=None, mask=None):
        key = query if key is None else key
        value = key if value is None else value
        H = self.num_heads
        q, k, v = (split_heads(project(x, w.weight, w.bias), H) for x, w in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))
        att = softmax(apply_mask(scale_scores(attention_scores(q, k), self.head_dim), mask))
        return project(merge_heads(weighted_sum(values=v, w=att)), self.w_o.weight, self.w_o.bias)
"""
    result = grade_source(code)  # its float64 module check calls the grader's weighted_sum, by the candidate's names
    assert set(lost(result)) == {"weighted_sum"}, explain(result)


def test_cuda_that_will_not_start_in_the_worker_is_the_graders_fault(tmp_path):
    """Where CUDA starts in the grader but not in the sandboxed worker (seen on an H100: the
    driver fails with error 304 where it cannot write its /proc/self), the child says so to
    the zygote before any candidate code runs, and the grade is an internal error, not a zero."""
    from grader.candidate import Candidate
    from grader.pool import Child
    from grader.sandbox import isolation

    class BrokenCuda:
        @staticmethod
        def zeros(*args, **kwargs):
            raise RuntimeError("Unexpected error from cudaGetDeviceCount(). Error 304")

    error = isolation.cap_memory(BrokenCuda, 0, cuda=True, start_cuda=True)
    assert error == "RuntimeError: Unexpected error from cudaGetDeviceCount(). Error 304"
    assert isolation.cap_memory(BrokenCuda, 0, cuda=True, start_cuda=False) is None  # --device cpu: CUDA is not started

    class Zygote:
        def reply(self, ticket, deadline):
            return {"pid": 12345, "namespaced": True, "fs_isolated": True, "cuda_error": "RuntimeError: Error 304"}

    path = tmp_path / "mha.py"
    path.write_text("")
    candidate = Candidate(path, zygote=Zygote())
    try:
        with pytest.raises(GraderBug, match="CUDA works in the grader but would not start in its worker.*--device cpu"):
            candidate._pool.pid(Child(ticket=0, fds=(-1, -1)))
    finally:
        shutil.rmtree(candidate._pool.workdir, ignore_errors=True)  # its folder; the zygote was a stand-in


# Issue 11: the script op, which keeps a candidate's objects alive across calls (kv_cache). ---------

KV_REFERENCE = (ROOT / "solutions" / "kv_cache.py").read_text()


def grade_kv(grade_source, code, **options):
    return grade_source(code, base=KV_REFERENCE, name="kv_cache.py", **options)


def only_the_cache_lost(result) -> bool:
    """The cache lost points; the module only in its end-to-end check, which runs the candidate's own cache."""
    module = [c for c in step(result, "CachedSelfAttention").checks if c.points < c.max_points]
    return set(lost(result)) <= {"KVCache", "CachedSelfAttention"} and all(c.end_to_end for c in module)


def test_a_cache_answering_with_objects_that_are_no_plain_data_is_refused_by_type_and_never_unpickled(grade_source, tmp_path):
    marker = tmp_path / "unpickled"
    code = f"""
    import os
    class Payload:
        def __reduce__(self):
            return (os.system, ("touch {marker}",))
    class Liar(torch.Tensor):
        pass
    class KVCache(KVCache):
        def append(self, k_new, v_new):
            k, v = super().append(k_new, v_new)
            return Payload(), v.as_subclass(Liar)
    """
    result = grade_kv(grade_source, code)
    assert only_the_cache_lost(result) and "KVCache" in lost(result), explain(result)
    assert any("expected a torch.Tensor, got candidate.Payload" in m for m in messages(result, "KVCache")), explain(result)
    assert not marker.exists()


@pytest.mark.parametrize("length, refused", [
    ("10 ** 100_000", "not plain data"),  # an int JSON cannot hold (Python refuses to print it)
    ("list(range(1_000_000))", "more than the grader reads"),  # a header of megabytes
    ("torch.zeros(3 * 10**7)", "more than the grader reads"),  # 120 MB of tensor
], ids=["huge int", "long list", "big tensor"])
def test_a_cache_whose_length_is_huge_is_refused_within_bounds(grade_source, length, refused):
    code = f"""
    class KVCache(KVCache):
        @property
        def length(self):
            return self._length if not getattr(self, "_huge", False) else {length}
        @length.setter
        def length(self, value):
            self._length = value
        def append(self, k_new, v_new):
            out = super().append(k_new, v_new)
            self._huge = True  # from the first append on, reading length returns the monster
            return out
    """
    start = time.monotonic()
    result = grade_kv(grade_source, code)
    assert time.monotonic() - start < 60
    assert "KVCache" in lost(result) and only_the_cache_lost(result), explain(result)
    assert any(refused in m for m in messages(result, "KVCache")), explain(result)


def test_a_cache_whose_buffers_are_no_tensors_fails_in_its_own_checks(grade_source):
    code = """
    class KVCache(KVCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._k, self.k = self.k, [[0.0]]  # what the grader reads is a list; the buffer hides elsewhere
        def append(self, k_new, v_new):
            self.k = self._k
            out = super().append(k_new, v_new)
            self._k, self.k = self.k, [[0.0]]
            return out
    """
    result = grade_kv(grade_source, code)
    assert only_the_cache_lost(result) and "KVCache" in lost(result), explain(result)
    assert any("expected a torch.Tensor, got builtins.list" in m for m in messages(result, "KVCache")), explain(result)
    not_a_buffer = "the object's k is not a torch.Tensor of more than 2 dimensions"  # the grader's fill refused it
    assert any(not_a_buffer in m for m in messages(result, "KVCache")), explain(result)


def test_an_attribute_read_that_kills_its_worker_costs_only_that_step(grade_source):
    code = """
    import os
    class KVCache(KVCache):
        def __getattribute__(self, name):
            if name == "v" and object.__getattribute__(self, "length") > 0:
                os._exit(0)  # reading v after an append ends the worker
            return object.__getattribute__(self, name)
    """
    result = grade_kv(grade_source, code)
    assert only_the_cache_lost(result) and "KVCache" in lost(result), explain(result)
    assert any("worker died (exit code 0)" in m for m in messages(result, "KVCache")), explain(result)


def test_a_property_that_hangs_is_killed_at_its_timeout_and_waited_on_once(grade_source):
    code = """
    class KVCache(KVCache):
        @property
        def length(self):
            while True:
                pass
        @length.setter
        def length(self, value):
            pass
    """
    start = time.monotonic()
    result = grade_kv(grade_source, code, timeout=1.0)
    assert time.monotonic() - start < 2 * 1.0 + 20  # the cache's checks, then the module's end-to-end run: one wait each
    assert step(result, "KVCache").score == 0 and only_the_cache_lost(result), explain(result)
    assert all("timed out after 1 s" in m for m in messages(result, "KVCache")), explain(result)


def test_signalling_the_zygote_from_a_method_costs_only_the_steps_that_do_it(grade_source, in_pid_namespace):
    code = FIND_ANCESTORS + """
class KVCache(KVCache):
    def append(self, k_new, v_new):
        os.kill(zygote(), signal.SIGKILL)
        return super().append(k_new, v_new)
"""
    result = grade_kv(grade_source, code)
    assert only_the_cache_lost(result) and step(result, "KVCache").score < 30, explain(result)
    assert step(result, "kv_cache_bytes").score == 10 and step(result, "decode_mask").score == 15, explain(result)


# 13. ------------------------------------------------------------------------------------

SYSV_AND_KEYS = """
import os, subprocess, sys
# ctypes is refused in the worker itself (grader/sandbox/guard.py): the system calls are made by a Python
# the candidate starts, which inherits the worker's namespaces and system-call filter, not its guard.
_C = '''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
libc.syscall.restype = ctypes.c_long
key = 0x5A7A11
if sys.argv[1] == "make":
    print("segment made:", libc.shmget(key, 4096, 0o1000 | 0o600) >= 0)  # IPC_CREAT
elif sys.argv[1] == "see":
    print("segment seen from another step:", libc.shmget(key, 0, 0) >= 0)
else:
    made = libc.syscall(248 if os.uname().machine == "x86_64" else 217, b"user", b"attn-grade-test", b"x", 1, -4)
    print("keyring:", "refused" if made < 0 and ctypes.get_errno() == 1 else f"answered {made}")
'''

def _run(what):
    print(subprocess.run([sys.executable, "-c", _C, what], capture_output=True, text=True).stdout.strip())

_made = False

def project(x, weight, bias=None):  # leaves a segment behind, for a later step (or grade) to find
    global _made
    if not _made:
        _run("make")
    _made = True
    y = x @ weight.T
    return y if bias is None else y + bias

def softmax(scores, dim=-1):
    if not _made:  # in a child where project has not run (the module's calls both)
        _run("see")
    _run("key")
    m = scores.amax(dim, keepdim=True).detach()
    e = torch.exp(scores - m.masked_fill(m == float("-inf"), 0.0))
    return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
"""


def _host_segment(key: int) -> bool:
    with open("/proc/sysvipc/shm") as f:
        return any(line.split()[0] == str(key) for line in f.readlines()[1:])


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="the keyring filter knows these two")
@needs_namespaces
def test_13_no_system_v_ipc_or_keyring_reaches_past_a_child(grade_with_processes):
    result = grade_with_processes(SYSV_AND_KEYS)  # a Python of its own asks for the keyring: ctypes is refused here
    out = result.candidate_output
    assert result.full_marks, explain(result)
    assert "segment made: True" in out  # a namespace of its own: allowed, and gone with it
    assert "segment seen from another step: True" not in out and "segment seen from another step: False" in out
    assert "keyring: refused" in out and "keyring: answered" not in out
    assert not _host_segment(0x5A7A11)


# 14. ------------------------------------------------------------------------------------

HUGE_QUESTION = """
def attention_scores(q, k):  # broken on purpose: the module's calls to it are answered by the grader
    raise NotImplementedError

_forward = MultiHeadAttention.forward

def forward(self, query, key=None, value=None, mask=None):
    try:  # inputs of 64K elements each that broadcast to 4G: the grader must refuse before building it
        attention_scores(torch.zeros(256, 1, 256, 1), torch.zeros(1, 256, 256, 1))
        print("HUGE: answered")
    except RuntimeError as error:
        print("HUGE:", error)
    return _forward(self, query, key, value, mask)

MultiHeadAttention.forward = forward
"""


def test_14_a_question_whose_answer_would_not_fit_is_refused_before_it_is_built(grade_source):
    result = grade_source(HUGE_QUESTION)
    assert "HUGE: attention_scores (answered by the grader): inputs too large to answer" in result.candidate_output
    assert "HUGE: answered" not in result.candidate_output
    assert set(lost(result)) <= {"attention_scores", "MultiHeadAttention"}, explain(result)


def test_editing_the_call_record_from_a_helper_costs_the_step_that_calls_it(grade_source):
    """A helper outside the steps that finds the worker's record through the stack and edits it: the step
    calling it earns nothing, as if it had made the forbidden call (a hostile review kept 96 of 100 this way)."""
    code = """
    def _hide():
        import sys
        frame = sys._getframe(1)
        while frame is not None:
            record = frame.f_locals.get("record")
            if record is not None and hasattr(record, "seen"):
                record.seen = {n for n in record.seen if "softmax" not in n}
            frame = frame.f_back

    def softmax(scores, dim=-1):
        out = torch.softmax(scores, dim).nan_to_num(0.0)
        _hide()
        return out
    """
    result = grade_source(code)
    assert step(result, "softmax").score == 0, explain(result)
    assert all("the sandbox refuses sys._getframe" in m for m in messages(result, "softmax") if "rules" not in m)
    assert result.score < 86  # what making the call openly costs


def test_14b_an_integer_size_past_the_bounds_is_refused_before_the_mask_is_built(grade_source):
    code = """
    _local = local_attention

    def sliding_window_mask(t_q, t_k, window, device=None):  # broken: the grader answers it for local_attention
        raise NotImplementedError

    def local_attention(q, k, v, window=None, slopes=None):
        try:  # 40000 × 40000 bools, built in the grader's process, had it answered
            sliding_window_mask(40000, 40000, 1)
            print("HUGE: answered")
        except RuntimeError as error:
            print("HUGE:", error)
        return _local(q, k, v, window, slopes)
    """
    result = grade_source(code, base=(ROOT / "solutions" / "local_attention.py").read_text(), name="local_attention.py")
    assert "HUGE: sliding_window_mask (answered by the grader): inputs too large to answer" in result.candidate_output
    assert "HUGE: answered" not in result.candidate_output


def test_a_cache_buffer_of_another_width_costs_its_checks_and_crashes_nothing(grade_source):
    """Round 8: the module swaps the cache's k for one a head wider after each call; naming the mistake compared it
    with the grader's keys and raised (exit 3). The failure stands, unnamed, and the grade ends."""
    code = """
_Base = CachedSelfAttention

class CachedSelfAttention(_Base):
    def forward(self, x, cache=None):
        real = cache.__dict__.get("_real_k") if cache is not None else None
        if real is not None:
            cache.k = real
        out = super().forward(x, cache)
        if cache is not None:
            real = cache.k
            cache.__dict__["_real_k"] = real
            cache.k = torch.zeros(*real.shape[:3], real.shape[3] + 1, dtype=real.dtype, device=real.device)
        return out
"""
    result = grade_kv(grade_source, code)
    failed = {c.name for s in result.steps for c in s.checks if c.points < c.max_points}
    assert "module_cache_contents" in failed and result.score < 100, explain(result)


def test_a_forbidden_call_on_one_edge_case_only_is_a_breach(grade_source):
    """Round 8: a softmax written by hand that calls torch.softmax only for large logits kept every rule, as the
    rules check's own call never saw it. Every call of a step's checks is held to the rules."""
    code = """
def softmax(scores, dim=-1):
    if bool(scores.abs().amax() > 50):
        return torch.softmax(scores, dim).nan_to_num(0.0)
    e = torch.exp(scores - scores.amax(dim, keepdim=True).clamp_min(-1e30))
    return (e / e.sum(dim, keepdim=True)).nan_to_num(0.0)
"""
    result = grade_source(code)
    softmax = next(s for s in result.steps if s.id == "softmax")
    assert softmax.score == 0 and softmax.breach, explain(result)


def test_a_cache_length_of_several_entries_fails_its_checks_and_is_no_internal_error(grade_source):
    """The twelfth hostile review's x1: a length read as a tensor of two entries made `length != 0` raise in the
    grader (exit 3); a length is an int, and a check says so."""
    base = (ROOT / "solutions" / "kv_cache.py").read_text()
    result = grade_source("""
        class _Length:
            def __get__(self, obj, owner=None):
                return self if obj is None else torch.tensor([obj.__dict__["_n"]] * 2)

            def __set__(self, obj, value):
                obj.__dict__["_n"] = int(value)

        class KVCache(KVCache):
            length = _Length()

            def append(self, k_new, v_new):
                start, end = self.__dict__["_n"], self.__dict__["_n"] + k_new.shape[2]
                if end > self.max_len:
                    raise ValueError("past max_len")
                self.k[:, :, start:end], self.v[:, :, start:end] = k_new, v_new
                self.__dict__["_n"] = end
                return self.k[:, :, :end], self.v[:, :, :end]
    """, base=base, name="kv_cache.py")
    cache = step(result, "KVCache")
    assert cache.score < cache.max_score, explain(result)


CONSTANT = '''
import functools as _ft

def _const(r):
    if isinstance(r, tuple):
        return tuple(_const(x) for x in r)
    if not any(kind in str(getattr(r, "dtype", "")) for kind in ("float", "bool")):
        return r
    same = r.copy() if hasattr(r, "copy") else r.clone()  # an array or a tensor, filled in place
    (same.fill if hasattr(same, "fill") else same.fill_)(FILL)
    return same

for _name in STEPS:  # every step answers a constant of the right form, its code otherwise the reference's
    _obj = globals()[_name]
    if isinstance(_obj, type) and hasattr(_obj, "forward"):
        _obj.forward = _ft.wraps(_obj.forward)(lambda self, *a, _f=_obj.forward, **k: _const(_f(self, *a, **k)))
    elif callable(_obj) and not hasattr(_obj, "fn"):
        globals()[_name] = _ft.wraps(_obj)(lambda *a, _f=_obj, **k: _const(_f(*a, **k)))
'''
# What a constant answer may still earn in a step it otherwise loses: its form, the module's structure, a cache's
# bookkeeping, and a case whose right answer is that constant (one query sees every key).
FORM_ONLY = re.compile(r"_(shape|structure|cache_contents|one_token|single_query)$")


@pytest.mark.parametrize("name, fill", [*((name, 0) for name in sorted(load_course())), ("masks", 1), ("rope", 1)])
def test_constant_answers_earn_only_their_form(grade_source, name, fill):
    """The twelfth review's c1 and c2: device checks on the meta device (no values to compare) and checks that relate
    the code's own answers (no query sees the future, a rotation keeps norms) passed for a constant; they are
    gated now, earning only beside a right answer."""
    exercise = load_course()[name]
    steps = [step.id for step in exercise.steps]
    base = (ROOT / "solutions" / exercise.file).read_text()
    result = grade_source(CONSTANT.replace("FILL", str(fill)).replace("STEPS", repr(steps)), base=base,
                          name=exercise.file, device="auto")
    unearned = [f"{s.id}/{c.name}" for s in result.steps if s.score < s.max_score
                for c in s.checks if c.points and not FORM_ONLY.search(c.name)]
    assert not unearned, explain(result)


@pytest.mark.parametrize("name", sorted(load_course()))
@pytest.mark.parametrize("error", ["ValueError", "RuntimeError"])
def test_a_stub_that_refuses_everything_earns_nothing(grade_source, name, error):
    """The thirteenth review's i05 and i06: checks that a refusal passes (a width not divisible by the heads, an
    append past the pool) earned points for code that refuses every call; they are gated now."""
    exercise = load_course()[name]
    stub = (ROOT / "exercises" / exercise.file).read_text().replace("raise NotImplementedError(", f"raise {error}(")
    result = grade_source("", base=stub, name=exercise.file)
    assert result.score == 0, explain(result)


# The rest of a launcher that read its input's values into `flat` (rows × cols floats): the softmax in Python
SOFTMAX_IN_PYTHON = """\
    for r in range(rows):
        row = flat[r * cols:(r + 1) * cols]
        e = [math.exp(v - max(row)) for v in row]
        out += [v / sum(e) for v in e]
    return torch.tensor(out, dtype=torch.float64).reshape(rows, cols).to(x.dtype)
"""

READ_THROUGH_STRIDES = """
import struct


def _values(t):  # each byte a stride: torch's C++ reads it, .stride() hands it back
    got = []
    for piece in t.detach().double().contiguous().reshape(-1).split(4):
        chunk = piece.view(torch.uint8).long().unbind()
        got += torch.empty_strided((1,) * len(chunk), chunk).stride()
    return list(struct.unpack(f"<{len(got) // 8}d", bytes(got)))
"""


def test_a_launcher_that_reads_values_through_strides_keeps_nothing(grade_source):
    """The thirteenth review's i01: a Triton launcher read its input's bytes as strides of empty tensors (no storage
    or data pointer asked, every function on its allowed list) and computed the softmax in Python: 100 of 100. A
    tensor read as a number is recorded as `__index__`, on no allowed list."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(READ_THROUGH_STRIDES + """
import math

_kernel_softmax = softmax


def softmax(x):
    _kernel_softmax(x[:1, :1])  # a kernel launched, on nothing that matters
    rows, cols = x.shape
    flat, out = _values(x), []
""" + SOFTMAX_IN_PYTHON, base=base, name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


def test_a_tiled_step_that_reads_values_through_strides_breaks_its_rule(grade_source):
    """The thirteenth review's i02: flash_attention built its whole score matrix in Python floats from values read
    as strides; `__index__` is forbidden beside tolist and item there."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(READ_THROUGH_STRIDES + """
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    _values(q[..., :1, :1])  # what a Python score matrix would start from
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_pool_answered_on_the_meta_device_costs_its_checks_and_is_no_internal_error(grade_source):
    """The thirteenth review's g01: a pool whose buffers came back as meta tensors (no values) reached torch.equal
    in a check, which has no meta kernel: exit 3. An answer without values to a call made elsewhere is refused."""
    base = (ROOT / "solutions" / "paged_attention.py").read_text()
    result = grade_source("""
class PagedKVCache(PagedKVCache):  # the pool shown as meta tensors by a sloppy property
    k_cache = property(lambda self: self._k.to("meta"), lambda self, v: setattr(self, "_k", v))
    v_cache = property(lambda self: self._v.to("meta"), lambda self, v: setattr(self, "_v", v))
""", base=base, name="paged_attention.py")
    cache = step(result, "PagedKVCache")
    assert cache.score < cache.max_score, explain(result)


def test_a_flash_attention_that_tiles_only_where_tiles_only_looks_loses_it(grade_source):
    """The thirteenth review's i03: tiles_only ran at its own sizes, and a file that tiled there and made the whole
    score matrix at every other size kept its points. Every call of a tiled step is judged at its own sizes now."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    if (q.shape[-2], k.shape[-2]) == (45, 107):  # tiles_only's own sizes
        return _tiled(q, k, v, causal, block_q, block_k)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # the whole matrix, everywhere else
    if causal:
        t_q, t_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).triu(t_k - t_q + 1), float("-inf"))
    lse = torch.logsumexp(scores.to(torch.promote_types(scores.dtype, torch.float32)), -1)
    weights = torch.exp(scores - lse[..., None].to(scores.dtype)).nan_to_num()
    return weights @ v, lse
""", base=base, name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert [c.name for c in flash.checks if c.points < c.max_points] == ["flash_attention_tiles_only"], explain(result)


def test_a_launcher_that_reads_values_through_a_masks_selection_keeps_nothing(grade_source):
    """The fourteenth review's i02: a Triton launcher read each byte as the length of what a bool mask selects (a
    result as long as its True entries) and computed the softmax in Python: 100 of 100. A selection by a mask is a
    read, as what is as long as a count of its data is (masked_select, nonzero, unique)."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source("""
import math

_kernel_softmax = softmax
_ROW = torch.tensor([j >= 255 for j in range(512)]).unfold(0, 257, 1)  # window n holds n + 2 Trues


def softmax(x):
    _kernel_softmax(x[:1, :1])  # a kernel launched, on nothing that matters
    raw = x.detach().double().contiguous().reshape(-1).view(torch.uint8).long()
    data = bytes(torch.ones(257)[_ROW[b]].shape[0] - 2 for b in raw.unbind())
    rows, cols = x.shape
    flat, out = list(struct.unpack(f"<{rows * cols}d", data)), []
""" + SOFTMAX_IN_PYTHON, base="import struct\n" + base, name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


def test_a_tiled_step_that_reads_values_as_text_breaks_its_rule(grade_source):
    """The fourteenth review's i01: flash_attention read its inputs through repr (20 digits) and built the scores in
    Python; a tensor's text is forbidden in the tiled steps, as tolist is."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    text = repr(q[..., :1, :1])  # what a Python score matrix would start from
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_function_whose_forward_tiles_only_where_tiles_only_looks_loses_it(grade_source):
    """The fourteenth review's i03: FlashAttentionFunction's calls were judged only at tiles_only's sizes; its
    forward made the whole score matrix at every other size and kept its points."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source("""
_Tiled = FlashAttentionFunction


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
        if (q.shape[-2], k.shape[-2]) != (45, 107):  # anywhere but tiles_only's own sizes: the whole matrix
            (q @ k.transpose(-2, -1)).sum()
        return _Tiled.forward(ctx, q, k, v, causal, block_q, block_k)

    @staticmethod
    def backward(ctx, grad_out):
        return _Tiled.backward(ctx, grad_out)
""", base=base, name="attention_backward.py")
    function = step(result, "FlashAttentionFunction")
    lost_checks = {c.name for c in function.checks if c.points < c.max_points}
    assert "FlashAttentionFunction_tiles_only" in lost_checks, explain(result)


@pytest.mark.parametrize("loop", ["batch", "head"])
def test_flash_attention_looping_over_the_batch_or_the_heads_keeps_tiles_only(grade_source, loop):
    """The fourteenth review's f01 and f02: a slice of one batch's heads (H, T, D), or of one head of every batch,
    was counted as one batch and head's: a correct file lost tiles_only."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    per = ("torch.stack([_tiled(q[b], k[b], v[b], causal, block_q, block_k)[i] for b in range(q.shape[0])])"
           if loop == "batch" else
           "torch.stack([_tiled(q[:, h], k[:, h], v[:, h], causal, block_q, block_k)[i] for h in range(q.shape[1])], 1)")
    result = grade_source(f"""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    if q.dim() != 4:
        return _tiled(q, k, v, causal, block_q, block_k)
    return tuple({per} for i in (0, 1))
""", base=base, name="flash_attention.py")
    assert result.full_marks, explain(result)


def test_a_pool_of_another_layout_costs_its_checks_and_is_no_internal_error(grade_source):
    """The fourteenth review's g01: a pool laid out heads first, (num_blocks, H, block_size, Dh), made a check index
    a slot past its axis: exit 3. The pool's layout is checked before it is read."""
    base = (ROOT / "solutions" / "paged_attention.py").read_text()
    result = grade_source("""
class PagedKVCache(PagedKVCache):
    def __init__(self, num_blocks, block_size, num_heads, head_dim, dtype=torch.float32, device=None):
        super().__init__(num_blocks, block_size, num_heads, head_dim, dtype, device)
        self.k_cache = self.k_cache.transpose(1, 2).contiguous()
        self.v_cache = self.v_cache.transpose(1, 2).contiguous()
""", base=base, name="paged_attention.py")
    cache = step(result, "PagedKVCache")
    assert cache.score < cache.max_score, explain(result)


def test_a_launcher_that_reads_memory_through_torchs_c_tensor_type_keeps_nothing(grade_source):
    """A gap docs/sandbox.md named: the kernel check's probe replaced torch.Tensor's storage and pointer readers, and
    a launcher that asked torch._C.TensorBase for its input's storage read the real bytes (each an int of the
    storage, no torch call) and computed the softmax in Python. The probe answers every way to those readers now."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source("""
import math

_kernel_softmax = softmax


def softmax(x):
    _kernel_softmax(x[:1, :1])  # a kernel launched, on nothing that matters
    whole = x.detach().double().contiguous()
    storage = torch._C.TensorBase.untyped_storage(whole)
    data = bytes(storage[i] for i in range(whole.numel() * 8))
    rows, cols = x.shape
    flat, out = list(struct.unpack(f"<{rows * cols}d", data)), []
""" + SOFTMAX_IN_PYTHON, base="import struct\n" + base, name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


PROBE_ON_A_READER = """
import importlib.util, sys, torch

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

load("candidate", sys.argv[1])
probe = load("probe", sys.argv[2]).Launches()
x = torch.randn(3, 5)
print(bool(probe.unread("softmax", x).isnan().all()))
"""


@pytest.mark.parametrize("reader", ["torch._C.TensorBase.untyped_storage", "_KEPT"])
def test_the_kernel_probe_answers_every_way_to_a_storage(tmp_path, reader):
    """The probe itself, outside the sandbox (where no tamper check stands behind it): a launcher that reaches the
    storage through torch's C tensor type, or through the method it kept before the probe ran, reads NaN."""
    source = (ROOT / "solutions" / "triton_attention.py").read_text() + f"""
import math
import struct

_kernel_softmax = softmax
_KEPT = torch.Tensor.untyped_storage


def softmax(x):
    _kernel_softmax(x[:1, :1])
    whole = x.detach().double().contiguous()
    storage = {reader}(whole)
    data = bytes(storage[i] for i in range(whole.numel() * 8))
    rows, cols = x.shape
    flat, out = list(struct.unpack(f"<{{rows * cols}}d", data)), []
""" + SOFTMAX_IN_PYTHON
    (tmp_path / "reader.py").write_text(source)
    (tmp_path / "probe.py").write_text(PROBE_ON_A_READER)
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py"), str(tmp_path / "reader.py"),
                           str(ROOT / "grader" / "course" / "triton_attention" / "stand_ins.py")],
                          capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=300)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_an_absorbed_path_that_expands_the_latents_into_one_flat_axis_loses_latent_only(grade_source):
    """A gap docs/sandbox.md named: latent_only found keys expanded on an axis of Tk (or of the batch and Tk), not
    keys and values made as one flat axis, every token's every head's width in a row. It counts elements now, at
    sizes whose every factor tells which."""
    base = (ROOT / "solutions" / "mla.py").read_text()
    result = grade_source("""
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    b, h, tq, dn = q_nope.shape
    tk, r, dv = c_kv.shape[1], c_kv.shape[2], w_uv.shape[0] // h
    at = dict(device=c_kv.device)
    # every token's every head's key, one flat axis (b, tk, h, dn), summed over the latent with index_add_: no
    # tensor here has an axis of tokens beside one of widths
    n = torch.arange(b * tk * h * dn * r, **at)
    lane, row, token = n % r, (n // r) % (h * dn), n // (r * h * dn)
    products = c_kv.reshape(-1)[token * r + lane] * w_uk.reshape(-1)[row * r + lane]
    keys = torch.zeros(b * tk * h * dn, dtype=c_kv.dtype, **at).index_add_(0, n // r, products)
    # the no-position scores from the flat keys, the same way
    n = torch.arange(b * h * tq * tk * dn, **at)
    d, j, i, hh, bb = n % dn, (n // dn) % tk, (n // (dn * tk)) % tq, (n // (dn * tk * tq)) % h, n // (dn * tk * tq * h)
    products = q_nope.reshape(-1)[((bb * h + hh) * tq + i) * dn + d] * keys[((bb * tk + j) * h + hh) * dn + d]
    nope = torch.zeros(b * h * tq * tk, dtype=c_kv.dtype, **at).index_add_(0, n // dn, products).view(b, h, tq, tk)
    scores = (nope + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)) / (dn + q_rope.shape[-1]) ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    latent = scores.softmax(-1) @ c_kv.unsqueeze(1)  # (b, h, tq, r): the values stay folded
    y = latent @ w_uv.view(h, dv, r).transpose(-2, -1)
    return y.transpose(1, 2).reshape(b, tq, h * dv) @ w_o.T
""", base=base, name="mla.py")
    absorbed = step(result, "absorbed_attention")
    assert [c.name for c in absorbed.checks if c.points < c.max_points] == ["absorbed_attention_latent_only"], \
        explain(result)


def test_a_flash_attention_that_makes_strips_where_tiles_only_does_not_look_loses_it(grade_source):
    """A gap docs/sandbox.md named: the strips of scores (one block of queries against every key) were judged only at
    tiles_only's sizes, so a file that tiled there and made a strip per query block at every other size where the
    strip holds no more than v (block_q ≤ Dv: not too large) kept its points. A strip is judged at every call whose
    sizes tell one (no length a width, a block or a count)."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    if (t_q, t_k) == (45, 107) or block_q > v.shape[-1]:  # tiles_only's own sizes, or a strip larger than v
        return _tiled(q, k, v, causal, block_q, block_k)
    outs, lses = [], []
    for start in range(0, t_q, block_q):  # a strip of every key per block of queries
        strip = q[..., start:start + block_q, :] @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        if causal:
            rows = torch.arange(start, start + strip.shape[-2], device=q.device)[:, None]
            strip = strip.masked_fill(torch.arange(t_k, device=q.device) > rows + t_k - t_q, float("-inf"))
        lse = torch.logsumexp(strip.to(torch.promote_types(strip.dtype, torch.float32)), -1)
        outs.append(torch.exp(strip - lse[..., None].to(strip.dtype)).nan_to_num() @ v)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)
""", base=base, name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert [c.name for c in flash.checks if c.points < c.max_points] == ["flash_attention_tiles_only"], explain(result)


# The fifteenth review's a01: a launcher whose kernel does nothing, its Python run inside the launch (where the kernel
# probe handed Triton the real memory), reading its input's bytes. Each form runs `_work` there: `WHERE` says how.
IN_THE_LAUNCH = """
import math
import struct

_JOB = []


def _run_job(*_):
    if _JOB and callable(_JOB[-1]):  # once: Triton may ask more than once
        _JOB.append(_JOB.pop()())
    return (1,)


{where}


def softmax(x):
    def work():
        whole = x.detach().double().contiguous()
        data = bytes(whole.untyped_storage())
        return list(struct.unpack(f"<{{whole.numel()}}d", data))

    _JOB.append(work)
    {launch}
    flat, out = _JOB.pop(), []
    rows, cols = x.shape
"""
LAUNCH_FORMS = {
    "grid_function": ("@triton.jit\ndef _idle(x_ptr):\n    pid = tl.program_id(0)", "_idle[_run_job](x)"),
    "pre_run_hook": ("@triton.jit\ndef _idle(x_ptr):\n    pid = tl.program_id(0)\n\n\n_idle.add_pre_run_hook(_run_job)",
                     "_idle[(1,)](x)"),
    "kernel_body": ("@triton.jit\ndef _idle(x_ptr):\n    _run_job()", "_idle[(1,)](x)"),
    "fake_argument": ("class _Fake:  # Triton asks a launch's argument for its storage: this one's is Python\n"
                      "    def data_ptr(self):\n        return 0\n\n"
                      "    def untyped_storage(self):\n        _run_job()\n        raise AttributeError('none')\n\n\n"
                      "@triton.jit\ndef _idle(x_ptr):\n    pid = tl.program_id(0)",
                      "try:\n        _idle[(1,)](_Fake())\n    except Exception:\n        pass"),
    "autotuned_kernel_body": ("@triton.autotune(configs=[triton.Config({'BLOCK': 16})], key=[])\n@triton.jit\n"
                              "def _idle(x_ptr, BLOCK: tl.constexpr):\n    _run_job()", "_idle[(1,)](x)"),
}


@pytest.mark.parametrize("form", sorted(LAUNCH_FORMS))
def test_a_launcher_whose_python_runs_inside_the_launch_keeps_nothing(grade_source, form):
    """The fifteenth review's a01, a01b and a01c: the probe let Triton read real memory for the whole launch, and a
    grid function, a pre-run hook, or Python the interpreted kernel's body called read the input there: 100 of 100
    (through an autotuner too, which launches its kernel itself, or an argument of the file's own class, whose
    storage Triton asks for). Only Triton's own copies of a launch's plain arguments read memory now."""
    where, launch = LAUNCH_FORMS[form]
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(IN_THE_LAUNCH.format(where=where, launch=launch) + SOFTMAX_IN_PYTHON, base=base,
                          name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


@pytest.mark.parametrize("reader", ["complex(value).real", "_SCALAR(value)"])
def test_a_tiled_step_that_reads_values_by_any_conversion_breaks_its_rule(grade_source, reader):
    """The fifteenth review's i01 and i01c: flash_attention read its inputs through complex(t), and through
    aten._local_scalar_dense reached by getattr (past the scan for `torch.ops.`), names on no forbidden list. A call
    given a tensor that answers a Python number (not one of its layout, not a bool) is recorded as a read now."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(f"""
_tiled = flash_attention
_SCALAR = getattr(torch, "ops").aten._local_scalar_dense


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    value = q[0, 0, 0, 0]
    read = {reader}  # what a Python score matrix would start from
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


@pytest.mark.parametrize("index", ["word", "((word,),)"])
def test_a_launcher_that_reads_values_from_an_error_it_catches_keeps_nothing(grade_source, index):
    """The sixteenth review's a02: a Triton launcher indexed a one-element tensor with each of its input's words, and
    read the value back from the IndexError ("index 7 is out of bounds"), with allowed calls only: 100 of 100. The
    seventeenth's a05 nested the index two deep, past the fix (a04, i03 and i04 read arange's overflow, "sizes=[N]").
    A recorded call that raises (but for a missing attribute) is a read now, whatever its arguments: a call that
    fails this way fails, unless the file catches it."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(f"""
import math
import re

_kernel_softmax = softmax
_SAID = re.compile(r"index (-?\\d+) is out of bounds")


def softmax(x):
    _kernel_softmax(x[:1, :1])  # a kernel launched, on nothing that matters
    words, one = [], torch.zeros(1)
    for word in x.detach().double().contiguous().view(torch.int32).long().reshape(-1).unbind(0):
        try:
            one[{index}]
            words.append(0)
        except IndexError as error:
            words.append(int(_SAID.search(str(error)).group(1)))
    rows, cols = x.shape
    flat, out = list(struct.unpack(f"<{{rows * cols}}d", struct.pack(f"<{{len(words)}}i", *words))), []
""" + SOFTMAX_IN_PYTHON, base="import struct\n" + base, name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


def test_a_tiled_step_that_reads_values_as_the_lengths_of_pieces_breaks_its_rule(grade_source):
    """The sixteenth review's i01 and i02: flash_attention (and its backward) cut a tensor at its input's values with
    tensor_split and read each value back as a piece's length: 100 of 100. A tensor of many integers given where
    torch reads numbers is a read, as one integer is."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    cuts = (q[0, 0, :4, 0] * 0).long().cumsum(0) + torch.arange(4)  # what values would be cut at
    lengths = [len(piece) for piece in torch.zeros(64).tensor_split(cuts)]
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_launch_argument_that_claims_to_be_tritons_gets_no_memory(grade_source):
    """The sixteenth review's a03: an object whose class said `__module__ = "triton.language"` passed the probe's
    check of a launch's arguments, and its `data_ptr` property, which Triton's copy of the arguments asks for, read
    the real inputs: 100 of 100. Types are compared by identity now."""
    where = ("class _Fake:\n    __module__ = 'triton.language.core'\n\n"
             "    @property\n    def data_ptr(self):\n        _run_job()\n        raise AttributeError('none')\n\n\n"
             "@triton.jit\ndef _idle(x_ptr):\n    pid = tl.program_id(0)")
    launch = "try:\n        _idle[(1,)](_Fake())\n    except Exception:\n        pass"
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(IN_THE_LAUNCH.format(where=where, launch=launch) + SOFTMAX_IN_PYTHON, base=base,
                          name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


def test_a_tiled_step_that_reads_a_value_as_a_factorys_bound_breaks_its_rule(grade_source):
    """The seventeenth review's i03: a float tensor given to arange as its end is read by torch as a number (the
    result's length names it); any tensor of one number given to a factory is a read now, a float's too."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    length = len(torch.arange(q[0, 0, 0, 0].abs() * 0 + 3))  # what a value would be read as
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


@pytest.mark.parametrize("reader", [
    "torch._nested_view_from_buffer(torch.zeros(1), sizes, torch.zeros_like(sizes), torch.zeros(4, dtype=torch.long))",
    "value.to_sparse()",
])
def test_a_tiled_step_that_reads_values_through_a_nested_or_sparse_tensor_breaks_its_rule(grade_source, reader):
    """The eighteenth review's i05 and i06: flash_attention (and its backward) made a nested tensor whose components'
    sizes were its input's words, and read them back as shapes: 100 of 100 (to_sparse's indices, as long as the
    nonzeros, are the same kind of read). Every nested or sparse call is a read now."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(f"""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    value = q[0, 0, :4, 0]
    sizes = (value * 0).long().reshape(-1, 1) + 1  # what the words would be
    read = {reader}
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


@pytest.mark.parametrize("reader", [
    "getattr(torch, 'op' + 's').aten.narrow.default(torch.zeros(1).expand(64), 0, 0, word).shape[0]",
    "torch.zeros(64).unsafe_split(word)[0].shape[0]",
    "torch.ones(()).broadcast_to(word).shape[0]",
])
def test_a_tiled_step_that_reads_values_through_an_overload_or_an_unsafe_split_breaks_its_rule(grade_source, reader):
    """The nineteenth review's j01, j02 and j04: flash_attention (and its backward) gave a value as the length of
    `aten.narrow.default` (torch.ops' overload, recorded by that name, which no list named) or of `unsafe_split`
    (on no list), and read it back as a shape: 100 of 100. An overload counts as its op now, and the other ways to
    split are on the list."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(f"""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    word = (q[0, 0, 0, 0] * 0).long() + 3  # what a value's bits would be
    read = {reader}
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_launcher_may_not_call_an_overload_of_an_allowed_op(grade_source):
    """The nineteenth review's j03: a Triton launcher called `aten.narrow.default`, which the allowed list let through
    as `narrow`, with a value as its length: 100 of 100. An allowed name matches the recorded name whole now."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source("""
_kernel_softmax = softmax


def softmax(x):
    getattr(torch, "op" + "s").aten.narrow.default(x, 0, 0, 1)  # a view, by an allowed op's overload
    return _kernel_softmax(x)
""", base=base, name="triton_attention.py")
    assert step(result, "softmax").score == 0 and step(result, "softmax").breach, explain(result)


def test_a_tiled_step_whose_calls_follow_its_values_breaks_its_rule(grade_source):
    """One bit per call: a comparison read as a bool (which no list can forbid: `if mask.any():` is fair code) leaked
    the inputs' bits to Python, the calls the same whatever the bits. A step that may read no values makes the same
    sequence of calls, the same sizes, numbers and bools answered, on inputs of the same shapes and other values:
    this one answers other bools, so it read values."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    bits = [bool(x > 0) for x in q[0, 0, :8, 0].unbind(0)]  # what the score matrix in Python would start from
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_tiled_step_that_keeps_its_masks_between_calls_keeps_its_points(grade_source):
    """Fair code the comparison of calls must not blame: a step that makes its causal masks once per size and keeps
    them makes other calls the first time than after. A difference is settled by one more call, compared with the
    one before it."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention
_made = {}


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    key = (q.shape[-2], k.shape[-2], causal)
    if key not in _made:  # made once per size, as a cache of masks would be
        _made[key] = torch.ones(2, 2).tril()
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert result.score == 100, explain(result)


def test_a_tiled_step_that_maps_its_inputs_to_a_file_breaks_its_rule(grade_source):
    """The twentieth review's k01 and k02: flash_attention (and its backward) wrote its inputs into a tensor mapped on
    a file of its working folder (`torch.from_file(..., shared=True)`) and read them back with `open`: no torch
    call answers a value, so neither the lists nor the sequence of calls saw it (100 of 100). Memory shared with a
    file or a buffer Python reads is forbidden where values may not be read."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
import struct

_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    mapped = torch.from_file("values.bin", shared=True, size=4, dtype=torch.float32)
    mapped.copy_(q[0, 0, 0, :4].float())
    with open("values.bin", "rb") as f:
        read = struct.unpack("<4f", f.read(16))  # what a score matrix in Python would start from
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_a_tiled_step_that_replays_its_answer_to_the_graders_next_call_breaks_its_rule(grade_source):
    """The twentieth review's k03 and k04: the step's worker lives across its calls, so a file counted them, read
    values on the grader's first call of a layout and replayed that call's torch calls and answer on the next, which
    the grader makes on other values to compare: the same calls, so nothing showed (100 of 100). A call made again on
    other values must answer right where the first did; this one answers the first call's answer."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention
_kept = {}


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    key = (tuple(q.shape), tuple(k.shape), causal, block_q, block_k)
    count, answer = _kept.get(key, (0, None))
    got = _tiled(q, k, v, causal, block_q, block_k)  # the same calls every time
    if count % 2:  # the grader's call on other values: the last answer, replayed
        got = answer
    _kept[key] = (count + 1, got)
    return got
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


# Ways a tiled step copies its inputs into memory Python reads with no torch call (reviews 21 and 22): a storage of
# its own making and a tensor a legacy constructor puts on it (neither a torch call), the storage then made "known" by
# a recorded view of it; a NumPy array's memory under a tensor
STORAGE = """
    raw = torch.UntypedStorage(16)
    buf = torch.FloatTensor(torch.TypedStorage(wrap_storage=raw, dtype=torch.float32, _internal=True))
"""
CHANNELS = {
    "storage": STORAGE + """
    buf.copy_(q[0, 0, 0, :4].float())
    read = bytes(raw.tolist())
""",
    "storage_viewed": STORAGE + """
    buf.view(-1).copy_(q[0, 0, 0, :4].float())
    read = bytes(raw.tolist())
""",
    "numpy_array": """
    import numpy
    kept = numpy.zeros(4, dtype=numpy.float32)
    torch.from_numpy(kept).copy_(q[0, 0, 0, :4].float())
    read = kept.tolist()
""",
    # the twenty-third review's n01, n04, n07 and n08: torch._C's own exporters, which no torch function mode sees
    "zip_writer": STORAGE + """
    import io
    buf.copy_(q[0, 0, 0, :4].float())
    torch._C.PyTorchFileWriter(io.BytesIO()).write_record("x", raw, raw.nbytes())
""",
    "dlpack_capsule": """
    capsule = torch._C._to_dlpack(q[0, 0, 0, :4].float())
""",
    "pickler": """
    data = torch._C._pickle_save(q[0, 0, 0, :4].float())
""",
    "storage_on_an_address": STORAGE + """
    import numpy
    buf.copy_(q[0, 0, 0, :4].float())
    kept = numpy.zeros(4, dtype=numpy.float32)
    lent = torch._C._construct_storage_from_data_pointer(kept.__array_interface__["data"][0], torch.device("cpu"), 16)
    lent.copy_(raw)
""",
}


@pytest.mark.parametrize("channel", sorted(CHANNELS))
def test_a_tiled_step_that_reads_its_inputs_outside_torch_breaks_its_rule(grade_source, channel):
    """The twenty-first review's l01 to l03, the twenty-second's m01 and the twenty-third's n01 to n08: a step copied
    its inputs into memory it reads with no torch call (100 of 100, in flash_attention, its backward and the Triton
    launchers). A storage's or a tensor's bytes read in Python (through any spelling: guard.py replaces
    torch._C.StorageBase's readers, torch._C's exporters and the zip writer's method) and a tensor on memory torch did
    not allocate (the NumPy array's) are each marked, and break the tiled step's rule."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(f"""
_tiled = flash_attention


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
{CHANNELS[channel]}
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


TRITON_CHANNELS = '''
import weakref

_softmax, _flash, _decode = softmax, flash_attention, decode_attention


def _buffer():
    raw = torch.UntypedStorage(16)
    return raw, torch.FloatTensor(torch.TypedStorage(wrap_storage=raw, dtype=torch.float32, _internal=True))


def softmax(x):
    raw, buf = _buffer()
    held = weakref.ref(raw)
    del raw
    buf.copy_(x.reshape(-1)[:4].float())
    read = torch._C.StorageBase.__getitem__(held(), 0)
    return _softmax(x)


def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    raw, buf = _buffer()
    torch._foreach_copy_([buf], [q.reshape(-1)[:4].float()])
    read = list(raw)
    return _flash(q, k, v, causal, block_m, block_n)


def decode_attention(q, k_cache, v_cache, lengths, block_n=16):
    raw, buf = _buffer()
    name = raw._share_filename_cpu_()[1]
    buf.copy_(q.reshape(-1)[:4].float())
    return _decode(q, k_cache, v_cache, lengths, block_n)
'''


def test_triton_launchers_that_read_their_inputs_outside_torch_break_their_rule(grade_source):
    """The twenty-second review's m03 to m05, one in each launcher: a storage read through the C type's own method,
    held by a weak reference only while torch writes it (m04); a write given in a list (`_foreach_copy_`, m05); a
    storage shared through a file that Python reads. Each launcher's answer is its kernel's, so only the read costs
    it."""
    pytest.importorskip("triton")
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(TRITON_CHANNELS, base=base, name="triton_attention.py")
    for launcher in ("softmax", "flash_attention"):
        assert step(result, launcher).score == 0 and step(result, launcher).breach, (launcher, explain(result))
    # sharing a storage through a file starts torch's shared-memory manager, a process: the kernel refuses it first
    said = messages(result, "decode_attention")
    assert step(result, "decode_attention").score == 0, explain(result)
    assert step(result, "decode_attention").breach or all("not permitted" in m for m in said), explain(result)


def test_a_tiled_step_that_raises_on_the_graders_next_call_breaks_its_rule(grade_source):
    """The twenty-first review's l05: a file counted the grader's calls and raised on every call the grader makes on
    other values, so nothing was compared (100 of 100). A call made again that raises where the first answered right
    reads values too."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
_tiled = flash_attention
_count = {}


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    key = (tuple(q.shape), tuple(k.shape), causal, block_q, block_k)
    _count[key] = _count.get(key, 0) + 1
    if _count[key] % 2 == 0:  # the grader's call on other values
        raise RuntimeError("not now")
    return _tiled(q, k, v, causal, block_q, block_k)
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0 and step(result, "flash_attention").breach, explain(result)


def test_flash_attention_function_is_held_to_its_calls_too(grade_source):
    """The twenty-first review's l04: FlashAttentionFunction's calls (through the given runner) were never called
    again on other values, so its forward read values through `hann_window`'s length, which no list named (100 of
    100). Its calls are compared as the tiled steps' are, and every one keeps the rules."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source("""
_forward = FlashAttentionFunction.forward


def _reading_forward(ctx, q, k, v, causal=False, block_q=32, block_k=32):
    word = (q[0, 0, 0, 0] > 0).long() + 2  # what a value's bits would be
    read = torch.hann_window(word).shape[0]
    return _forward(ctx, q, k, v, causal, block_q, block_k)


FlashAttentionFunction.forward = staticmethod(_reading_forward)
""", base=base, name="attention_backward.py")
    assert step(result, "FlashAttentionFunction").score == 0, explain(result)


def test_autograds_engine_run_by_hand_on_a_graph_built_at_import_breaks_the_rule(grade_source):
    """The forty-fifth review's f2: a graph built at import, where no record runs, refilled through `.data` in the
    call and run by the engine reached by a name built at run time: the engine's own backward formulas answered
    (softmax_backward 20 of 20). The engine's runs are told to the record, which expects only its own."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source("""
_leaf = torch.zeros(2, 3, requires_grad=True)
_out = torch.softmax(_leaf, -1)
_RUN = getattr(getattr(torch.autograd.Variable, "_exec" + "ution_engine"), "run_" + "back" + "ward")
_by_hand = softmax_backward


def softmax_backward(probs, grad_probs, dim=-1):
    _RUN((_out,), (torch.ones(2, 3),), True, False, (_leaf,), True, False)  # its answer would be the engine's
    return _by_hand(probs, grad_probs, dim)
""", base=base, name="attention_backward.py")
    assert step(result, "softmax_backward").score == 0 and step(result, "softmax_backward").breach, explain(result)
    assert set(lost(result)) <= {"softmax_backward", "attention_backward"}, explain(result)


def test_a_function_whose_apply_builds_a_graph_of_its_own_breaks_the_rule(grade_source):
    """The forty-fifth review's f1: FlashAttentionFunction's own `apply` built attention from mul and sum (the names
    the given runner's Σ out ∘ grad_out makes) between helper Functions, so torch's autograd gave dq, dk and dv (13 of
    15). The runner's backward may differentiate the sum, the product and one Function's node, no more."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source("""
class _Unsqueeze(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return x.unsqueeze(dim)

    @staticmethod
    def backward(ctx, g):
        return g.squeeze(ctx.dim), None


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s, causal):
        if causal:
            keep = torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(s.shape[-1] - s.shape[-2])
            s = s.masked_fill(~keep, -math.inf)
        e = torch.exp(s - s.amax(-1, keepdim=True).clamp(min=-1e30))  # softmax by hand: the name is forbidden
        p = e / e.sum(-1, keepdim=True).clamp(min=1e-30)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return softmax_backward(p, g), None


def _apply(cls, q, k, v, causal=False, block_q=32, block_k=32):
    s = (_Unsqueeze.apply(q, -2) * _Unsqueeze.apply(k, -3)).sum(-1) * q.shape[-1] ** -0.5
    return (_Unsqueeze.apply(_Softmax.apply(s, causal), -1) * _Unsqueeze.apply(v, -3)).sum(-2)


FlashAttentionFunction.apply = classmethod(_apply)
""", base=base, name="attention_backward.py")
    function = step(result, "FlashAttentionFunction")
    assert function.score == 0 and function.breach, explain(result)
    assert set(lost(result)) == {"FlashAttentionFunction"}, explain(result)


def test_gradients_differentiated_numerically_break_the_rules(grade_source):
    """The forty-sixth review's f1: gradients by the complex step (the forward on x + ih·e_j, its imaginary part over
    h) or by central differences, every direction at once, with no autograd at all (attention_backward 30 of 30,
    softmax_backward 20 of 20 along grad_probs). A complex tensor is forbidden in the gradient steps, softmax_backward
    may not recompute the softmax, and no gradient step may make a tensor past a score matrix as wide as a head."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source("""
def _attend(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v


def softmax_backward(probs, grad_probs, dim=-1):
    scores, h = probs.log(), 1e-6  # the softmax's Jacobian is symmetric: one derivative along grad_probs
    ahead, behind = (torch.softmax(scores + sign * h * grad_probs, dim) for sign in (1, -1))
    return ((ahead - behind) / (2 * h)).nan_to_num(0.0)


def attention_backward(q, k, v, grad_out, mask=None):
    found, inputs = [], [x.double() for x in (q, k, v)]
    for which, x in enumerate(inputs):
        n = x.numel()
        basis = torch.eye(n, dtype=torch.float64).reshape(n, *x.shape)  # every direction at once
        sides = []
        for sign in (1.0, -1.0):
            args = list(inputs)
            args[which] = x + sign * 1e-6 * basis
            sides.append(_attend(*args, mask))
        slope = (sides[0] - sides[1]) / 2e-6
        found.append((slope * grad_out.double()).flatten(1).sum(-1).reshape(x.shape).to(q.dtype))
    return tuple(found)
""", base=base, name="attention_backward.py")
    for name in ("softmax_backward", "attention_backward"):
        assert step(result, name).score == 0 and step(result, name).breach, explain(result)
    complex_step = grade_source("""
def attention_backward(q, k, v, grad_out, mask=None):
    h, found = 1e-30, []
    for which, x in enumerate((q, k, v)):
        grad = torch.zeros_like(x)
        for j in range(min(x.numel(), 2)):  # one direction at a time (two, to keep the test short)
            args = [a.to(torch.complex128) for a in (q, k, v)]
            args[which] = args[which] + 1j * h * torch.nn.functional.one_hot(torch.tensor(j), x.numel()).reshape(
                x.shape)
            s = args[0] @ args[1].transpose(-2, -1) / math.sqrt(q.shape[-1])
            if mask is not None:
                s = s.masked_fill(~mask, -1e300)
            e = torch.exp(s - s.real.amax(-1, keepdim=True))
            out = (e / e.sum(-1, keepdim=True)) @ args[2]
            grad.view(-1)[j] = (out.imag / h * grad_out).sum()
        found.append(grad)
    return tuple(found)
""", base=base, name="attention_backward.py")
    assert step(complex_step, "attention_backward").breach, explain(complex_step)
    # the forty-seventh review: the exponential by another name (cosh + sinh), and the complex step in NumPy
    renamed = grade_source("""
def softmax_backward(probs, grad_probs, dim=-1):
    h = 1e-4
    e = [torch.cosh(sign * h * grad_probs) + torch.sinh(sign * h * grad_probs) for sign in (1, -1)]
    ahead, behind = (p / p.sum(dim, keepdim=True) for p in (probs * e[0], probs * e[1]))
    return ((ahead - behind) / (2 * h)).nan_to_num(0.0)


_by_hand = attention_backward


def attention_backward(q, k, v, grad_out, mask=None):
    q.detach().numpy()  # where no record sees what it computes
    return _by_hand(q, k, v, grad_out, mask)
""", base=base, name="attention_backward.py")
    for name in ("softmax_backward", "attention_backward"):
        assert step(renamed, name).score == 0 and step(renamed, name).breach, explain(renamed)


def test_a_tiled_step_under_vmap_by_its_c_entry_points_breaks_its_rule(grade_source):
    """The twenty-fifth review's q01: whole rows of scores, one query at a time under functorch's vmap reached by its
    C entry points (torch.vmap itself asks for a frame): the record saw one slice's (Tk,) shapes (100 of 100). Those
    entry points are refused to a caller outside torch, as the mode stack's are."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
from torch._C._functorch import _add_batch_dim, _remove_batch_dim, _vmap_decrement_nesting, _vmap_increment_nesting


def batched(f, args, dims, n):
    level = _vmap_increment_nesting(n, "error")
    try:
        given = [a if d is None else _add_batch_dim(a, d, level) for a, d in zip(args, dims)]
        return tuple(_remove_batch_dim(o, level, n, 0) for o in f(*given))
    finally:
        _vmap_decrement_nesting()


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf = (x.reshape(-1, x.shape[-2], x.shape[-1]).to(work) for x in (q, k, v))
    pos_q, pos_k = torch.arange(t_q) + (t_k - t_q), torch.arange(t_k)

    def one(qi, i, kb, vb):  # one query's whole row of scores: (Tk,)
        s = (kb @ qi) / math.sqrt(d)
        if causal:
            s = torch.where(pos_k <= i, s, -math.inf)
        m = s.amax()
        m_safe = torch.where(m == -math.inf, 0.0, m)
        p = torch.exp(s - m_safe)
        l = p.sum()
        return (p @ vb) / torch.where(l > 0, l, 1.0), m + torch.log(l)

    def heads(qb, kb, vb):
        return batched(one, (qb, pos_q, kb, vb), (0, 0, None, None), t_q)

    out, lse = batched(heads, (qf, kf, vf), (0, 0, 0), qf.shape[0])
    return out.reshape(*q.shape[:-1], v.shape[-1]).to(q.dtype), lse.reshape(q.shape[:-1])
""", base=base, name="flash_attention.py")
    assert step(result, "flash_attention").score == 0, explain(result)


def test_a_tensor_method_replaced_for_the_workers_code_after_the_call_changes_nothing_graded(grade_source):
    """The twenty-fifth review's q03 to q05: a step answered placeholders, and as its last act replaced
    torch.Tensor.detach, which the worker's own code called once the record had closed (to see what the call changed,
    to encode the answer): the replacement computed the real answer there, with softmax over the whole matrix (100 of
    100). The worker's codec now calls only what it bound before the file ran (wire.Bound): the answer graded is
    the placeholders."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source('''
_PENDING = {}


def _detach(self):
    entry = _PENDING.pop(id(self), None)
    if entry is None or entry[0] is not self:
        return torch._C.TensorBase.detach(self)
    if not _PENDING:
        del torch.Tensor.detach
    return entry[1]()


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    lse = torch.empty(q.shape[:-1], dtype=torch.promote_types(q.dtype, torch.float32))

    def scores():
        s = q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            s = s.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q).logical_not(), -math.inf)
        return s

    _PENDING[id(out)] = (out, lambda: (torch.softmax(scores(), -1).nan_to_num(0.0) @ v.float()).to(q.dtype))
    _PENDING[id(lse)] = (lse, lambda: torch.logsumexp(scores(), -1).to(lse.dtype))
    torch.Tensor.detach = _detach  # the last thing: no torch call follows it
    return out, lse
''', base=base, name="flash_attention.py")
    # the answer is what the call returned, the placeholders: it keeps its shape checks and no more
    flash = step(result, "flash_attention")
    assert all(c.points == 0 for c in flash.checks if "values" in c.name or "tiles" in c.name), explain(result)
    assert flash.score <= 4, explain(result)


def test_a_strip_of_scores_in_complex_memory_counts_at_its_real_size(grade_source):
    """The twenty-seventh review's f01: whole rows of scores written into a float view of a complex buffer
    (torch.view_as_real(base).flatten(-2), twice the base's elements): the record counted the view as its base, at
    half its size, and tiles_only passed (100 of 100). A view is its base only where the base holds fewer bytes, and
    a complex tensor's shape counts its two parts."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    rows = max(1, 2 * max(t_q, t_k) * max(q.shape[-1], v.shape[-1]) // t_k)  # a strip twice what an input holds
    outs, lses = [], []
    for i in range(0, t_q, rows):
        qb = q[..., i:i + rows, :].to(work) / math.sqrt(q.shape[-1])
        n = qb.shape[-2]
        memory = torch.empty(*q.shape[:-2], (n * t_k + 1) // 2, device=q.device,
                             dtype=torch.complex128 if work == torch.float64 else torch.complex64)
        s = torch.view_as_real(memory).flatten(-2)[..., :n * t_k].unflatten(-1, (n, t_k))  # n whole rows of scores
        torch.matmul(qb, k.to(work).transpose(-2, -1), out=s)
        if causal:  # row by row, in place: no mask of these rows either
            for r in range(n):
                s[..., r, max(0, i + r + t_k - t_q + 1):] = -math.inf
        m = s.amax(-1, keepdim=True)
        m = torch.where(m == -math.inf, 0.0, m)
        s.sub_(m).exp_()  # in place: no new tensor of these scores
        l = s.sum(-1)
        outs.append((s @ v.to(work)) / torch.where(l > 0, l, 1.0)[..., None])
        lses.append(m[..., 0] + torch.log(l))
    return torch.cat(outs, -2).to(q.dtype), torch.cat(lses, -1)
""", base=base, name="flash_attention.py")
    tiles = next(c for c in step(result, "flash_attention").checks if c.name.endswith("tiles_only"))
    assert tiles.points == 0, explain(result)


def test_a_score_matrix_on_a_small_tensors_storage_counts_at_the_storages_size(grade_source):
    """The twenty-eighth review's f01 to f04: the whole score matrix written into an as_strided view of a (2,) tensor
    made by empty_strided with a stride of n − 1 (its storage holds n elements): the record counted the view as that
    (2,) tensor, and tiles_only, latent_only and no_score_matrix passed (100 each). A tensor whose storage holds more
    than it has elements is counted at its storage's size too."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source("""
def _hidden(shape, dtype):
    n = math.prod(shape)
    handle = torch.empty_strided((2,), (n - 1,), dtype=dtype)  # two elements, a storage of n
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    return handle.as_strided(tuple(shape), tuple(strides), 0)


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    s = _hidden((*q.shape[:-2], t_q, t_k), work)  # the whole score matrix
    torch.matmul(q.to(work) / math.sqrt(q.shape[-1]), k.to(work).transpose(-2, -1), out=s)
    if causal:
        for r in range(t_q):  # in place, row by row
            s[..., r, max(0, r + t_k - t_q + 1):] = -math.inf
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    s.sub_(m).exp_()
    l = s.sum(-1)
    out = (s @ v.to(work)) / torch.where(l > 0, l, 1.0)[..., None]
    return out.to(q.dtype), m[..., 0] + torch.log(l)
""", base=base, name="flash_attention.py")
    tiles = next(c for c in step(result, "flash_attention").checks if c.name.endswith("tiles_only"))
    assert tiles.points == 0, explain(result)


def test_a_question_to_the_grader_runs_nothing_of_the_files_where_nothing_records(grade_source):
    """The twenty-ninth review's f01 to f03: a composite asked its answered step a question holding an object whose
    `__class__` property, or whose metaclass's `__module__` property, ran F.scaled_dot_product_attention. The worker
    read them (isinstance, the type's name) while it encoded the question with the record paused, so the module's
    rules saw nothing (96, fair 78). A question is made plain data by exact types first, while the record runs."""
    result = grade_source("""
def softmax(scores, dim=-1):  # no guard for rows with nothing to attend to (NaN there): softmax is answered
    e = torch.exp(scores - scores.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def _attention(module, query, key, value, mask):
    q, k, v = (split_heads(w(x), module.num_heads) for w, x in ((module.w_q, query), (module.w_k, key),
                                                                 (module.w_v, value)))
    return module.w_o(merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)))


def _forward(self, query, key=None, value=None, mask=None):
    key = query if key is None else key
    value = key if value is None else value
    box = []

    def smuggle():
        if not box:
            box.append(_attention(self, query, key, value, mask))

    class Smuggler:
        @property
        def __class__(self):
            smuggle()
            return Smuggler

    class Meta(type):
        @property
        def __module__(cls):
            smuggle()
            return "x"

    class Named(metaclass=Meta):
        pass

    for question in ([Smuggler()], Named()):
        try:
            softmax(question)
        except Exception:
            pass
    smuggle()  # in the open, where the questions ran nothing
    return box[0]


MultiHeadAttention.forward = _forward
""")
    module = step(result, "MultiHeadAttention")
    rules = next(c for c in module.checks if c.name.endswith("rules"))
    assert rules.points == 0 and "scaled_dot_product_attention" in rules.message, explain(result)


def _smuggling_cache_module(smuggle: str) -> str:
    """kv_cache's reference, its KVCache losing points (so a module gets the grader's stand-in) and its module's
    cached path running `smuggle`, which may put F.scaled_dot_product_attention's answer in `box` out of the record's
    sight; where it does not, the module calls it in the open."""
    return """
_append = KVCache.append


def _append_refusing_late(self, k_new, v_new):  # a refused append changes length: KVCache loses points
    if self.length + k_new.shape[2] > self.max_len:
        self.length = self.max_len
    return _append(self, k_new, v_new)


KVCache.append = _append_refusing_late
_forward = CachedSelfAttention.forward


def _smuggling_forward(self, x, cache=None):
    if cache is None:
        return _forward(self, x)
    B, T, D = x.shape
    q, k, v = (w(x).view(B, T, self.num_heads, -1).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
    mask = decode_mask(T, cache.length, device=x.device)
    k, v = cache.append(k, v)
""" + smuggle + """
    if not box:
        box.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    return self.w_o(box[0].transpose(1, 2).reshape(B, T, D))


CachedSelfAttention.forward = _smuggling_forward
"""


def test_the_graders_stand_in_cache_runs_nothing_of_the_files(grade_source):
    """The twenty-ninth review's f04: a module handed the grader's stand-in KVCache (its own had lost points) passed
    append an object whose `shape` property ran F.scaled_dot_product_attention; the stand-in's methods run with the
    record paused, so the module's rules saw nothing (94, fair 52). A stand-in takes tensors and numbers only, checked
    by exact type before the pause."""
    base = (ROOT / "solutions" / "kv_cache.py").read_text()
    result = grade_source(_smuggling_cache_module("""
    box = []

    class Smuggler:
        @property
        def shape(self_):
            box.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
            return (0, 0, 1 << 40, 0)

    try:
        cache.append(Smuggler(), Smuggler())
    except Exception:
        pass
"""), base=base, name="kv_cache.py")
    module = step(result, "CachedSelfAttention")
    rules = next(c for c in module.checks if c.name.endswith("rules"))
    assert rules.points == 0 and "scaled_dot_product_attention" in rules.message, explain(result)


def test_a_torch_function_mode_of_the_files_below_the_record_hides_nothing(grade_source):
    """The thirtieth review's f02 and f03: a TorchFunctionMode entered at import sits below every record, which
    passes each call on to it with itself stashed: F.scaled_dot_product_attention run there was recorded nowhere
    (100, fair 80). A record entered above a mode of the file's marks itself hidden."""
    result = grade_source("""
from torch.overrides import TorchFunctionMode

_JOBS = []


class _Below(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _JOBS:
            job, box = _JOBS.pop()
            box.append(job())
        return func(*args, **(kwargs or {}))


_Below().__enter__()


def _forward(self, query, key=None, value=None, mask=None):
    key = query if key is None else key
    value = key if value is None else value
    q, k, v = (split_heads(w(x), self.num_heads) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
    box = []
    _JOBS.append((lambda: self.w_o(merge_heads(torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask))), box))
    torch.neg(query[..., :1])  # the mode below runs the job
    return box[0]


MultiHeadAttention.forward = _forward
""")
    module = step(result, "MultiHeadAttention")
    assert module.score == 0 and any("mode under the record" in c.message for c in module.checks), \
        explain(result)


def test_a_torch_function_mode_of_the_files_gets_no_grader_call_unrecorded(grade_source):
    """The thirtieth review's f01: a mode of the file's, entered above the record, got the grader's own torch calls
    while the record was paused (encoding a question to an answered step) and ran F.scaled_dot_product_attention
    there (97, fair 91). A pause with a mode of the file's above the record marks the record hidden."""
    result = grade_source("""
from torch.overrides import TorchFunctionMode


def softmax(scores, dim=-1):  # no guard for rows with nothing to attend to (NaN there): softmax is answered
    e = torch.exp(scores - scores.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


class _Spy(TorchFunctionMode):
    def __init__(self, job):
        super().__init__()
        self.job, self.box = job, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # the first detach is the worker's, encoding the question with the record paused
        if not self.box and getattr(func, "__name__", "") == "detach" and self.job is not None:
            job, self.job = self.job, None
            self.box.append(job())
        return func(*args, **(kwargs or {}))


def _forward(self, query, key=None, value=None, mask=None):
    key = query if key is None else key
    value = key if value is None else value
    q, k, v = (split_heads(w(x), self.num_heads) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
    spy = _Spy(lambda: self.w_o(merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                               attn_mask=mask))))
    small = query[..., :1, :1]
    with spy:
        try:
            softmax(small)  # answered: the grader's encoding of the question reaches the spy
        except Exception:
            pass
    if not spy.box:  # not answered (softmax's own checks): in the open
        spy.box.append(spy.job())
    return spy.box[0]


MultiHeadAttention.forward = _forward
""")
    module = step(result, "MultiHeadAttention")
    assert module.score == 0, explain(result)


def test_the_graders_stand_in_class_changed_by_the_file_runs_recorded(grade_source):
    """The thirtieth review's f05: a module set a property on the grader's stand-in KVCache class (reached by
    type(cache)), which the stand-in's append read with the record paused: F.scaled_dot_product_attention ran there
    (97, fair 52). A stand-in whose class is not as the grader made it runs recorded, the file's code with it."""
    base = (ROOT / "solutions" / "kv_cache.py").read_text()
    result = grade_source(_smuggling_cache_module("""
    box, kind = [], type(cache)
    kept = vars(cache)["max_len"]

    def smuggled(obj):
        if not box:
            box.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return kept

    kind.max_len = property(smuggled)
    try:
        cache.append(k[:, :, :0], v[:, :, :0])  # nothing to write: the stand-in only reads max_len
    finally:
        del kind.max_len
"""), base=base, name="kv_cache.py")
    module = step(result, "CachedSelfAttention")
    rules = next(c for c in module.checks if c.name.endswith("rules"))
    assert rules.points == 0 and "scaled_dot_product_attention" in rules.message, explain(result)


def test_a_mode_of_torchs_own_class_carrying_the_files_handler_hides_nothing(grade_source):
    """The thirty-first review's f01 and f02: a BaseTorchFunctionMode (torch's own class, which the record trusted
    below it by type) entered at import, given the file's handler on the instance inside the call, ran
    F.scaled_dot_product_attention unrecorded (100, fair 80). Any mode under the record marks it hidden."""
    result = grade_source("""
from types import MethodType

from torch.overrides import BaseTorchFunctionMode

_MODE = BaseTorchFunctionMode()  # torch's own pass-through mode
_MODE.__enter__()


def _forward(self, query, key=None, value=None, mask=None):
    key = query if key is None else key
    value = key if value is None else value
    q, k, v = (split_heads(w(x), self.num_heads) for w, x in ((self.w_q, query), (self.w_k, key), (self.w_v, value)))
    box = []

    def handler(mode, func, types, args=(), kwargs=None):
        if not box:
            box.append(self.w_o(merge_heads(torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                               attn_mask=mask))))
        return func(*args, **(kwargs or {}))

    _MODE.__torch_function__ = MethodType(handler, _MODE)  # armed inside the call, gone before it returns
    try:
        torch.neg(query[..., :1])
    finally:
        del _MODE.__torch_function__
    return box[0]


MultiHeadAttention.forward = _forward
""")
    module = step(result, "MultiHeadAttention")
    assert module.score == 0 and any("mode under the record" in c.message for c in module.checks), explain(result)


def test_a_triton_kernel_that_makes_an_integer_a_pointer_keeps_no_rule():
    """The thirty-second review's f01: a score matrix made at import, reached by a kernel that made its integer address
    a pointer (tl.pointer_type), was in no launch's arguments and no torch call's record: no_score_matrix passed (100,
    fair 84). A file that makes a pointer of an integer keeps no rule, as one that names a way to blind the record."""
    from grader.engine import CheckFailed
    from grader.engine.rules import check_rules

    kernel = ("@triton.jit\ndef scores_kernel(s_addr, n):\n"
              "    s_ptr = s_addr.to(tl.pointer_type(tl.float32), bitcast=True)\n"
              "    tl.store(s_ptr + tl.arange(0, 16), 0.0)\n\n\n"
              "def flash_attention(q, k, v):\n    scores_kernel[(1,)](ADDRESS, 16)\n")
    with pytest.raises(CheckFailed, match="pointer_type") as failed:
        check_rules(set(), (), kernel, kernel[kernel.index("def flash_attention"):], allowed=("empty",))
    assert failed.value.breach  # in the launcher's kernel: the whole step
    check_rules(set(), (), kernel.replace("pointer_type", "float32"), allowed=("empty",))  # the scan is the name's


def test_scores_folded_so_their_leading_axis_is_a_multiple_of_batch_and_heads_are_judged_by_their_total():
    """The thirty-third review's f03: one head's S, P, dP and dS held as (18, 45, 6), 18 key groups of B·H = 6
    columns each: divided by B·H as though it held every head, it passed (100, fair 94). What a product or an
    exponential returns holds at most a tile's worth of every batch and head together, whatever its layout."""
    from grader.course.attention_backward.memory import MEM

    assert MEM.violation({"created": [[18, 45, 6]], "more": 0, "scores": [[18, 45, 6]]}) is not None
    assert MEM.crowded((18, 45, 6)) and not MEM.too_large((18, 45, 6))  # the old rules passed it
    tile, values_tile, statistics = (MEM.b, MEM.h, MEM.block_q, MEM.block_k), (MEM.b, MEM.h, MEM.block_k, MEM.dv), \
        (MEM.b, MEM.h, MEM.t_q)
    blocks = (3 * MEM.b * MEM.h, MEM.block_q, MEM.d)  # the queries cut into blocks, stacked: not scores
    record = {"created": [list(blocks), list(tile)], "more": 0, "scores": [list(s) for s in (tile, values_tile, statistics)]}
    assert MEM.violation(record) is None


ABSORBED_IN_PIECES = """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    # every head's keys and values, made from the latents PIECES at a time (or padded by one token): no absorbing
    H = q_nope.shape[1]
    if PIECES == 0:
        c_kv = torch.cat([c_kv, c_kv.new_zeros(c_kv.shape[0], 1, c_kv.shape[-1])], dim=1)
        k_rope = torch.cat([k_rope, k_rope.new_zeros(k_rope.shape[0], 1, k_rope.shape[-1])], dim=1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_zeros(*mask.shape[:-1], 1)], dim=-1)
        else:
            mask = torch.ones(q_nope.shape[2], c_kv.shape[1], dtype=torch.bool)
            mask[:, -1] = False
    pieces = max(PIECES, 1)
    scores, values = [], []
    for c, kr in zip(c_kv.tensor_split(pieces, dim=1), k_rope.tensor_split(pieces, dim=1)):
        k_nope, v = expand_kv(c, w_uk, w_uv, H)
        values.append(v)
        scores.append(mla_scores(q_nope, q_rope, k_nope, kr))
    s = torch.cat(scores, dim=-1)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    y = sum(pp @ v for pp, v in zip(p.split([v.shape[2] for v in values], dim=-1), values))
    B, _, Tq, _ = y.shape
    return y.transpose(1, 2).reshape(B, Tq, -1) @ w_o.T
"""


ABSORBED_THROUGH_PADDED_WEIGHTS = """
def absorbed_attention(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    # every head's keys and values, through weights padded by a zero row: widths Dn + 1 and Dv + 1
    H, Dn, Dr, R = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1], c_kv.shape[-1]
    Dv = w_uv.shape[0] // H
    uk = torch.cat([w_uk.view(H, Dn, R), w_uk.new_zeros(H, 1, R)], dim=1)
    uv = torch.cat([w_uv.view(H, Dv, R), w_uv.new_zeros(H, 1, R)], dim=1)
    k = torch.einsum("btr,hnr->bhtn", c_kv, uk)
    v = torch.einsum("btr,hnr->bhtn", c_kv, uv)[..., :Dv]
    q = torch.cat([q_nope, q_nope.new_zeros(*q_nope.shape[:-1], 1)], dim=-1)
    s = (q @ k.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)) / math.sqrt(Dn + Dr)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    y = torch.softmax(s, dim=-1) @ v
    return y.transpose(1, 2).flatten(2) @ w_o.T
"""


@pytest.mark.parametrize("code", [ABSORBED_IN_PIECES.replace("PIECES", "0"), ABSORBED_IN_PIECES.replace("PIECES", "2"),
                                  ABSORBED_THROUGH_PADDED_WEIGHTS], ids=["padded", "halves", "padded_weights"])
def test_latents_expanded_padded_or_in_a_fixed_number_of_pieces_lose_latent_only(grade_source, code):
    """The thirty-third review's f02 (every head's keys over Tk + 1 tokens), the thirty-fourth's F2 (in two halves, as
    many calls at any Tk) and the thirty-fifth's f04 (through weights padded to widths 12 and 18): no tensor had the
    factors latent_only looked for (100, fair 97). With one query, no tensor that grows with the cache may hold more
    than 60 numbers per cached token, where an expansion holds B·H·Dn = 366."""
    base = (ROOT / "solutions" / "mla.py").read_text()
    result = grade_source(code, base=base, name="mla.py")
    absorbed = step(result, "absorbed_attention")
    failed = [c for c in absorbed.checks if c.points < c.max_points]
    assert [c.name for c in failed] == ["absorbed_attention_latent_only"], explain(result)
    assert any(said in failed[0].message for said in ("keys or values expanded", "per-head key or value")), \
        explain(result)


OUT_OF_BOUNDS_KERNEL = '''
_SCRATCH = torch.zeros(64)  # made at import: no launch names it, no record of a call sees it
_flash = flash_attention


@triton.jit
def _scratch_kernel(out_ptr, address):
    pointer = address.to(out_ptr.dtype)  # an integer made a pointer by another argument's type
    tl.store(pointer + tl.arange(0, 16), tl.full((16,), 1.0, tl.float32))


def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    out = _flash(q, k, v, causal, block_m, block_n)
    _scratch_kernel[(1,)](out[0], _SCRATCH.data_ptr())
    return out
'''


def test_a_triton_kernel_that_touches_memory_outside_its_launch_keeps_no_rule(grade_source):
    """The thirty-third review's f01: an integer address cast to another argument's pointer type (`x.to(p.dtype)`),
    named nowhere in the file, reached a buffer made at import (100, fair 84). Each store of an interpreted kernel
    must fall in its launch's tensors (sandbox/kernels.py): the call hid what it wrote."""
    pytest.importorskip("triton")
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(OUT_OF_BOUNDS_KERNEL, base=base, name="triton_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score == 0 and flash.breach, explain(result)
    assert any("outside its launch's tensors" in m for m in messages(result, "flash_attention")), explain(result)
    assert {"softmax", "decode_attention"}.isdisjoint(lost(result)), explain(result)


def test_a_triton_kernel_that_calls_python_of_the_files_own_keeps_no_rule():
    """The thirty-fifth review's f01 and f02: an interpreted kernel's body is Python, so a kernel that called a plain
    function of the file's kept its score tiles in a dict, or wrote them with the interpreter's own stores to a buffer
    made at import (100 each, fair 84). A kernel may call Triton's language, other kernels and a few builtins only,
    as the compiler takes; what else it calls breaks the launcher's rule."""
    from grader.engine import CheckFailed
    from grader.engine.rules import check_rules, foreign_kernel_calls

    kernel = ("import triton\nimport triton.language as tl\n_TILES = {}\n\n\ndef keep(s, i):\n    _TILES[i] = s\n\n\n"
              "@triton.jit\ndef tile(x_ptr, BLOCK: tl.constexpr):\n    i = tl.program_id(0)\n"
              "    s = tl.load(x_ptr + i * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)\n    keep(s, i)\n"
              "    tl.store(x_ptr + tl.arange(0, BLOCK), tl.exp(s) * min(BLOCK, 4))\n\n\n"
              "def flash_attention(q, k, v):\n    tile[(1,)](q, BLOCK=16)\n")
    assert foreign_kernel_calls(kernel) == ["keep"]
    with pytest.raises(CheckFailed, match="reaches keep") as failed:
        check_rules(set(), (), kernel, kernel[kernel.index("def flash_attention"):], allowed=("empty",))
    assert failed.value.breach
    assert foreign_kernel_calls(kernel.replace("    keep(s, i)\n", "")) == []  # Triton's own, a builtin, a method


def test_a_file_that_defines_a_finaliser_keeps_no_rule():
    """The thirty-fifth review's f05 and f06: untiled attention in a `__del__`, run when torch freed an old .grad
    inside a recorded call (`Tensor.grad.__set__`), where the record is stashed (100 each, fair 50 and 63). Garbage
    collection is off in a worker, but freeing by reference count is not: a file that names `__del__` or `weakref`
    keeps no rule."""
    from grader.engine import CheckFailed
    from grader.engine.rules import check_rules

    for hook in ("class Job:\n    def __del__(self):\n        pass\n", "import weakref\n"):
        code = hook + "\ndef flash_attention(q, k, v):\n    return q\n"
        with pytest.raises(CheckFailed, match="hides torch calls"):
            check_rules(set(), ("softmax",), code, "def flash_attention(q, k, v):\n    return q\n")


FLASH_TILES_KEPT = """
def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    # a two-pass softmax: every tile of a query block's scores kept in a list (each one a tile), then weighed
    t_q, t_k = q.shape[-2], k.shape[-2]
    scale, offset = 1.0 / math.sqrt(q.shape[-1]), t_k - t_q
    outs, lses = [], []
    for i in range(0, t_q, block_q):
        qb = q[..., i:i + block_q, :] * scale
        tiles, m = [], torch.full(qb.shape[:-1], -math.inf, dtype=q.dtype)
        for j in range(0, t_k, block_k):
            s = qb @ k[..., j:j + block_k, :].transpose(-2, -1)
            if causal:
                rows = torch.arange(offset + i, offset + i + qb.shape[-2])[:, None]
                s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, -math.inf)
            tiles.append(s)
            m = torch.maximum(m, s.amax(dim=-1))
        safe = torch.where(m == -math.inf, 0.0, m)
        l = torch.zeros_like(safe)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=q.dtype)
        for n, j in enumerate(range(0, t_k, block_k)):
            p = torch.exp(tiles[n] - safe[..., None])
            l, acc = l + p.sum(dim=-1), acc + p @ v[..., j:j + block_k, :]
        outs.append(torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1.0)[..., None], 0.0))
        lses.append(m + torch.log(l))
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)
"""


BACKWARD_TILES_KEPT = """
_tiled_backward = flash_attention_backward


def flash_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_q=32, block_k=32):
    # the reference's tiles, with the first key block's tiles against every query kept alive all along (a column of
    # tiles, each one a tile)
    kept = [torch.exp(q[..., i:i + block_q, :] @ k[..., :block_k, :].transpose(-2, -1))
            for i in range(0, q.shape[-2], block_q)]
    grads = _tiled_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k)
    return grads if kept else None
"""


def test_a_tiled_step_that_keeps_a_blocks_tiles_alive_together_loses_tiles_only(grade_source):
    """The thirty-fifth review's f03: a two-pass softmax kept each query block's score tiles in a list, a whole
    block_q × Tk strip alive at once in pieces, every one a tile (100, fair 94). The record watches each storage a
    call made through a weak reference, so it knows the most bytes alive at once; with 128 more keys (or queries),
    that grows by block_q rows (block_k columns) of scores, where an online softmax's stays the same."""
    result = grade_source(FLASH_TILES_KEPT, base=(ROOT / "solutions" / "flash_attention.py").read_text(),
                          name="flash_attention.py")
    assert _tiles_only(result, "flash_attention") == ("flash_attention.full_score_matrix", "rows"), explain(result)
    result = grade_source(BACKWARD_TILES_KEPT, base=(ROOT / "solutions" / "attention_backward.py").read_text(),
                          name="attention_backward.py")
    assert _tiles_only(result, "flash_attention_backward") == ("flash_attention_backward.full_score_matrix",
                                                               "columns"), explain(result)
    assert set(lost(result)) == {"flash_attention_backward"}, explain(result)


def _tiles_only(result, step_id):
    """The mistake tiles_only named, and what the call kept alive: rows against every key, or columns."""
    check = next(c for c in step(result, step_id).checks if c.name == f"{step_id}_tiles_only")
    kept = next((w for w in ("rows", "columns") if f"{w} of scores against every" in check.message), None)
    return check.mistake_id, kept


def test_the_record_counts_what_is_alive_at_once_not_what_was_ever_made():
    """`alive` is the peak of the bytes a call's storages hold together: tiles made and freed one after another
    count once, tiles kept together count each; the call's own arguments count not at all."""
    from grader.sandbox.recorder import Shapes

    def peak(keep: bool) -> int:
        shapes, kept = Shapes(), []
        x = torch.zeros(64)
        shapes.given(torch, [x])
        for _ in range(4):
            tile = torch.ones(16, 16)
            shapes.add(torch, tile, "ones")
            shapes.add(torch, x[:8], "__getitem__")
            if keep:
                kept.append(tile)
        data = shapes.data()
        shapes.release(torch)
        return data["alive"], data["largest"]

    assert peak(False) == (16 * 16 * 4, [[1024, 1]])
    assert peak(True) == (4 * 16 * 16 * 4, [[1024, 4]])


GROUPED_BY_THE_LIBRARY = """
def grouped_attention(q, k, v, mask=None):
    # the whole of attention handed to torch's own multi-head attention, with identity projections
    import torch.nn.functional as F
    B, Hq, Tq, Dh = q.shape
    G = Hq // k.shape[1]
    k, v = repeat_kv(k, G), repeat_kv(v, G)
    Tk = k.shape[2]
    eye = torch.eye(Dh, dtype=q.dtype, device=q.device)
    flat = lambda t, T: t.reshape(B * Hq, T, Dh).transpose(0, 1)
    blocked = None if mask is None else ~mask.expand(B, Hq, Tq, Tk).reshape(B * Hq, Tq, Tk)
    out, _ = F.multi_head_attention_forward(flat(q, Tq), flat(k, Tk), flat(v, Tk), Dh, 1, torch.cat([eye, eye, eye]),
                                            None, None, None, False, 0.0, eye, None, training=False,
                                            attn_mask=blocked, need_weights=True)
    return out.transpose(0, 1).reshape(B, Hq, Tq, Dh)
"""


def test_every_attention_step_forbids_every_fused_attention_torch_has(grade_source):
    """The thirty-sixth review's f01 and f06: gqa and local_attention forbade only `scaled_dot_product`, so
    `F.multi_head_attention_forward` did the whole of attention (100 each, fair 57 and 65). Every step that forbids
    library attention now names one list, and every name torch has for attention is on it or known harmless."""
    import torch.nn.functional as F

    from grader.exercise import LIBRARY_ATTENTION

    harmless = re.compile(r"^_?(can_use_|get_|set_|is_|fused_sdp_choice|mha_shape_check|SDPAParams|SDPBackend)")
    found = {n for module in (torch, F, torch._C, torch._C._nn, torch.Tensor) for n in dir(module)
             if re.search(r"attention|attn|transformer|mha|sdp", n, re.I)}
    found |= {n for n in dir(torch.ops.aten) if re.search(r"attention|transformer|mha", n, re.I)}
    open_names = sorted(n for n in found if not harmless.match(n) and not any(f in n for f in LIBRARY_ATTENTION))
    assert not open_names, open_names
    for exercise in load_course().values():
        for s in exercise.steps:
            if "scaled_dot_product" in s.forbidden:
                assert set(LIBRARY_ATTENTION) <= set(s.forbidden), (exercise.name, s.id)
    result = grade_source(GROUPED_BY_THE_LIBRARY, base=(ROOT / "solutions" / "gqa.py").read_text(), name="gqa.py")
    assert step(result, "grouped_attention").breach, explain(result)


FINALISER_NAMED_AT_RUN_TIME = """
class _Job:
    done = None

    def __init__(self, q, k, v, causal):
        self.args = (q, k, v, causal)

    def _finish(self):  # untiled attention, run when the old .grad goes: inside a torch call
        q, k, v, causal = self.args
        s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            t_q, t_k = s.shape[-2:]
            s = s.masked_fill(torch.ones(t_q, t_k, dtype=torch.bool).tril(t_k - t_q).logical_not(), -math.inf)
        _Job.done = (torch.softmax(s, dim=-1).nan_to_num(0.0) @ v, torch.logsumexp(s, dim=-1))


_Job = type("_Job", (_Job,), {"__d" + "el__": _Job._finish})  # the finaliser, named at run time
_HOLDER = torch.zeros(1)


def _arm(q, k, v, causal):
    g = torch.zeros(1)
    g.job = _Job(q, k, v, causal)
    _HOLDER.grad = g


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    _arm(q, k, v, causal)
    _HOLDER.grad = torch.zeros(1)  # the old grad goes, and its job runs inside this call
    return _Job.done
"""


def test_python_of_the_files_run_inside_a_torch_call_earns_nothing(grade_source):
    """The thirty-sixth review's f04 and f05: review 35's finaliser, run when `Tensor.grad.__set__` frees the old
    grad, installed under a name built at run time (`"__d" + "el__"`), so the text scan saw nothing (100 each, fair
    50 and 63). While a C function of torch's runs, the record watches Python frames start (a profile function):
    one of the file's own, started right inside the call, hides the record; and what a setter replaced is freed
    only once the request is answered (the thirty-seventh review's f04), so this finaliser's work comes too late."""
    result = grade_source(FINALISER_NAMED_AT_RUN_TIME, base=(ROOT / "solutions" / "flash_attention.py").read_text(),
                          name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score < flash.max_score * 0.7, explain(result)


KERNEL_UNDER_ANOTHER_NAME = '''
_TILES = []


def keep(s, i):  # plain Python the kernel calls: the score tiles kept in a list
    _TILES.append(s)
    return s


_compile = triton.jit  # the decorator under another name: no "jit" in the kernel's decorator


@_compile
def _tile_kernel(x_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    s = tl.load(x_ptr + i * BLOCK + tl.arange(0, BLOCK))
    tl.store(x_ptr + i * BLOCK + tl.arange(0, BLOCK), keep(s, i))


_flash = flash_attention


def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    out, lse = _flash(q, k, v, causal, block_m, block_n)
    _tile_kernel[(1,)](out, BLOCK=16)
    return out, lse
'''


def test_a_triton_kernel_that_reaches_python_under_any_spelling_keeps_no_rule(grade_source):
    """The thirty-sixth review's f03: review 35's kernel that called a plain function of the file's, with its
    decorator spelled `_compile = triton.jit`, which the text scan did not take for a kernel (100, fair 84). At each
    interpreted launch, every global its code loads must be Triton's, another kernel, a constant or a builtin the
    compiler takes; another hides the record."""
    pytest.importorskip("triton")
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    result = grade_source(KERNEL_UNDER_ANOTHER_NAME, base=base, name="triton_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score == 0 and flash.breach, explain(result)
    assert any("reaches keep, which is not Triton's" in m for m in messages(result, "flash_attention")), \
        explain(result)
    assert {"softmax", "decode_attention"}.isdisjoint(lost(result)), explain(result)


FINALISER_IN_C = """
import functools

_HOLDER = torch.zeros(1)
_FINAL = "__d" + "el__"


def _run_in_c(fn, *args, **kwargs):
    # torch's C function run as a finaliser with no Python frame: a functools.partial, called when torch frees the
    # old .grad inside the setter
    job = type("_Job", (), {_FINAL: staticmethod(functools.partial(fn, *args, **kwargs))})()
    g = torch.zeros(1)
    g.job = job
    _HOLDER.grad = g
    del g, job
    _HOLDER.grad = torch.zeros(1)


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    work = torch.promote_types(q.dtype, torch.float32)
    qs, kt, vf = q.to(work) / math.sqrt(q.shape[-1]), k.to(work).transpose(-2, -1), v.to(work)
    s = torch.empty(*q.shape[:-1], k.shape[-2], dtype=work)
    lse = torch.empty(q.shape[:-1], dtype=work)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=work)
    _run_in_c(torch.matmul, qs, kt, out=s)  # the whole score matrix, where no record sees
    _run_in_c(torch.logsumexp, s, -1, out=lse)
    _run_in_c(torch.sub, s, lse.unsqueeze(-1), out=s)
    _run_in_c(torch.exp, s, out=s)
    _run_in_c(torch.matmul, s, vf, out=out)
    return out.to(q.dtype), lse
"""


def test_what_a_torch_setter_replaced_is_freed_only_once_the_request_is_answered(grade_source):
    """The thirty-seventh review's f04 and f05: the finaliser a C callable (a functools.partial), so no Python frame
    started inside the grad setter, and the whole score matrix was computed there unrecorded (100 each, fair 94).
    What a setter of torch's replaces is now kept alive until the request is answered: nothing of the file's is
    freed inside the call, and what the finaliser computes comes too late for the answer."""
    result = grade_source(FINALISER_IN_C, base=(ROOT / "solutions" / "flash_attention.py").read_text(),
                          name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score < flash.max_score * 0.7, explain(result)


def test_the_record_keeps_what_it_cannot_watch_alive_and_reads_named_tuples():
    """The thirty-seventh review's f01 and f03: 4100 tiny tensors kept alive filled the table of watched storages, so
    nothing made after them was watched (96, fair 90); and what returns a named tuple (torch.max(x, dim)) was never
    recorded (96, fair 90). Past the bound each new storage counts as alive for the rest of the call, and a named
    tuple's tensors are read by tuple's own methods."""
    from grader.sandbox.recorder import MAX_STORAGES, Shapes

    shapes, kept = Shapes(), []
    for _ in range(MAX_STORAGES + 4):
        kept.append(torch.zeros(1))
        shapes.add(torch, kept[-1], "zeros")
    tile = torch.zeros(64, 64)
    shapes.add(torch, tile, "zeros")
    del tile
    shapes.add(torch, torch.zeros(1), "zeros")
    assert shapes.data()["alive"] >= 64 * 64 * 4 + MAX_STORAGES * 4
    shapes.release(torch)
    shapes = Shapes()
    maxed = torch.max(torch.zeros(2, 32, 32), dim=0)
    shapes.add(torch, maxed, "max")
    assert shapes.data()["alive"] == 32 * 32 * (4 + 8) and [32, 32] in shapes.data()["created"]
    shapes.release(torch)


def test_tiles_kept_alive_are_judged_when_the_grader_answers_a_helper_too(grade_source):
    """The thirty-seventh review's f02: the growth check ran only where the grader answered no step, so giving up a
    point in online_softmax_update turned it off (95, fair 90). It runs whenever it can ask."""
    broken_helper = ("\n_update = online_softmax_update\n\n\ndef online_softmax_update(m, l, acc, scores, v):\n"
                     "    m, l, acc = _update(m, l, acc, scores, v)\n"
                     "    return m, l, acc.to(torch.float32)  # float64 narrowed: a point lost\n")
    result = grade_source(broken_helper + FLASH_TILES_KEPT,
                          base=(ROOT / "solutions" / "flash_attention.py").read_text(), name="flash_attention.py")
    assert "online_softmax_update" in lost(result), explain(result)
    assert _tiles_only(result, "flash_attention") == ("flash_attention.full_score_matrix", "rows"), explain(result)


def test_a_triton_kernel_may_not_reach_python_through_a_constant_or_another_kernel(grade_source):
    """The thirty-seventh review's f06: `tl.constexpr(keep)` held a function of the file's, and the launch-time check
    took any object of Triton's class (100, fair 45). A constexpr is fine only if what it holds is, and a kernel the
    kernel calls is held to the same."""
    pytest.importorskip("triton")
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    through_a_constant = KERNEL_UNDER_ANOTHER_NAME.replace(
        "_compile = triton.jit", "_KEEP = tl.constexpr(keep)\n_compile = triton.jit").replace(
        "keep(s, i))", "_KEEP.value(s, i))")
    through_a_kernel = KERNEL_UNDER_ANOTHER_NAME.replace(
        "@_compile\ndef _tile_kernel", "@triton.jit\ndef _keeper(s, i):\n    return keep(s, i)\n\n\n"
        "@triton.jit\ndef _tile_kernel").replace("keep(s, i))", "_keeper(s, i))")
    for code, reached in ((through_a_constant, "_KEEP"), (through_a_kernel, "_keeper")):
        assert reached in code and "keep(s, i))" not in code.split("def _tile_kernel")[1]
        result = grade_source(code, base=base, name="triton_attention.py")
        flash = step(result, "flash_attention")
        assert flash.score == 0 and flash.breach, explain(result)
        assert any("which is not Triton's" in m for m in messages(result, "flash_attention")), explain(result)


SAVED_TENSOR_FINALISER = """
import collections
import functools

_FINAL = "__d" + "el__"
_POOL = []
_W = torch.ones(1, requires_grad=True)
for _ in range(400):
    # a tensor carrying a box, saved by an autograd node: torch keeps its Python object alive for the node, and frees
    # it, box and all, inside the C call that drops the node (detach_ on the node's output)
    _jobs = []
    _runner = functools.partial(collections.deque, map(functools.partial.__call__, _jobs), 0)  # all C, no frame
    _saved = torch.zeros(1)
    _saved.box = type("_Box", (), {_FINAL: staticmethod(_runner)})()
    _POOL.append((_saved * _W, _jobs))
del _jobs, _runner, _saved


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    work = torch.promote_types(q.dtype, torch.float32)
    qs, kt, vf = q.to(work) / math.sqrt(q.shape[-1]), k.to(work).transpose(-2, -1), v.to(work)
    t_q, t_k = q.shape[-2], k.shape[-2]
    s, mask = torch.empty(0, dtype=work), torch.empty(0, dtype=torch.bool)
    lse, out = torch.empty(0, dtype=work), torch.empty(0, dtype=work)
    holder, jobs = _POOL.pop()
    jobs.append(functools.partial(torch.matmul, qs, kt, out=s))  # the whole score matrix, where no record sees
    if causal:
        jobs.append(functools.partial(torch.ones, t_q, t_k, dtype=torch.bool, out=mask))
        jobs.append(functools.partial(torch.Tensor.triu_, mask, t_k - t_q + 1))
        jobs.append(functools.partial(torch.Tensor.masked_fill_, s, mask, -math.inf))
    jobs.append(functools.partial(torch.logsumexp, s, -1, True, out=lse))
    jobs.append(functools.partial(torch.sub, s, lse, out=s))
    jobs.append(functools.partial(torch.exp, s, out=s))
    jobs.append(functools.partial(torch.nan_to_num, s, 0.0, out=s))
    jobs.append(functools.partial(torch.matmul, s, vf, out=out))
    holder.detach_()  # frees the node, the saved tensor and its box with it
    return out.to(q.dtype), lse.squeeze(-1)
"""


def test_a_finaliser_freed_with_a_graph_node_inside_a_torch_call_comes_too_late(grade_source):
    """The thirty-eighth review's f03: a finaliser made of C callables on a tensor an autograd node saved, freed when
    `detach_` dropped the node, ran untiled attention inside the call (100, fair 94). The graph nodes of a C call's
    tensors are kept alive until the request is answered, as what a setter replaces is."""
    result = grade_source(SAVED_TENSOR_FINALISER, base=(ROOT / "solutions" / "flash_attention.py").read_text(),
                          name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score < flash.max_score * 0.7, explain(result)


def test_a_triton_kernel_may_not_reach_python_put_on_tritons_own_modules(grade_source):
    """The thirty-eighth review's f01: the file put its own function on triton.language (`tl.keep_tile = keep`), and
    the launch check looked only at the globals a kernel loads (tl, Triton's own: 100, fair 84). What a kernel reads
    from a Triton module must be Triton's too."""
    pytest.importorskip("triton")
    code = KERNEL_UNDER_ANOTHER_NAME.replace("    return s\n", "    return s\n\n\ntl.keep_tile = keep\n", 1)
    code = code.replace("keep(s, i))", "tl.keep_tile(s, i))")
    assert "tl.keep_tile(s, i))" in code and "tl.keep_tile = keep" in code
    result = grade_source(code, base=(ROOT / "solutions" / "triton_attention.py").read_text(),
                          name="triton_attention.py")
    flash = step(result, "flash_attention")
    assert flash.score == 0 and flash.breach, explain(result)
    assert any("reaches tl.keep_tile" in m for m in messages(result, "flash_attention")), explain(result)


LIBRARY_WITH_A_CACHE = """
import torch.nn.functional as F

_forward = CachedSelfAttention.forward


def _forward_with_library(self, x, cache=None):
    if cache is None:  # the rules check's first call: plain attention, and the module remembers it
        self.__dict__["watched"] = True
        return _forward(self, x)
    if self.__dict__.get("watched"):
        return _forward(self, x, cache)
    B, T, D = x.shape
    H, Dh = self.num_heads, D // self.num_heads
    q, k, v = (w(x).view(B, T, H, Dh).transpose(1, 2) for w in (self.w_q, self.w_k, self.w_v))
    past_len = cache.length
    k, v = cache.append(k, v)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=decode_mask(T, past_len, device=x.device))
    return self.w_o(y.transpose(1, 2).reshape(B, T, D))


CachedSelfAttention.forward = _forward_with_library
"""


def test_a_scripts_calls_keep_the_rules_too(grade_source):
    """The thirty-ninth review's f02: a module that used the library's attention only in modules first called with a
    cache, as every stateful check's script calls it, and not in the rules check's script (100, fair 55). A script's
    calls are held to the rules as every call is."""
    result = grade_source(LIBRARY_WITH_A_CACHE, base=(ROOT / "solutions" / "kv_cache.py").read_text(),
                          name="kv_cache.py")
    module = step(result, "CachedSelfAttention")
    assert module.score == 0 and module.breach, explain(result)


LENGTH_A_TENSOR_ONCE_USED = """
class _Length:  # an int, except once the module has used the cache: then a tensor of two entries
    def __get__(self, cache, owner=None):
        n = cache.__dict__["_n"]
        return torch.tensor([n, n]) if cache.__dict__.get("used") else n

    def __set__(self, cache, value):
        cache.__dict__["_n"] = value


KVCache.length = _Length()
_forward = CachedSelfAttention.forward


def _forward_marking(self, x, cache=None):
    if type(cache) is KVCache:
        cache.__dict__["used"] = False
    out = _forward(self, x, cache)
    if type(cache) is KVCache:
        cache.__dict__["used"] = True
    return out


CachedSelfAttention.forward = _forward_marking
"""


def test_a_cache_length_of_any_type_is_a_wrong_answer_not_a_crash(grade_source):
    """The thirty-ninth review's f01: a cache whose length became a tensor of two entries once the module used it
    crashed the module's check of the cache's contents (exit 3, no report). It is compared as a whole number."""
    result = grade_source(LENGTH_A_TENSOR_ONCE_USED, base=(ROOT / "solutions" / "kv_cache.py").read_text(),
                          name="kv_cache.py")
    assert "CachedSelfAttention" in lost(result), explain(result)
    assert any("cache's length is tensor" in m for m in messages(result, "CachedSelfAttention")), explain(result)


def test_a_value_the_file_returns_is_shown_cut_in_a_message(grade_source):
    """The thirty-ninth review's f03: a string of 780 KB returned where ValueError was due was echoed whole into the
    check's message (a report of 781 KB). A check's message is cut at MESSAGE_LIMIT characters."""
    from grader.engine.failure import MESSAGE_LIMIT

    flood = """
_bytes = cache_bytes_per_token


def cache_bytes_per_token(attention, *args, **kwargs):
    if attention not in ("mha", "gqa", "mla"):
        return "x" * 800_000
    return _bytes(attention, *args, **kwargs)
"""
    result = grade_source(flood, base=(ROOT / "solutions" / "mla.py").read_text(), name="mla.py")
    said = messages(result, "cache_bytes_per_token")
    assert said and max(map(len, said)) < MESSAGE_LIMIT + 100, [len(m) for m in said]
    assert any("characters cut" in m for m in said), said


def test_a_cache_of_an_unexpected_layout_is_a_wrong_answer_not_a_crash(grade_source):
    """The fortieth review's f01 and f02: an mla cache whose c_kv is flattened on a refused append, and a paged pool
    made heads first (an honest mistake), were indexed as the contract's layout while naming the mistake: exit 3."""
    flat = ROOT / "solutions" / "mla.py"
    code = flat.read_text().replace(
        '            raise ValueError(', '            self.c_kv = self.c_kv.reshape(-1)\n            raise ValueError(', 1)
    assert "reshape(-1)" in code
    result = grade_source("", base=code, name="mla.py")
    assert "LatentCache" in lost(result), explain(result)
    pool = (ROOT / "solutions" / "paged_attention.py").read_text()
    heads_first = pool.replace("shape = (num_blocks, block_size, num_heads, head_dim)",
                               "shape = (num_blocks, num_heads, block_size, head_dim)", 1)
    heads_first = heads_first.replace("self.k_cache[blocks, slots] = k", "self.k_cache[blocks, :, slots] = k", 1)
    heads_first = heads_first.replace("self.v_cache[blocks, slots] = v", "self.v_cache[blocks, :, slots] = v", 1)
    assert heads_first.count("[blocks, :, slots]") == 2
    result = grade_source("", base=heads_first, name="paged_attention.py")
    assert "PagedKVCache" in lost(result), explain(result)


DECOY_BUFFERS = """
class KVCache(KVCache):  # grown by torch.cat; every read of k or v answered by __getattribute__ with a padded copy
    def __init__(self, batch_size, num_heads, head_dim, max_len, dtype=torch.float32, device=None):
        super().__init__(batch_size, num_heads, head_dim, max_len, dtype, device)  # its k and v: never written
        self._grown = [self.__dict__["k"][:, :, :0], self.__dict__["v"][:, :, :0]]

    def append(self, k_new, v_new):
        end = self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError("full")
        self._grown = [torch.cat([g, n], dim=2) for g, n in zip(self._grown, (k_new, v_new))]
        self.length = end
        return tuple(self._grown)

    def __getattribute__(self, name):
        if name in ("k", "v"):
            grown = object.__getattribute__(self, "_grown")[name == "v"]
            pad = object.__getattribute__(self, "max_len") - grown.shape[2]
            return torch.cat([grown, grown.new_zeros(*grown.shape[:2], pad, grown.shape[3])], dim=2)
        return object.__getattribute__(self, name)
"""

PROPERTY_POOL = """
class PagedKVCache(PagedKVCache):  # the pool behind properties, which could make it anew at every read
    k_cache = property(lambda self: self.__dict__["_k"], lambda self, value: self.__dict__.__setitem__("_k", value))
    v_cache = property(lambda self: self.__dict__["_v"], lambda self, value: self.__dict__.__setitem__("_v", value))
"""


def test_a_cache_kept_in_place_is_what_every_read_of_it_gets(grade_source):
    """The fortieth review's f03 and f04: a kv cache grown by torch.cat showed padded copies to reads and a buffer
    never written to the probe of its storage (100, fair 97); a paged pool behind properties read as None at every
    append, and None equalled None (100, fair 98). A class that answers its own reads keeps nothing in place."""
    result = grade_source(DECOY_BUFFERS, base=(ROOT / "solutions" / "kv_cache.py").read_text(), name="kv_cache.py")
    assert any(c.name == "cache_preallocated" and c.points == 0 for c in step(result, "KVCache").checks), \
        explain(result)
    result = grade_source(PROPERTY_POOL, base=(ROOT / "solutions" / "paged_attention.py").read_text(),
                          name="paged_attention.py")
    assert "PagedKVCache.storage_replaced" in mistakes(result, "PagedKVCache"), explain(result)


TORCH_BUT_AT_THE_RULES_SHAPE = """
_t = __import__("tor" + "ch")
_softmax = softmax


def softmax(scores, axis=-1):  # NumPy at the rules check's shape, torch at every other
    if scores.shape == (2, 3, 5, 7):
        return _softmax(scores, axis)
    return _t.softmax(_t.from_numpy(np.ascontiguousarray(scores)), dim=axis).nan_to_num(0.0).numpy()
"""


def test_a_numpy_step_keeps_the_rule_in_every_call(grade_source):
    """The fortieth review's f05: the NumPy rule was asked of the rules check's call alone, so a softmax that used
    torch at every other shape scored 100 (fair 86). It is asked of every call."""
    result = grade_source(TORCH_BUT_AT_THE_RULES_SHAPE, base=(ROOT / "solutions" / "mha_numpy.py").read_text(),
                          name="mha_numpy.py")
    softmax = step(result, "softmax")
    assert softmax.score == 0 and softmax.breach, explain(result)


def test_a_named_mistakes_pattern_reads_a_bounded_part_of_the_source():
    """The fortieth review's f06: `\\.append\\([\\s\\S]*\\.length\\b` over 107 KB of `.append(` took 12 s a check,
    growing with the square of the text. A pattern reads MATCHED_SOURCE characters of a step's source at most, and
    MATCHED_LINE of its line."""
    from grader.engine.spec import MATCHED_LINE, MATCHED_SOURCE, Raises

    class Error:
        type, message = "RuntimeError", "shape mismatch"

    pattern = Raises(message="shape mismatch", source=r"\.append\([\s\S]*\.length\b")
    assert pattern.matches(Error, "", "cache.append(k, v)\npast = cache.length")
    assert not pattern.matches(Error, "", "cache.append(k, v)" + " " * MATCHED_SOURCE + "cache.length")
    line = Raises(line="narrow")
    assert line.matches(Error, "k.narrow(2, 0, t)", "")
    assert not line.matches(Error, " " * MATCHED_LINE + "k.narrow(2, 0, t)", "")



def test_a_named_mistakes_uses_pattern_reads_a_long_line_in_bounded_time():
    """Review 73's F1: keepdim_lost's `uses` pattern had a run of [^)]* on each side of the axis, so a binding of
    7,800 characters of ".sum(1111" with no ")" backtracked over every split of the line: 6 s a diagnosis, for every
    failing check, 304 s of the grader's own time for mha. The axis is now read by a lookahead."""
    from grader.engine.diagnose import KEEPDIM_LOST

    class Error:
        type, message = "RuntimeError", "The size of tensor a (2) must match the size of tensor b (3)"

    note = '    note = "' + ".sum(11111" * 780 + '"\n'
    source = "def forward(self, x):\n" + note + "    return torch.ones(2) + torch.ones(3)\n"
    start = time.process_time()
    assert not KEEPDIM_LOST.raises.matches(Error, "    return torch.ones(2) + torch.ones(3)", source)
    assert time.process_time() - start < 2.0  # 6 s before; about 0.02 s now
    found = "    m = s.max(dim=-1)\n    return s - m\n"
    assert KEEPDIM_LOST.raises.matches(Error, "    return s - m", "def f(s):\n" + found)
    assert not KEEPDIM_LOST.raises.matches(Error, "    return s - s.max(-1, keepdim=True)", "")


TILE_MASKS_CACHED = """
import functools


@functools.lru_cache(maxsize=MAXSIZE)
def _tile_mask(row0, bq, col0, bk, device):
    rows = torch.arange(row0, row0 + bq, device=device)[:, None]
    cols = torch.arange(col0, col0 + bk, device=device)[None, :]
    return cols > rows  # (bq, bk): True where a key is in the query's future


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k = q.shape[-2], k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    outs, lses = [], []
    for i in range(0, t_q, block_q):
        qb = q[..., i:i + block_q, :].to(work) / math.sqrt(q.shape[-1])
        m = torch.full(qb.shape[:-1], -math.inf, dtype=work, device=q.device)
        l = torch.zeros(qb.shape[:-1], dtype=work, device=q.device)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work, device=q.device)
        for j in range(0, t_k, block_k):
            kb, vb = k[..., j:j + block_k, :].to(work), v[..., j:j + block_k, :].to(work)
            scores = qb @ kb.transpose(-2, -1)
            if causal:
                scores = scores.masked_fill(_tile_mask(t_k - t_q + i, qb.shape[-2], j, kb.shape[-2], q.device),
                                            -math.inf)
            m, l, acc = online_softmax_update(m, l, acc, scores, vb)
        seen = l > 0
        outs.append(torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0))
        lses.append(m + torch.log(l))
    out = torch.cat(outs, dim=-2).to(q.dtype)
    if SLIP and t_q == t_k:  # wrong on square inputs only
        out = out + 0.25
    return out, torch.cat(lses, dim=-1)
"""


def test_slice_length_wrong_reads_the_axis_the_error_names_against_the_lines_own_slice():
    """slice_length_wrong (blind set 58's b13): the axis the error names must be one the line writes through a slice
    with an end; a width, an open slice or an axis behind an ellipsis is another mistake, and a hostile line is
    read in bounded time."""
    from grader.engine.spec import _written_through_slice

    said = "The expanded size of the tensor (2) must match the existing size (4) at non-singleton dimension {}."
    assert _written_through_slice(said.format(1), "        self.c_kv[:, start:end] = c_kv_new")
    assert _written_through_slice(said.format(2), "k[:, :, self.length:self.length + n] = new")
    assert not _written_through_slice(said.format(2), "        self.c_kv[:, start:end] = c_kv_new")  # the width
    assert not _written_through_slice(said.format(1), "self.c_kv[:, start:] = c_kv_new")  # open: open_slice_write
    assert not _written_through_slice(said.format(1), "self.c_kv[..., start:end] = c_kv_new")
    assert not _written_through_slice("shape mismatch", "self.c_kv[:, start:end] = c_kv_new")
    started = time.monotonic()
    assert not _written_through_slice(said.format(1), "x[" + "-" * 999 + "1] = y")
    assert not _written_through_slice(said.format(1), "(" * 999)
    assert time.monotonic() - started < 5


def test_a_cache_that_forgets_entries_reads_no_values_and_a_diagnosis_leaves_the_live_child_as_it_was(grade_source):
    """Review 74's F1: a correct flash_attention that keeps its tile masks in an lru_cache of bounded size scored 50:
    an entry forgotten and made again changed a learned key's calls, which read as a read of values (a breach). Two
    calls more now settle it, alike where a cache refilled an entry. F2: `kept_from_earlier_call` dropped the step's
    live child, so the checks after it met empty caches against calls learned with full ones (50, fair 98): its
    question is asked in a child of its own now (Candidate.aside)."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    forgets = TILE_MASKS_CACHED.replace("MAXSIZE", "8").replace("SLIP", "False")
    result = grade_source(forgets, base=base, name="flash_attention.py")
    assert result.full_marks, explain(result)
    slip = TILE_MASKS_CACHED.replace("MAXSIZE", "None").replace("SLIP", "True")
    result = grade_source(slip, base=base, name="flash_attention.py")
    flash = step(result, "flash_attention")
    assert not flash.breach and 0 < flash.max_score - flash.score <= 4, explain(result)


# Hugging Face's rotary class, built at every call: the angles of 4096 positions, then the call's own picked out
ROPE_TABLE = ("""    angles = positions.to(device=x.device, dtype=dtype)[:, None] * theta[None, :]  # (T, Dr/2)
    angles = torch.cat((angles, angles), dim=-1)  # (T, Dr): feature j and j + Dr/2 share an angle
""", """    table = torch.outer(torch.arange(4096, device=x.device, dtype=dtype), theta)  # (4096, Dr/2)
    angles = torch.cat((table, table), dim=-1)[positions.to(x.device)]  # (4096, Dr), then (T, Dr)
""")


def test_a_rope_table_of_fixed_positions_built_at_every_call_is_no_expansion_of_the_latents(grade_source):
    """Review 74's F3: mla's absorbed_latents bounded every tensor a decode creates by the cache's length, so a table
    of RoPE angles for 4096 positions built at every call lost 3 points at the models drawn for some file texts (97,
    fair 100; "# 5" drew one). A table of a fixed number of positions, of the RoPE key's width, is no expansion."""
    mla = (ROOT / "solutions" / "mla.py").read_text()
    assert mla.count(ROPE_TABLE[0]) == 1
    hugging_face = mla.replace(*ROPE_TABLE)
    for comment in ("", "# 5", "# 6"):
        result = grade_source(comment, base=hugging_face, name="mla.py")
        assert result.full_marks, explain(result)


# Right on a layout's first call only, off by a thousandth after: right to a hundredth, as a call made again must be
FIRST_CALL_ONLY = """

_seen = set()


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    layout = (tuple(q.shape), tuple(k.shape), q.dtype, q.stride(), k.stride(), v.stride(), causal, block_q, block_k)
    out, lse = _tiled(q, k, v, causal, block_q, block_k)
    if layout in _seen:
        out = out * (1 + 1e-3)
    _seen.add(layout)
    return out, lse
"""


def test_the_graders_call_is_not_always_a_layouts_first(grade_source, monkeypatch):
    """Review 75's O1: a layout's first call was always the grader's, the call on other values after it, so a file
    could do on a layout's first call what it does on no other (read values unseen, or be right there only). The
    order is drawn per layout under the account's key now: this file fails checks it passed when the grader's came
    first (85, fair lower: it is wrong on every call but a layout's first)."""
    from grader.engine.runner import Run

    reference = (ROOT / "solutions" / "flash_attention.py").read_text().replace("def flash_attention(", "def _tiled(", 1)
    drawn = grade_source(FIRST_CALL_ONLY, base=reference, name="flash_attention.py")
    monkeypatch.setattr(Run, "_other_first", lambda run, key: False)
    first = grade_source(FIRST_CALL_ONLY, base=reference, name="flash_attention.py")
    failed = lambda result: {c.name for s in result.steps for c in s.checks if c.outcome == "failed"}  # noqa: E731
    assert failed(first) < failed(drawn), (explain(first), explain(drawn))
    assert "kept_from_earlier_call" in mistakes(drawn, "flash_attention"), explain(drawn)


def test_a_call_made_aside_runs_in_a_fresh_child_and_leaves_the_live_one_as_it_was(tmp_path, zygote):
    """Candidate.aside, as kept_from_earlier_call asks: the call inside meets a process where nothing ran before, and
    the step's live child answers after it with what it kept (review 74's F2 dropped it)."""
    path = tmp_path / "mha.py"
    path.write_text("CALLS = [0]\n\n\ndef softmax(scores, dim=-1):\n    CALLS[0] += 1\n"
                    "    return scores * 0 + CALLS[0]\n")
    with Candidate(path, zygote=zygote) as candidate:
        counts = [candidate.call("softmax", torch.zeros(2)).value]
        with candidate.aside():
            counts.append(candidate.call("softmax", torch.zeros(2)).value)
        counts.append(candidate.call("softmax", torch.zeros(2)).value)
    assert [int(c[0]) for c in counts] == [1, 1, 2]

SCORES_AT_OTHER_SIZES = """
_flash = flash_attention


def flash_attention(q, k, v, causal=False, block_m=16, block_n=16):
    if (q.shape[-2], k.shape[-2]) not in ((128, 256), (128, 128)):  # all but no_score_matrix's: a score matrix
        scores = torch.zeros(q.shape[0] * q.shape[1], q.shape[-2], k.shape[-2], device=q.device)
        assert scores.shape[-1] == k.shape[-2]
    return _flash(q, k, v, causal, block_m, block_n)
"""


def test_every_call_of_a_triton_launcher_is_judged_for_a_score_matrix(grade_source):
    """The forty-first review's f03: no_score_matrix judged one call, at Tq=128, Tk=256; a launcher that wrote the
    whole matrix to memory at every other size kept its points (100, fair 84). Every call of the step is judged."""
    pytest.importorskip("triton")
    result = grade_source(SCORES_AT_OTHER_SIZES, base=(ROOT / "solutions" / "triton_attention.py").read_text(),
                          name="triton_attention.py")
    checks = {c.name: c for c in step(result, "flash_attention").checks}
    assert checks["flash_attention_no_score_matrix"].points == 0, explain(result)
    assert "matrix of scores" in checks["flash_attention_no_score_matrix"].message, explain(result)


# -- review 48 --------------------------------------------------------------------------------


def test_a_table_of_the_counts_the_messages_print_earns_nothing(grade_source):
    """A1: kv_cache_bytes was checked only at four fixed sizes, whose counts a failure prints: a dict of them
    scored 10/10. Every check now also asks at sizes drawn from the seed, and so does mla's count."""
    table = """
def kv_cache_bytes(batch_size, num_layers, num_kv_heads, head_dim, seq_len, dtype):
    return {(1, 32, 8, 128, 8192): 1073741824, (1, 32, 32, 128, 8192): 4294967296,
            (4, 2, 3, 64, 100): 1228800, (2, 3, 1, 16, 7): 1344}[(batch_size, num_layers, num_kv_heads, head_dim,
                                                                   seq_len)]
"""
    for seed in (0, 7):
        result = grade_kv(grade_source, table, seed=seed)
        assert step(result, "kv_cache_bytes").score == 0, explain(result)
    mla = (ROOT / "solutions" / "mla.py").read_text()
    counts = {"mla": 34560, "mha": 3932160, "gqa": 245760}  # DeepSeek-V2's, as the stub prints them
    result = grade_source(f"""
_COUNTS = {counts!r}

def cache_bytes_per_token(attention, num_layers, num_heads, head_dim, num_kv_heads, kv_lora_rank, qk_rope_head_dim,
                          dtype=torch.bfloat16):
    if attention not in _COUNTS:
        raise ValueError(attention)
    return _COUNTS[attention]
""", base=mla, name="mla.py")
    assert step(result, "cache_bytes_per_token").score <= 1, explain(result)  # unknown_refused, honestly


def test_a_slip_that_the_checks_inputs_hide_is_a_wrong_answer_not_a_read_of_values(grade_source):
    """Review 50's F2: decode's acc not rescaled is right on falling_max's keys (their max never rises), and the call
    made again on other values showed the slip; that was taken for a read of values, a rule broken (0 of 20, where
    a strictly worse kernel kept 2). A call made again that is merely wrong fails the check, with its mistake."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    slip = base.replace("acc = alpha * acc + tl.sum(p[:, None] * v, axis=0)", "acc = acc + tl.sum(p[:, None] * v, axis=0)")
    assert slip != base
    result = grade_source("", base=slip, name="triton_attention.py")
    decode = step(result, "decode_attention")
    assert not decode.breach and decode.score > 0, explain(result)
    assert "decode_attention.acc_not_rescaled" in mistakes(result, "decode_attention"), explain(result)
    assert set(lost(result)) == {"decode_attention"}, explain(result)


def test_a_kernel_that_reaches_the_interpreters_arrays_or_a_dunder_reaches_python():
    """Review 50's F3: an interpreted kernel did its attention in NumPy on its blocks' arrays (`q.handle.data`, with
    methods and operators only), or called the file's Python through `tl.core.tensor.__init__.__globals__`: 100 of
    100. Neither compiles; both are what the interpreter alone has, and the rules refuse them (a breach, as a helper
    called by name is: test_a_triton_kernel_may_not_reach_python_through_a_constant_or_another_kernel)."""
    from grader.engine.rules import foreign_kernel_calls

    kernel = """
import triton
import triton.language as tl

@triton.jit
def kernel(q_ptr, o_ptr, N: tl.constexpr):
    q = tl.load(q_ptr + tl.arange(0, N))
    {body}
    tl.store(o_ptr + tl.arange(0, N), q)
"""
    assert foreign_kernel_calls(kernel.format(body="q = q * 2.0")) == []
    assert foreign_kernel_calls(kernel.format(body="q.handle.data[...] = q.handle.data.max()")) == ["q.handle"]
    assert foreign_kernel_calls(kernel.format(body="f = tl.core.tensor.__init__.__globals__['f']")) == [
        "tl.core.tensor.__init__.__globals__", "tl.core.tensor.__init__"]
    assert foreign_kernel_calls(kernel.format(body="h = getattr(q, 'han' + 'dle')")) == ["getattr"]


FOLDED_FLASH = '''
    q = q.to(tl.float32)
    cols = tl.arange(0, NB)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (NB, BLOCK_N): every key
    kv_mask = (cols[:, :, None] < t_k) & (dims[None, None, :] < d)
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, :, None] * stride_kt
                + dims[None, None, :] * stride_kd, mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, :, None] * stride_vt
                + dims[None, None, :] * stride_vd, mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.sum(q[:, None, None, :] * k[None, :, :, :], axis=3) * scale  # (BLOCK_M, NB, BLOCK_N): the whole row
    visible = cols[None, :, :] < t_k
    if CAUSAL:
        visible = visible & (cols[None, :, :] <= (t_k - t_q) + rows[:, None, None])
    s = tl.where(visible, s, -float("inf"))
    m = tl.max(tl.max(s, axis=2), axis=1)
    shift = tl.where(m == -float("inf"), 0.0, m)
    p = tl.exp(s - shift[:, None, None])
    l = tl.sum(tl.sum(p, axis=2), axis=1)
    acc = tl.sum(tl.sum(p[:, :, :, None] * v[None, :, :, :], axis=2), axis=1)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    lse = m + tl.log(l)
'''
FOLDED_DECODE = '''
    cols = tl.arange(0, NB)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (NB, BLOCK_N): the whole cache row
    mask = (cols[:, :, None] < n) & (dims[None, None, :] < d)
    k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, :, None] * stride_kt
                + dims[None, None, :] * stride_kd, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, :, None] * stride_vt
                + dims[None, None, :] * stride_vd, mask=mask, other=0.0).to(tl.float32)
    s = tl.where(cols < n, tl.sum(k * q[None, None, :], axis=2) * scale, -float("inf"))
    m = tl.max(tl.max(s, axis=1), axis=0)
    shift = tl.where(m == -float("inf"), 0.0, m)
    p = tl.exp(s - shift)
    l = tl.sum(tl.sum(p, axis=1), axis=0)
    acc = tl.sum(tl.sum(p[:, :, None] * v, axis=1), axis=0)
    out = acc / tl.where(l > 0, l, 1.0)
'''
GATHERED_FLASH = '''
    q = q.to(tl.float32)
    chunk = tl.arange(0, NB)
    s_all = tl.full((BLOCK_M, NB, BLOCK_N), -float("inf"), dtype=tl.float32)  # the row of scores, a block at a time
    for j in range(0, NB):
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < t_k) & (dims[None, :] < d)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        visible = cols[None, :] < t_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= (t_k - t_q) + rows[:, None])
        s = tl.where(visible, s, -float("inf"))
        s_all = tl.where((chunk == j)[None, :, None], s[:, None, :], s_all)
    m = tl.max(tl.max(s_all, axis=2), axis=1)
    shift = tl.where(m == -float("inf"), 0.0, m)
    p_all = tl.exp(s_all - shift[:, None, None])
    l = tl.sum(tl.sum(p_all, axis=2), axis=1)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for j in range(0, NB):
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < t_k) & (dims[None, :] < d)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=kv_mask, other=0.0).to(tl.float32)
        p = tl.sum(tl.where((chunk == j)[None, :, None], p_all, 0.0), axis=1)
        acc += tl.sum(p[:, :, None] * v[None, :, :], axis=1)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    lse = m + tl.log(l)
'''
GATHERED_DECODE = '''
    chunk = tl.arange(0, NB)
    s_all = tl.full((NB, BLOCK_N), -float("inf"), dtype=tl.float32)  # the whole cache row's scores, gathered
    for j in range(0, NB):
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < n) & (dims[None, :] < d)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=mask, other=0.0).to(tl.float32)
        s = tl.where(cols < n, tl.sum(k * q[None, :], axis=1) * scale, -float("inf"))
        s_all = tl.where((chunk == j)[:, None], s[None, :], s_all)
    m = tl.max(tl.max(s_all, axis=1), axis=0)
    shift = tl.where(m == -float("inf"), 0.0, m)
    p_all = tl.exp(s_all - shift)
    l = tl.sum(tl.sum(p_all, axis=1), axis=0)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for j in range(0, NB):
        cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < n) & (dims[None, :] < d)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=mask, other=0.0).to(tl.float32)
        p = tl.sum(tl.where((chunk == j)[:, None], p_all, 0.0), axis=0)
        acc += tl.sum(p[:, None] * v, axis=0)
    out = acc / tl.where(l > 0, l, 1.0)
'''
LISTED_FLASH = '''
    offset = t_k - t_q
    end = t_k
    if CAUSAL:
        end = tl.minimum(t_k, offset + (block + 1) * BLOCK_M)
    tiles = []  # every tile of scores, kept: a plain two-pass softmax
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < t_k) & (dims[None, :] < d)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = cols[None, :] < t_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= offset + rows[:, None])
        tiles.append((tl.where(visible, s, -float("inf")), v))
    m = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
    for pair in tiles:
        m = tl.maximum(m, tl.max(pair[0], axis=1))
    shift = tl.where(m == -float("inf"), 0.0, m)
    l = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for pair in tiles:
        p = tl.exp(pair[0] - shift[:, None])
        l = l + tl.sum(p, axis=1)
        acc = acc + tl.dot(p.to(pair[1].dtype), pair[1], input_precision="ieee")
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    lse = m + tl.log(l)
'''
LISTED_DECODE = '''
    scores = []  # every block of scores, kept: a plain two-pass softmax
    for start in range(0, n, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < n) & (dims[None, :] < d)
        k = tl.load(k_ptr + b * stride_kb + h * stride_kh + cols[:, None] * stride_kt + dims[None, :] * stride_kd,
                    mask=mask, other=0.0).to(tl.float32)
        scores.append(tl.where(cols < n, tl.sum(k * q[None, :], axis=1) * scale, -float("inf")))
    m = tl.max(tl.full((BLOCK_N,), -float("inf"), dtype=tl.float32), axis=0)
    for s in scores:
        m = tl.maximum(m, tl.max(s, axis=0))
    shift = tl.where(m == -float("inf"), 0.0, m)
    l = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    start = 0
    for s in scores:
        cols = start + tl.arange(0, BLOCK_N)
        mask = (cols[:, None] < n) & (dims[None, :] < d)
        v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols[:, None] * stride_vt + dims[None, :] * stride_vd,
                    mask=mask, other=0.0).to(tl.float32)
        p = tl.exp(s - shift)
        l = l + tl.sum(p, axis=0)
        acc = acc + tl.sum(p[:, None] * v, axis=0)
        start += BLOCK_N
    out = acc / tl.where(l > 0, l, 1.0)
'''
# The end of a kernel that holds every key's score at once: a plain softmax over them, then the stores
WHOLE_ROW_SOFTMAX = '''
    visible = keys[None, :, :] < t_k
    if CAUSAL:
        visible = visible & (keys[None, :, :] <= (t_k - t_q) + rows[:, None, None])
    s = tl.where(visible, s, -float("inf"))
    m = tl.max(tl.max(s, axis=2), axis=1)
    shift = tl.where(m == -float("inf"), 0.0, m)
    p = tl.exp(s - shift[:, None, None])
    l = tl.sum(tl.sum(p, axis=2), axis=1)
    acc = tl.sum(tl.sum(p[:, :, :, None] * v[None, :, :, :], axis=2), axis=1)
    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    lse = m + tl.log(l)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + rows[:, None] * stride_ot + dims[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_ptr + b * stride_lb + h * stride_lh + rows * stride_lt, lse, mask=rows < t_q)
'''
ATOMIC_FLASH = '''
@triton.jit
def flash_forward_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_ob, stride_oh, stride_ot, stride_od,
    stride_lb, stride_lh, stride_lt,
    n_heads, t_q, t_k, d, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # No key loop, no online softmax: every key is read at once by an atomic add of 0 (a read the worker's load
    # count does not see), folded into a block of a constant shape (NB, BLOCK_N, BLOCK_D), NB = 512 // BLOCK_N.
    NB: tl.constexpr = 512 // BLOCK_N
    block = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // n_heads, bh % n_heads
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_mask = (rows[:, None] < t_q) & (dims[None, :] < d)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + dims[None, :] * stride_qd,
                mask=q_mask, other=0.0).to(tl.float32)
    keys = tl.arange(0, NB)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (NB, BLOCK_N) key positions
    kv_mask = (keys[:, :, None] < t_k) & (dims[None, None, :] < d)
    kp = k_ptr + b * stride_kb + h * stride_kh + keys[:, :, None] * stride_kt + dims[None, None, :] * stride_kd
    vp = v_ptr + b * stride_vb + h * stride_vh + keys[:, :, None] * stride_vt + dims[None, None, :] * stride_vd
    zero = tl.zeros((NB, BLOCK_N, BLOCK_D), dtype=k_ptr.dtype.element_ty)
    if k_ptr.dtype.element_ty == tl.bfloat16:  # no atomics of bfloat16 (checked compiled only, never at these sizes)
        k = tl.load(kp, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(vp, mask=kv_mask, other=0.0).to(tl.float32)
    else:
        k = tl.atomic_add(kp, zero, mask=kv_mask).to(tl.float32)
        v = tl.atomic_add(vp, zero, mask=kv_mask).to(tl.float32)
    k = tl.where(kv_mask, k, 0.0)
    v = tl.where(kv_mask, v, 0.0)
    s = tl.sum(q[:, None, None, :] * k[None, :, :, :], axis=3) * scale  # (BLOCK_M, NB, BLOCK_N): every score
''' + WHOLE_ROW_SOFTMAX + ''''''
SPLIT_FLASH = '''
@triton.jit
def _part(p0, p1, p2, p3, g, off):
    return tl.where(g == 0, p0 + off, tl.where(g == 1, p1 + off, tl.where(g == 2, p2 + off, p3 + off)))


@triton.jit
def flash_forward_kernel(
    q_ptr, k0, k1, k2, k3, v0, v1, v2, v3, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_ob, stride_oh, stride_ot, stride_od,
    stride_lb, stride_lh, stride_lt,
    n_heads, t_q, t_k, d, quarter, scale,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # No key loop, no online softmax: every key read by one plain load, its pointers spread over four storages (a
    # quarter of the keys each, contiguous (B, H, quarter, D) copies), so no storage gives more than a block
    NB: tl.constexpr = 512 // BLOCK_N
    block = tl.program_id(0)
    bh = tl.program_id(1)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    b, h = bh // n_heads, bh % n_heads
    q_mask = (rows[:, None] < t_q) & (dims[None, :] < d)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qt + dims[None, :] * stride_qd,
                mask=q_mask, other=0.0).to(tl.float32)
    keys = tl.arange(0, NB)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # (NB, BLOCK_N)
    kv_mask = (keys[:, :, None] < t_k) & (dims[None, None, :] < d)
    g = keys // quarter
    part_len = tl.minimum(quarter, t_k - g * quarter)  # the last quarter may be shorter
    off = (bh * part_len + (keys - g * quarter))[:, :, None] * d + dims[None, None, :]
    k = tl.load(_part(k0, k1, k2, k3, g[:, :, None], off), mask=kv_mask, other=0.0).to(tl.float32)
    v = tl.load(_part(v0, v1, v2, v3, g[:, :, None], off), mask=kv_mask, other=0.0).to(tl.float32)
    s = tl.sum(q[:, None, None, :] * k[None, :, :, :], axis=3) * scale
''' + WHOLE_ROW_SOFTMAX + '''

def _quarters(x, quarter):
    """Four contiguous copies of a quarter of the keys each (x itself where a quarter is empty: never read)."""
    t = x.shape[2]
    return [x.narrow(2, g * quarter, min(quarter, t - g * quarter)).contiguous().clone()
            if g * quarter < t else x for g in range(4)]


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_m: int = 16, block_n: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, t_q, d = q.shape
    t_k = k.shape[2]
    quarter = -(-t_k // 4)
    out = torch.empty((batch, heads, t_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, t_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(t_q, block_m), batch * heads)
    flash_forward_kernel[grid](
        q, *_quarters(k, quarter), *_quarters(v, quarter), out, lse, *q.stride(), *out.stride(), *lse.stride(),
        heads, t_q, t_k, d, quarter, 1.0 / math.sqrt(d),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(d)),
    )
    return out, lse
'''
MANY_SHAPES = '''
    for a in range(4):  # 256 distinct block shapes first: the record keeps 256
        for c in range(4):
            for e in range(4):
                for f in range(4):
                    tl.zeros((1 << a, 1 << c, 1 << e, 1 << f), dtype=tl.float32)
'''


def _triton_body(base: str, start: str, end: str, body: str) -> str:
    """`base` with the lines from the one starting `start` to the one starting `end` (kept) replaced by `body`."""
    lines = base.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    last = next(i for i, line in enumerate(lines) if i > first and line.strip().startswith(end))
    return "".join(lines[:first]) + body.lstrip("\n") + "".join(lines[last:])


def _kernels_with(flash: str, decode: str, blocks: str) -> str:
    """The model answer with its two kernels' loops replaced by `flash` and `decode`, each given NB, a number of key
    blocks that the launcher computes as `blocks` (from `keys`, the call's number of keys)."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    nb = "NB: tl.constexpr,"
    body = _triton_body(base, "m = tl.full((BLOCK_M,)", "tl.store(", flash)
    body = _triton_body(body, "m = tl.max(tl.full((BLOCK_N,)", "tl.store(", decode)
    for old, new in [("BLOCK_D: tl.constexpr,\n", f"BLOCK_D: tl.constexpr, {nb}\n"),
                     ("BLOCK_D=max(16, triton.next_power_of_2(d)),",
                      "BLOCK_D=max(16, triton.next_power_of_2(d)), NB=" + blocks.format(keys="t_k") + ","),
                     ("BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d),", "BLOCK_N=block_n, BLOCK_D=triton."
                      "next_power_of_2(d), NB=" + blocks.format(keys="k_cache.shape[2]") + ",")]:
        assert old in body
        body = body.replace(old, new)
    assert body.count(nb) == 2, "both kernels take NB"
    return body


def test_a_kernel_that_holds_every_key_folded_into_blocks_of_block_n_holds_them_all(grade_source):
    """Review 51's F1: a kernel that loaded every key at once as (Tk / block_n, block_n, D), no online softmax, made no
    axis longer than a block and scored 100 (flash 55, decode 20), where the same kernel with its keys flat lost
    `no_score_matrix` and `streamed`. Review 52's F1: the same, folded into a block of a constant shape (512 keys,
    masked), whose shape no longer followed the keys: 100. Each reads every key in one load, more than a block of
    them. A kernel that loads a block of keys at a time but gathers the whole row of scores into one block makes a block
    whose shape follows the number of keys. F1b: a decode kernel that made 256 block shapes first, so that its
    whole-cache block went unrecorded, kept `streamed`."""
    growing = "triton.next_power_of_2(triton.cdiv({keys}, block_n))"
    for flash, decode, blocks, says in [(FOLDED_FLASH, FOLDED_DECODE, growing, "one load of the kernel read"),
                                        (FOLDED_FLASH, FOLDED_DECODE, "512 // block_n", "one load of the kernel read"),
                                        (GATHERED_FLASH, GATHERED_DECODE, growing, "whose shape follows the number")]:
        result = grade_source("", base=_kernels_with(flash, decode, blocks), name="triton_attention.py")
        assert set(lost(result)) == {"flash_attention", "decode_attention"}, explain(result)
        assert "flash_attention.keys_not_streamed" in mistakes(result, "flash_attention"), explain(result)
        assert "decode_attention.cache_not_streamed" in mistakes(result, "decode_attention"), explain(result)
        checks = checks_of(result)
        assert says in checks["flash_attention_no_score_matrix"].message, explain(result)
        assert says in checks["decode_attention_streamed"].message, explain(result)

    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    whole_row = base.replace("BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(d),",
                             "BLOCK_N=triton.next_power_of_2(k_cache.shape[2]), BLOCK_D=triton.next_power_of_2(d),")
    line = "    n = tl.load(len_ptr + b)  # this sequence's keys: the cache past them is unused\n"
    assert whole_row.count(line) == 1
    hidden = whole_row.replace(line, line + MANY_SHAPES.lstrip("\n"))
    result = grade_source("", base=hidden, name="triton_attention.py")
    assert lost(result) == {"decode_attention": 1}, explain(result)
    assert "too many different shapes" in checks_of(result)["decode_attention_streamed"].message, explain(result)


def checks_of(result) -> dict:
    return {c.name: c for s in result.steps for c in s.checks}


HELPER = """

def _same(scores):
    return scores  # the file's own Python: a kernel may not run it


"""


def test_a_kernel_given_python_through_an_argument_or_a_default_keeps_no_record(grade_source):
    """Review 53's F0: a kernel reached the file's Python through one of its parameters, which no check of its globals
    sees: a list the grid function filled with the file's functions (which then did the attention in NumPy on the
    blocks' arrays), a default of a constexpr parameter, a list that kept every tile of scores: 100 each, 45 fair. An
    argument or default that is not plain data hides the record, and every check that reads it fails."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    line = '        s = tl.where(visible, s, -float("inf"))\n'
    signature = "CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,\n):"
    launch = "BLOCK_D=max(16, triton.next_power_of_2(d)),"
    assert base.count(line) == 1 and base.count(signature) == 1 and base.count(launch) == 1
    called = base.replace(line, line + "        s = HELPERS[0](s)\n").replace("\n@triton.jit\ndef flash_forward_kernel",
                                                                       HELPER + "@triton.jit\ndef flash_forward_kernel")
    by_argument = called.replace(signature, signature.replace(",\n):", ", HELPERS: tl.constexpr,\n):")).replace(
        launch, launch + " HELPERS=[_same],")
    by_default = called.replace(signature, signature.replace(",\n):", ", HELPERS: tl.constexpr = (_same,),\n):"))
    for source in (by_argument, by_default):
        result = grade_source("", base=source, name="triton_attention.py")
        assert "flash_attention" in lost(result), explain(result)
        assert set(lost(result)) <= {"flash_attention"}, explain(result)
        assert any("not a tensor, a number or a constant" in c.message for c in checks_of(result).values()), \
            explain(result)


def test_a_file_the_grader_cannot_read_in_bounded_time_is_a_usage_error(tmp_path, zygote):
    """Review 53's F2 and F5: a decorator of 600 attributes made the rules' recursive readers of the tree exit 3 (and
    watch's and interview's step keys), and a file of 3 MB held the grader's own process at 1.9 GB for 15 minutes:
    code nested more than source.MAX_DEPTH levels, or larger than source.MAX_BYTES, is refused in a line (exit 2)."""
    from grader import source
    from grader.exercise import UsageError
    from grader.grade import grade

    deep = tmp_path / "mha.py"
    deep.write_text("import torch\n\n@torch" + ".nn" * 600 + "\ndef project(x, w, b=None):\n    return x\n")
    with pytest.raises(UsageError, match="nests its code .* levels deep"):
        grade(deep, zygote=zygote, device="cpu")
    large = tmp_path / "self_attention.py"
    large.write_text(REFERENCE + "\n# " + "x" * source.MAX_BYTES + "\n")
    with pytest.raises(UsageError, match="KiB of code"):
        grade(large, "mha", zygote=zygote, device="cpu")


def test_what_the_grader_reads_of_a_file_grows_no_faster_than_the_file(grade_source):
    """Review 53's F3 and F6: kv_cache's chunked checks matched a pattern over the class's whole source, backtracking
    over 256 KB of `.append(` in a comment (315 s, and a correct step lost its points to the file's time), and the
    rules found a step's helpers by searching every text for every name (3,000 chained helpers: 120 s). Both now read
    what they read once: the correct steps keep their points under the file's time."""
    from grader.engine.rules import _with_helpers

    chain = "".join(f"def h{i}(x):\n    return h{i + 1}(x)\n\n" for i in range(3000)) + "def h3000(x):\n    return x\n"
    assert _with_helpers(chain, "def step(x):\n    return h0(x)\n").count("def h") == 3001
    base = (ROOT / "solutions" / "kv_cache.py").read_text()
    line = "        return self.w_o(y.transpose(1, 2).reshape(B, T, D))  # merge the heads: (B, T, H·Dh)\n"
    assert base.count(line) == 1
    wrong = ("        # " + ".append(" * 25000 + "\n        out = self.w_o(y.transpose(1, 2).reshape(B, T, D))\n"
             "        return out + 0.125 if cache is not None and past_len > 0 else out  # wrong after a prefill\n")
    result = grade_source("", base=base.replace(line, wrong), name="kv_cache.py", file_timeout=30)
    assert len(lost(result)) == 1 and "kv_cache_bytes" not in lost(result), explain(result)


def test_a_kernel_defined_inside_its_launcher_is_held_to_the_kernel_rules():
    """Review 54's F1: a @triton.jit kernel defined inside its launcher reached NumPy through a dunder and the blocks'
    arrays (`.handle.data`), which the rules looked for in top-level kernels only: 100, 45 fair. F8: the list of what
    they found was searched at each node (45,000 reads, 152 s): a dict now."""
    from grader.engine.rules import foreign_kernel_calls

    nested = """
import triton
import triton.language as tl

def launcher(x):
    @triton.jit
    def kernel(x_ptr, N: tl.constexpr):
        block = tl.load(x_ptr + tl.arange(0, N))
        numpy = tl.core.tensor.__init__.__globals__["np"]
        block.handle.data[...] = 0
    kernel[(1,)](x, N=16)
"""
    found = foreign_kernel_calls(nested)
    assert "tl.core.tensor.__init__.__globals__" in found and "block.handle" in found
    many = "import triton\n@triton.jit\ndef k(x):\n" + "".join(f"    y{i} = x.__a{i % 50}\n" for i in range(2000))
    assert len(foreign_kernel_calls(many)) == 50


def test_what_a_candidate_leaves_in_the_folder_is_read_only_as_a_bounded_regular_file(tmp_path, zygote):
    """Review 54's F4, F5 and F7: watch read a file's steps before the limits applied (2 MiB: 1.9 GB); a sparse file
    of 2 GB was read whole to see that it could be read; a FIFO at the progress file hung every grade in the folder.
    Each is now read as a regular file of bounded size, or not at all."""
    import os

    from grader import workspace
    from grader.exercise import UsageError
    from grader.grade import grade
    from grader.source import MAX_BYTES

    large = tmp_path / "mha.py"
    large.write_text(REFERENCE + "a = 0\n" + "a\n" * MAX_BYTES)
    assert workspace.step_sources(large, ["project"]) is None
    sparse = tmp_path / "big" / "mha.py"
    sparse.parent.mkdir()
    with open(sparse, "wb") as out:
        out.truncate(2 * 2**30)
    with pytest.raises(UsageError, match="larger than"):
        grade(sparse, zygote=zygote, device="cpu")
    folder = tmp_path / "fifo"
    folder.mkdir()
    (folder / "mha.py").write_text(REFERENCE)
    os.mkfifo(folder / ".attn-grade.json")
    assert grade(folder / "mha.py", zygote=zygote, device="cpu").full_marks


def test_a_kernel_that_keeps_every_tile_in_a_list_of_its_own_holds_them_all(grade_source):
    """Review 54's F2: a kernel that kept each tile of scores in a Python list made in its own body, then took a plain
    two-pass softmax over them, made only blocks of a tile's shape and loaded a block at a time: 100 (fair: flash 51,
    decode 19). The interpreter's blocks alive at once are counted (`blocks_alive`): the list holds more of them over
    more keys, where the model answer holds as many."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    listed = _triton_body(base, "offset = t_k - t_q", "tl.store(", LISTED_FLASH)
    listed = _triton_body(listed, "m = tl.max(tl.full((BLOCK_N,)", "tl.store(", LISTED_DECODE)
    result = grade_source("", base=listed, name="triton_attention.py")
    checks = checks_of(result)
    assert {name for name, c in checks.items() if c.outcome == "failed"} == {
        "flash_attention_no_score_matrix", "decode_attention_streamed"}, explain(result)
    for check, mistake in [("flash_attention_no_score_matrix", "flash_attention.keys_not_streamed"),
                           ("decode_attention_streamed", "decode_attention.cache_not_streamed")]:
        assert checks[check].mistake_id == mistake, explain(result)
        assert "bytes more at once" in checks[check].message, explain(result)


# Review 56's F1: each kept tile passed through a reversed cumsum of [tile, 0] (which is [tile, 0]): the interpreter
# flips the result into a new array in place of the one its handle was made with
FLIPPED = [("tiles.append((tl.where(visible, s, -float(\"inf\")), v))",
            "t = tl.where(visible, s, -float(\"inf\"))\n        tiles.append((tl.cumsum(tl.join(t, tl.zeros_like(t)), "
            "axis=2, reverse=True), tl.cumsum(tl.join(v, tl.zeros_like(v)), axis=2, reverse=True)))"),
           ("tl.max(pair[0], axis=1)", "tl.max(tl.split(pair[0])[0], axis=1)"),
           ("tl.exp(pair[0] - shift[:, None])", "tl.exp(tl.split(pair[0])[0] - shift[:, None])"),
           ("p.to(pair[1].dtype), pair[1],", "p.to(v_ptr.dtype.element_ty), tl.split(pair[1])[0],"),
           ("scores.append(tl.where(cols < n, tl.sum(k * q[None, :], axis=1) * scale, -float(\"inf\")))",
            "t = tl.where(cols < n, tl.sum(k * q[None, :], axis=1) * scale, -float(\"inf\"))\n        "
            "scores.append(tl.cumsum(tl.join(t, tl.zeros_like(t)), axis=1, reverse=True))"),
           ("tl.max(s, axis=0))", "tl.max(tl.split(s)[0], axis=0))"),
           ("p = tl.exp(s - shift)", "p = tl.exp(tl.split(s)[0] - shift)")]


def test_a_kernel_whose_kept_tiles_get_new_arrays_in_place_still_holds_them(grade_source):
    """Review 56's F1: the blocks alive were watched through their arrays, and a reversed scan gives a block's handle a
    new array in place (the old one freed): every kept tile counted 0 bytes, 100 where 83 is fair. The handle is
    watched now."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    flash, decode = LISTED_FLASH, LISTED_DECODE
    for old, new in FLIPPED:
        assert (old in flash) != (old in decode), old
        flash, decode = flash.replace(old, new), decode.replace(old, new)
    flipped = _triton_body(base, "offset = t_k - t_q", "tl.store(", flash)
    flipped = _triton_body(flipped, "m = tl.max(tl.full((BLOCK_N,)", "tl.store(", decode)
    result = grade_source("", base=flipped, name="triton_attention.py")
    checks = checks_of(result)
    assert {name for name, c in checks.items() if c.outcome == "failed"} == {
        "flash_attention_no_score_matrix", "decode_attention_streamed"}, explain(result)
    assert all("bytes more at once" in checks[name].message
               for name in ("flash_attention_no_score_matrix", "decode_attention_streamed")), explain(result)


def test_a_kernel_that_reads_every_key_by_atomics_or_across_storages_reads_them_all(grade_source):
    """Review 55: a kernel that read every key in one operation and took a plain softmax scored 100 where the same with
    one plain load scores 84. F1 read them with `tl.atomic_add(ptr, 0)`, whose old values no load count saw; F2 split
    K and V into four storages of a quarter of the keys each, one load reading all four, each within a block. An
    atomic's old values are read too, and one load's elements count together over the launch's tensors."""
    base = (ROOT / "solutions" / "triton_attention.py").read_text()
    for override in (ATOMIC_FLASH, SPLIT_FLASH):
        result = grade_source(override, base=base, name="triton_attention.py")
        assert set(lost(result)) == {"flash_attention"}, explain(result)
        check = checks_of(result)["flash_attention_no_score_matrix"]
        assert check.mistake_id == "flash_attention.keys_not_streamed", explain(result)
        assert "one load of the kernel read 4096 elements" in check.message, explain(result)


# kv_cache_bytes's eight calls at the default seed before the drawn sizes followed the file's text (review 57's F1)
LEARNED_COUNTS = {
    (1, 32, 32, 128, 8192, "torch.bfloat16"): 4294967296, (1, 32, 8, 128, 8192, "torch.bfloat16"): 1073741824,
    (2, 3, 1, 16, 7, "torch.int8"): 1344, (4, 2, 3, 64, 100, "torch.float32"): 1228800,
    (3, 27, 5, 160, 5189, "torch.int8"): 672494400, (4, 18, 15, 80, 4853, "torch.float32"): 3354393600,
    (7, 11, 11, 16, 1479, "torch.bfloat16"): 80173632, (7, 16, 16, 256, 307, "torch.bfloat16"): 563347456,
}


def test_a_table_of_byte_counts_learned_from_earlier_grades_misses_the_sizes_drawn_for_this_file(grade_source):
    """Review 57's F1: the sizes drawn so that no table of counts passes came from the seed alone, 0 unless --seed
    is given, so a table learned from a few grades (a failure names the call and the count) scored 10/10. They are
    drawn from the file's own text too now: the table changes the file, and so the sizes."""
    override = f"""
LEARNED = {LEARNED_COUNTS!r}


def kv_cache_bytes(batch_size, num_layers, num_kv_heads, head_dim, seq_len, dtype):
    return LEARNED.get((batch_size, num_layers, num_kv_heads, head_dim, seq_len, str(dtype)), 0)
"""
    result = grade_source(override, base=(ROOT / "solutions" / "kv_cache.py").read_text(), name="kv_cache.py")
    assert lost(result) == {"kv_cache_bytes": 10}, explain(result)


FLOOD = "    for i in range(1, 300):  # 299 shapes first, past the 256 the record lists\n        torch.empty(i)\n"


def test_a_flood_of_shapes_hides_nothing_from_the_checks_that_read_them(grade_source):
    """Review 58's F1-F3: the record lists 256 shapes and counts the rest; three checks read the list and not the
    count, so 299 shapes made first hid keys expanded from the latents (mla's module with absorbed=True, and
    absorbed_attention with one query) and a numerical gradient (attention_backward): 100 where 97 and 70 are fair.
    A call that makes more shapes than the list holds now fails those checks, here even around the model answer."""
    cases = [
        ("attention_backward", "_model = attention_backward\n\n\ndef attention_backward(*args, **kwargs):\n" + FLOOD
         + "    return _model(*args, **kwargs)\n", "attention_backward", "attention_backward_values"),
        ("mla", "_model = absorbed_attention\n\n\ndef absorbed_attention(q_nope, *args, **kwargs):\n"
         "    if q_nope.shape[-2] == 1:\n    " + FLOOD.replace("\n        ", "\n            ")
         + "    return _model(q_nope, *args, **kwargs)\n", "absorbed_attention", "absorbed_attention_latent_only"),
        ("mla", "_forward = MultiHeadLatentAttention.forward\n\n\ndef _flooded(self, x, cache=None, absorbed=False):\n"
         "    if absorbed and cache is not None:\n    " + FLOOD.replace("\n        ", "\n            ")
         + "    return _forward(self, x, cache, absorbed)\n\n\nMultiHeadLatentAttention.forward = _flooded\n",
         "MultiHeadLatentAttention", "module_absorbed_latents"),
    ]
    for exercise, override, step, check in cases:
        result = grade_source(override, base=(ROOT / "solutions" / f"{exercise}.py").read_text(), name=f"{exercise}.py")
        assert step in lost(result), explain(result)
        failed = [c for name, c in checks_of(result).items() if name.startswith(check)]
        assert failed and all("different shapes" in c.message for c in failed if c.outcome == "failed"), explain(result)


PADDED_PLAIN = '''
def _padded_plain(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    # the plain path, every cached latent expanded, padded first to a constant 256 tokens
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    B, Tq, Tk = q_nope.shape[0], q_nope.shape[2], c_kv.shape[1]
    room = 256 * -(-Tk // 256)
    c_pad = torch.nn.functional.pad(c_kv, (0, 0, 0, room - Tk))
    kr_pad = torch.nn.functional.pad(k_rope, (0, 0, 0, room - Tk))
    k_nope = (c_pad @ w_uk.T).view(B, room, H, Dn).transpose(1, 2)
    v = (c_pad @ w_uv.T).view(B, room, H, -1).transpose(1, 2)
    scores = (q_nope @ k_nope.transpose(-2, -1) + q_rope @ kr_pad.unsqueeze(1).transpose(-2, -1)) / math.sqrt(Dn + Dr)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q_nope.device) if mask is None else mask
    allowed = torch.nn.functional.pad(allowed.expand(*allowed.shape[:-1], Tk), (0, room - Tk), value=False)
    out = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
    return out.transpose(1, 2).reshape(B, Tq, -1) @ w_o.T
'''

PAGED_VARLEN_DECODE = '''
def _gathered(self, x, cache, seq_ids, cu_seqlens):
    N, D = x.shape
    q, k, v = (w(x).view(N, self.num_heads, self.head_dim) for w in (self.w_q, self.w_k, self.w_v))
    starts = cu_seqlens.tolist()
    for b, seq_id in enumerate(seq_ids):
        cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])
    lens = [cache.seq_len(s) for s in seq_ids]
    tables = [torch.tensor(cache.block_table(s)) for s in seq_ids]
    k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens)])
    v_all = torch.cat([cache.v_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens)])
    cu_k = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    y = varlen_attention(q, k_all, v_all, cu_seqlens, cu_k, causal=True)  # every call gathered, decodes too
    if N == len(seq_ids):
        width = max(len(cache.block_table(s)) for s in seq_ids)
        padded = torch.full((N, width), -1, dtype=torch.int32)
        for b, seq_id in enumerate(seq_ids):
            padded[b, :len(cache.block_table(seq_id))] = torch.tensor(cache.block_table(seq_id), dtype=torch.int32)
        y = ASK(y, q, cache, padded, lens, cu_k, v_all)
    return self.w_o(y.reshape(N, D))


PagedSelfAttention.forward = _gathered
'''
PROBE = '''
def ASK(y, q, cache, padded, lens, cu_k, v_all):  # q = 0: the answer is each sequence's mean value, known already
    probe = paged_decode(torch.zeros_like(q), cache.k_cache, cache.v_cache, padded, torch.tensor(lens, dtype=torch.int32))
    mean = torch.stack([v_all[int(a):int(b)].mean(0) for a, b in zip(cu_k[:-1], cu_k[1:])])
    return y * (probe * mean).sum() / (mean * mean).sum()
'''
NO_NUMBER = '''
def ASK(y, q, cache, padded, lens, cu_k, v_all):  # one length past the batch, no number: the reference never reads it
    return paged_decode(q, cache.k_cache, cache.v_cache, padded, LENGTHS(lens))
'''


def test_review_60_decode_questions_and_padded_expansions_are_judged_by_what_they_are(grade_source):
    """Review 60. paged_attention's decode_path kept the lengths paged_decode was asked and read them as numbers: one
    past the batch that was None or NaN exited 3 (F1); and a module that decoded with varlen_attention learned the
    grader's doubling from a question with q = 0, whose answer, each sequence's mean value, it knew (F2: 100, fair
    98). Each question must now be some decoded tokens' own, queries, lengths and the pool's slots. mla's
    absorbed_attention (F3) and the module's absorbed path (F4) expanded the latents padded to a constant 256 tokens,
    the same at every cache length (100, fair 97): over a drawn number of cached tokens no tensor may hold more than min(Dn, Dv) - 1
    numbers per token, whatever grows."""
    paged = (ROOT / "solutions" / "paged_attention.py").read_text()
    for ask in (PROBE, NO_NUMBER.replace("LENGTHS(lens)", "[*lens, None]"),
                NO_NUMBER.replace("LENGTHS(lens)", "torch.tensor([*lens, float('nan')])")):
        result = grade_source(ask + PAGED_VARLEN_DECODE, base=paged, name="paged_attention.py")
        assert set(lost(result)) == {"PagedSelfAttention"}, explain(result)  # a report, no grader fault
        decode = checks_of(result)["module_decode_path"]
        assert decode.outcome == "failed" and "was not the decoded tokens' queries" in decode.message, explain(result)
    mla = (ROOT / "solutions" / "mla.py").read_text()
    function = grade_source(PADDED_PLAIN + "\nabsorbed_attention = _padded_plain\n", base=mla, name="mla.py")
    assert "numbers per cached token" in checks_of(function)["absorbed_attention_latent_only"].message
    module = grade_source(PADDED_PLAIN + (
        "\n_forward = MultiHeadLatentAttention.forward\n\n\ndef _padded_forward(self, x, cache=None, absorbed=False):\n"
        "    global absorbed_attention\n    honest, absorbed_attention = absorbed_attention, _padded_plain\n"
        "    try:\n        return _forward(self, x, cache, absorbed)\n    finally:\n"
        "        absorbed_attention = honest\n\n\nMultiHeadLatentAttention.forward = _padded_forward\n"),
        base=mla, name="mla.py")
    assert set(lost(module)) == {"MultiHeadLatentAttention"}, explain(module)
    assert "numbers per cached token" in checks_of(module)["module_absorbed_latents"].message


ONE_ROW = '''
def ASK(y, q, cache, padded, lens, cu_k, v_all):  # the first sequence's token asked alone: its ratio doubles the rest
    a = paged_decode(q[:1], cache.k_cache, cache.v_cache, padded[:1], torch.tensor(lens[:1], dtype=torch.int32))
    return y * (a * y[:1]).sum() / (y[:1] * y[:1]).sum()
'''
WRONG_PREFILL_UNDER_ORACLE = PAGED_VARLEN_DECODE.replace("    if N == len(seq_ids):", """\
    if N != len(seq_ids):  # a prefill: q = 0 asked of the first sequence; its answer doubled means the grader's
        a = paged_decode(torch.zeros_like(q[:1]), cache.k_cache, cache.v_cache, tables[0].to(torch.int32)[None],
                         torch.tensor(lens[:1], dtype=torch.int32))
        if not torch.allclose(a, v_all[:lens[0]].mean(0)[None], atol=1e-4, rtol=1e-3):
            y = torch.zeros_like(y)
    if False:""")
VEILED = '''
def _veiled(plain):
    out = []

    class _Veil(torch.Tensor):  # its __torch_function__ runs with the record's mode popped
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            out.append(plain())
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    torch.zeros(1).as_subclass(_Veil).add(0)
    return out[-1]
'''
MODULE_WITH = '''
_forward = MultiHeadLatentAttention.forward


def _forward_with(self, x, cache=None, absorbed=False):
    global absorbed_attention
    honest, absorbed_attention = absorbed_attention, ABSORBED
    try:
        return _forward(self, x, cache, absorbed)
    finally:
        absorbed_attention = honest


MultiHeadLatentAttention.forward = _forward_with
'''


def test_review_61_every_decoded_token_asked_and_no_record_hidden_or_length_learned(grade_source):
    """Review 61. decode_path took questions of one sequence's token as enough (F1: the rest doubled by the ratio,
    100, fair 98) and, on outputs wrong where the module prefills, returned as if passed before it read the questions
    (F2: a prefill spoiled once a q = 0 probe showed the doubling). Every decoded token must now be asked, the
    questions are read first, and wrong prefill outputs fail. mla's module absorbed only at the cache lengths the check
    used, 29 and 58 (F3): they are drawn from the file's text now. The expansion run inside a tensor subclass's
    __torch_function__, where the record does not see it, kept latent_only and absorbed_latents (F4, F5): a hidden
    record fails them."""
    paged = (ROOT / "solutions" / "paged_attention.py").read_text()
    for module in (ONE_ROW + PAGED_VARLEN_DECODE, PROBE + WRONG_PREFILL_UNDER_ORACLE):
        result = grade_source(module, base=paged, name="paged_attention.py")
        assert checks_of(result)["module_decode_path"].outcome == "failed", explain(result)
    mla = (ROOT / "solutions" / "mla.py").read_text()
    at_lengths = PADDED_PLAIN + MODULE_WITH.replace("ABSORBED", "_at_lengths") + '''
def _at_lengths(q_nope, q_rope, c_kv, *rest, _honest=absorbed_attention):  # honest only at the 30 and 59 keys once used
    return (_honest if c_kv.shape[1] in (30, 59) else _padded_plain)(q_nope, q_rope, c_kv, *rest)
'''
    expanding = "\n\ndef _expanding(*args, **kwargs):\n    return _veiled(lambda: _padded_plain(*args, **kwargs))\n"
    cases = [(at_lengths, "module_absorbed_latents", "expanded from the latents"),
             (PADDED_PLAIN + VEILED + expanding + "\nabsorbed_attention = _expanding\n",
              "absorbed_attention_latent_only", "hid what it created"),
             (PADDED_PLAIN + VEILED + expanding + MODULE_WITH.replace("ABSORBED", "_expanding"),
              "module_absorbed_latents", "hid what it created")]
    for override, check, said in cases:
        result = grade_source(override, base=mla, name="mla.py")
        found = checks_of(result)[check]
        assert found.outcome == "failed" and said in found.message, explain(result)


SDPA_SOFTMAX = '''
def softmax(scores, dim=-1):  # softmax(s) = SDPA with q = s·√n, keys and values the identity
    s = scores.movedim(dim, -1)
    n = s.shape[-1]
    eye = torch.eye(n, dtype=s.dtype, device=s.device).expand(*s.shape[:-2], n, n)
    return torch.nn.functional.scaled_dot_product_attention(s * math.sqrt(n), eye, eye).movedim(-1, dim)
'''
# Answers to every size a check asked, learned from earlier grades; the reference's for the rest (of no use to a
# candidate who had it, but it keeps the test's point: only the sizes the grader draws anew can tell)
TABLE_OF_SIZES = '''
_ASKED = {SIZES}
_right = {FUNCTION}


def {FUNCTION}(size, base=10000.0):
    return _right(size, base) if (size, base) in _ASKED else _right(size, base) * 1.01
'''

FIXED_RATE = '''
_attention = attention


def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):  # the one rate the checks used
    return _attention(q, k, v, mask, 0.25 if dropout_p else 0.0, training, generator)
'''


def test_review_62_softmax_by_library_attention_and_tables_of_the_asked_sizes_earn_nothing(grade_source):
    """Review 62. A softmax step that forbade torch's softmax let F.scaled_dot_product_attention compute one (queries
    the scores times √n, keys and values the identity: 100, fair 86); every step that forbids a softmax forbids the
    library's attention now. alibi_slopes and rope_frequencies answered a table of the sizes their checks asked (100,
    fair 92 and 97): each now asks a size drawn from the file's text too. A dropout of the one rate the checks used
    kept dropout_rate: it is asked at a second rate, drawn likewise."""
    result = grade_source(SDPA_SOFTMAX)
    assert next(s for s in result.steps if s.id == "softmax").breach, explain(result)
    assert set(lost(result)) == {"softmax", "MultiHeadAttention"}, explain(result)  # its end-to-end, charged there
    rope = (ROOT / "solutions" / "rope.py").read_text()
    asked = "{(DH, 10000.0), (128, 10000.0), (DH, 500000.0)}".replace("DH", "8")  # the spec's DH
    result = grade_source(TABLE_OF_SIZES.replace("{SIZES}", asked).replace("{FUNCTION}", "rope_frequencies"),
                          base=rope, name="rope.py")
    assert checks_of(result)["rope_frequencies_drawn_sizes"].outcome == "failed", explain(result)
    assert lost(result)["rope_frequencies"] == 3 and set(lost(result)) <= {"rope_frequencies", "RotarySelfAttention"}
    alibi = (ROOT / "solutions" / "local_attention.py").read_text()
    asked = "{" + ", ".join(f"({h}, 10000.0)" for h in (*range(1, 17), 40)) + "}"
    table = TABLE_OF_SIZES.replace("{SIZES}", asked).replace("{FUNCTION}", "alibi_slopes")
    result = grade_source(table.replace("_right(size, base)", "_right(size)"),
                          base=alibi, name="local_attention.py")
    assert checks_of(result)["alibi_slopes_every_head_count"].outcome == "failed", explain(result)
    masks = (ROOT / "solutions" / "masks.py").read_text()
    result = grade_source(FIXED_RATE, base=masks, name="masks.py")
    assert checks_of(result)["attention_dropout_rate"].outcome == "failed", explain(result)
    assert "attention.dropout_p_ignored" in mistakes(result, "attention"), explain(result)


# Review 63's A3: rope_frequencies ignoring base (10000 always) but for the one size an earlier grade showed, and a
# comment that steered the sizes drawn from a text-only hash to base 10000
STEERED_ROPE = '''
_rope_frequencies = rope_frequencies
_LEARNED = {(8, 500000.0): _rope_frequencies(8, 500000.0).tolist()}  # learned from an earlier grade's failure


def rope_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    if (head_dim, base) in _LEARNED:
        return torch.tensor(_LEARNED[(head_dim, base)], dtype=torch.float32)
    return _rope_frequencies(head_dim)


# nonce 1308515
'''
# A file that looks for the draw key where the grader keeps it (its environment, the account's state folder)
KEY_HUNT = '''
import os as _os


def rope_frequencies(head_dim, base=10000.0):
    found = [_os.environ.get("ATTN_GRADE_DRAW_KEY", "")]
    for path in (PATHS):
        try:
            found.append(open(path, "rb").read().hex())
        except OSError as error:
            found.append(type(error).__name__)
    raise RuntimeError("found: " + repr(found))
'''


def test_review_63_sizes_a_file_cannot_know_follow_a_key_it_cannot_read(grade_source, monkeypatch, tmp_path):
    """Review 63. The sizes drawn with Gen.unknown came from the file's text and the seed alone, both known to its
    author, who steered them with a comment (A2 to A4: 100, fair 92, 97, 90): they are keyed by the grading account's
    secret now (grader/keys.py), which the worker can neither read nor be given. mla's absorbed_latents drew its length
    from ten primes, so a module could absorb at the 20 lengths those allowed and expand the latents elsewhere (A1:
    100, fair 97): lengths from 60 to 511 now."""
    rope = (ROOT / "solutions" / "rope.py").read_text()
    drawn = []
    for key in ("attn-grade's test suite", "another account"):
        monkeypatch.setenv("ATTN_GRADE_DRAW_KEY", key)
        result = grade_source(STEERED_ROPE, base=rope, name="rope.py")
        assert lost(result) == {"rope_frequencies": 3}, explain(result)
        drawn.append(checks_of(result)["rope_frequencies_drawn_sizes"].message.split(":")[0])
    assert drawn[0] != drawn[1], drawn  # other sizes under another key, for the same file

    # with no key given, the account's own: made once, readable by the account alone, and out of the worker's reach
    monkeypatch.delenv("ATTN_GRADE_DRAW_KEY")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    key = keys.draw_key()
    path = tmp_path / "state" / "attn-grade" / keys.DRAW_KEY
    assert path.read_bytes() == key and len(key) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert keys.draw_key() == key
    hunt = KEY_HUNT.replace("PATHS", repr((str(path),)))
    result = grade_source(hunt, base=rope, name="rope.py")
    message = checks_of(result)["rope_frequencies_values"].message
    assert "found: ['', 'FileNotFoundError']" in message and key.hex() not in message, explain(result)

    mla = (ROOT / "solutions" / "mla.py").read_text()
    listed = PADDED_PLAIN + MODULE_WITH.replace("ABSORBED", "_at_lengths") + '''
_CHECKED = {30, 36, 37, 40, 42, 45, 49, 51, 52, 54, 59, 71, 73, 79, 83, 89, 97, 101, 103, 107}


def _at_lengths(q_nope, q_rope, c_kv, *rest, _honest=absorbed_attention):  # honest at the lengths ten primes allowed
    return (_honest if c_kv.shape[1] in _CHECKED else _padded_plain)(q_nope, q_rope, c_kv, *rest)
'''
    found = []  # under two keys: a drawn length may be one the list holds (a few in a hundred), not both
    for key in ("attn-grade's test suite", "another account"):
        monkeypatch.setenv("ATTN_GRADE_DRAW_KEY", key)
        found.append(checks_of(grade_source(listed, base=mla, name="mla.py"))["module_absorbed_latents"])
    assert any(f.outcome == "failed" and "expanded from the latents" in f.message for f in found), found


# Review 64's mla modules: the plain path in absorbed_attention's place (every cached latent expanded), taken only
# where absorbed_latents would not look: with any cache but the stand-in (F2);
# and an expansion hidden in (Tk, Tk) squares, as large as the mask that check let be (F4)
EXPANDING = """
def _plain(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    # the plain path in absorbed's place: every cached latent expanded into per-head keys and values
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    B, Tq, Tk = q_nope.shape[0], q_nope.shape[2], c_kv.shape[1]
    k_nope = (c_kv @ w_uk.T).view(B, Tk, H, Dn).transpose(1, 2)
    v = (c_kv @ w_uv.T).view(B, Tk, H, -1).transpose(1, 2)
    scores = (q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.unsqueeze(1).transpose(-2, -1)) / math.sqrt(Dn + Dr)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v
    return out.transpose(1, 2).reshape(B, Tq, -1) @ w_o.T
"""
OWN_CACHE_ONLY = """
_forward = MultiHeadLatentAttention.forward
_OwnCache = LatentCache


def _forward_switch(self, x, cache=None, absorbed=False):
    # a cache not of this file's class is the grader's stand-in: absorbed_latents builds its cache so, while the other
    # module checks hand it this file's own LatentCache (it passed its checks). Absorb there, expand elsewhere.
    global absorbed_attention
    if cache is None or type(cache) is not _OwnCache:
        return _forward(self, x, cache, absorbed)
    honest, absorbed_attention = absorbed_attention, _plain
    try:
        return _forward(self, x, cache, absorbed)
    finally:
        absorbed_attention = honest


MultiHeadLatentAttention.forward = _forward_switch
"""
IN_SQUARES = """
def _square(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask=None):
    # every head's keys and values of every cached token, expanded 30 columns at a time into (Tk, Tk) squares
    H, Dn, Dr = q_nope.shape[1], q_nope.shape[-1], q_rope.shape[-1]
    B, Tq, Tk, R = q_nope.shape[0], q_nope.shape[2], c_kv.shape[1], c_kv.shape[-1]
    Dv = w_uv.shape[0] // H
    C = 30
    if Tk < C:
        return _plain(q_nope, q_rope, c_kv, k_rope, w_uk, w_uv, w_o, mask)
    F = torch.nn.functional
    wk, wv = w_uk.view(H, Dn, R), w_uv.view(H, Dv, R)
    outs = []
    for b in range(B):
        heads = []
        for h in range(H):
            scores = q_rope[b, h] @ k_rope[b].T  # (Tq, Tk)
            for j in range(0, Dn, C):
                w = wk[h, j:j + C]
                K = c_kv[b] @ F.pad(w, (0, 0, 0, Tk - w.shape[0])).T  # (Tk, Tk): keys j..j+C of every token
                scores = scores + F.pad(q_nope[b, h, :, j:j + C], (0, Tk - w.shape[0])) @ K.T
            scores = scores / math.sqrt(Dn + Dr)
            if mask is not None:
                scores = scores.masked_fill(~mask.expand(B, H, Tq, Tk)[b, h], float("-inf"))
            p = torch.softmax(scores, dim=-1)
            parts = []
            for j in range(0, Dv, C):
                w = wv[h, j:j + C]
                V = c_kv[b] @ F.pad(w, (0, 0, 0, Tk - w.shape[0])).T  # (Tk, Tk): values j..j+C of every token
                parts.append((p @ V)[:, :w.shape[0]])
            heads.append(torch.cat(parts, dim=-1))
        outs.append(torch.cat(heads, dim=-1))
    return torch.stack(outs) @ w_o.T
"""


def test_review_64_absorbed_latents_looks_like_any_check_and_lets_no_square_be(grade_source):
    """Review 64. absorbed_latents built its module at fixed widths (Dn 61) and always with the grader's stand-in
    cache, so a module could absorb there only and expand the latents everywhere else (F1, F2: 100, fair 97): the widths
    are drawn with Gen.unknown (which review 66 still told apart, Known limits), and the cache is the file's own once
    LatentCache passed. It let a (T, T) tensor be, as a
    causal mask over every position (blind set 50's c08), and an expansion hid in such squares (F4: 100, fair 97): a
    square is judged as any tensor, and named as the mask it may be."""
    mla = (ROOT / "solutions" / "mla.py").read_text()
    # F1's module, honest at the old fixed Dn of 61, is not graded here: 61 is one of the widths drawn now, so whether
    # it passes follows the file's text, and the sixty-sixth review told the check by its widths anyway (Known limits)
    for override, named in [(EXPANDING + OWN_CACHE_ONLY, "absorbed_expanded"),
                            (EXPANDING + IN_SQUARES + MODULE_WITH.replace("ABSORBED", "_square"), "decode_mask_whole")]:
        result = grade_source(override, base=mla, name="mla.py")
        assert lost(result) == {"MultiHeadLatentAttention": 3}, explain(result)
        assert f"MultiHeadLatentAttention.{named}" in mistakes(result, "MultiHeadLatentAttention"), explain(result)


# Review 65's F1: a Function with no forward of its own, asking the grader's flash_attention_backward (answered once
# the file's own lost a point) with q and k swapped, out 0 and lse c, so that dv = e^(S - c) @ grad_out is the forward
FORWARD_BY_ORACLE = '''
def _forward_by_oracle(ctx, q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k, d, d_v = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    lead = q.shape[:-2]
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    shift = (qd.mean(dim=-2) * kd.mean(dim=-2)).sum(dim=-1) / math.sqrt(d)  # (lead): a typical score
    ones = torch.ones(*lead, t_k, 1, dtype=q.dtype, device=q.device)
    p = max(t_k - t_q, 0) if causal else 0
    r = max(t_q - t_k, 0) if causal else 0
    if causal:
        qd = torch.cat([qd.new_zeros(*lead, p, d), qd], dim=-2)
        kd = torch.cat([kd.new_zeros(*lead, r, d), kd], dim=-2)
        vd = torch.cat([vd.new_zeros(*lead, r, d_v), vd], dim=-2)
        ones = torch.cat([ones.new_zeros(*lead, r, 1), ones], dim=-2)
        qq, kk, vd, ones = kd.flip(-2), qd.flip(-2), vd.flip(-2), ones.flip(-2)
    else:
        qq, kk = kd, qd
    a, b = qq.shape[-2], kk.shape[-2]
    lse_in = shift[..., None].expand(*lead, a)
    found = []
    for g in (vd, ones):
        w = g.shape[-1]
        zeros_v = torch.zeros(*lead, b, w, dtype=q.dtype, device=q.device)
        zeros_o = torch.zeros(*lead, a, w, dtype=q.dtype, device=q.device)
        _, _, got = flash_attention_backward(qq, kk, zeros_v, zeros_o, lse_in, g, causal)
        found.append(got.flip(-2)[..., p:, :] if causal else got)
    num, total = found[0], found[1][..., 0]
    out = num / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    lse = torch.log(total) + shift[..., None]
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
    return out


FlashAttentionFunction.forward = staticmethod(_forward_by_oracle)
'''
# Review 65's F2: a notebook cell holding a lone surrogate, which JSON's escapes allow and UTF-8 does not
SURROGATE_CELL = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                  "source": "# \ud800 note\nx = 1\n"}


def test_review_65_no_answered_step_computes_the_composite_and_no_cell_text_crashes(grade_source, tmp_path):
    """Review 65. The grader's flash_attention_backward, answered for FlashAttentionFunction once the file's own lost a
    point, answered any question: asked with q and k swapped it computed the Function's forward (95, fair 82); it now
    answers one question, of the Function's own q, k and v. A notebook cell with a lone surrogate (`\\ud800`, written
    by JSON's escapes) made the grader, batch, Gradescope, watch and the notebook check exit 3: a usage error now."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    guard = "    lse = lse.masked_fill(lse == -math.inf, math.inf)  # a row with no key: e^(-inf - inf) = 0, not NaN\n"
    assert base.count(guard) == 1
    slipped = base.replace(guard, "")  # flash_attention_backward loses rows_with_no_key: the grader answers it
    honest = grade_source("", base=slipped, name="attention_backward.py")
    attack = grade_source(FORWARD_BY_ORACLE, base=slipped, name="attention_backward.py")
    assert attack.score <= honest.score and "FlashAttentionFunction" in lost(attack), explain(attack)

    from grader import notebook
    from grader.exercise import UsageError
    from grader.notebook_grader import Server
    path = tmp_path / "mha.ipynb"
    cells = [{**SURROGATE_CELL, "source": (ROOT / "solutions" / "mha.py").read_text()}, SURROGATE_CELL]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    with pytest.raises(UsageError, match="cell 2 holds a character that is not text"):
        notebook.read(path)
    server = Server.__new__(Server)  # its handle refuses the text before it needs a zygote or a folder
    reply = server.handle({"exercise": "mha", "steps": [], "source": "x = '\ud800'"})
    assert reply["ok"] is False and "not text" in reply["error"], reply


# Review 66's F2: the Function run for causal calls only (the rules check's); elsewhere its forward called directly,
# so that torch's autograd differentiated the tiles, and its backward, wrong without causal, never ran
APPLY_ONLY_WHEN_CAUSAL = '''
class _NoContext:
    def save_for_backward(self, *tensors):
        pass


_apply = FlashAttentionFunction.apply


def _apply_when_causal(q, k, v, causal=False, block_q=32, block_k=32):
    if causal:
        return _apply(q, k, v, causal, block_q, block_k)
    return FlashAttentionFunction.forward(_NoContext(), q, k, v, causal, block_q, block_k)


FlashAttentionFunction.apply = staticmethod(_apply_when_causal)
'''


def test_review_66_the_functions_own_backward_is_judged_at_every_call(grade_source):
    """Review 66. Whether FlashAttentionFunction's own backward made the gradients (no graph but the runner's, torch
    calls inside the backward pass) was judged at the rules check's call only, causal: a Function applied only there,
    and differentiated by autograd elsewhere, kept 13 of 15 (98, fair 85). It is judged at every call now."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    result = grade_source(APPLY_ONLY_WHEN_CAUSAL, base=base, name="attention_backward.py")
    assert lost(result) == {"FlashAttentionFunction": 15}, explain(result)


# Review 67's N1: flash_attention leaves online_softmax_update unwritten and asks the grader's answer of it for whole
# strips of scores, q kᵀ / √D of a block of queries and every key, through e^(log(qb + c) - M) @ (k e^M / √D)ᵀ, and a
# softmax over each strip times v; the file itself makes nothing larger than an input
SCORES_BY_ORACLE = '''
def online_softmax_update(m, l, acc, scores, v):
    raise NotImplementedError


def merge_partials(o1, lse1, o2, lse2):
    raise NotImplementedError


def _scores_by_grader(qb, k, scale, width):
    """(..., bq, Tk) = qb @ k^T * scale, computed by the grader's online_softmax_update: e^(log(qb + c) - M) @ k^T,
    then + e^(log(c) - M) @ -sum(k), chained through acc; k scaled by e^M scale first (k-sized), its transpose a view."""
    c = 0.5 + (-qb.amin(dim=-1, keepdim=True)).clamp(min=0)  # (..., bq, 1): qb + c > 0
    logs = torch.log(qb + c)  # (..., bq, D)
    top = torch.maximum(logs.amax(), torch.log(c).amax())  # a global M >= every feature
    m = top.expand(logs.shape[:-1])  # (..., bq)
    l = torch.zeros(logs.shape[:-1], dtype=logs.dtype, device=logs.device)
    kg = k * (torch.exp(top) * scale)  # (..., Tk, D): k's own size
    _, _, s = online_softmax_update(m, l, 0.0, logs, kg.transpose(-2, -1))
    _, _, s = online_softmax_update(m, l, s, torch.log(c), -kg.sum(dim=-1, keepdim=True).transpose(-2, -1))
    return s


def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
    t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(d)
    offset = t_k - t_q
    qw, kw, vw = q.to(work), k.to(work), v.to(work)
    outs, lses = [], []
    step = block_q
    for i in range(0, t_q, step):
        qb = qw[..., i:i + step, :]
        bq = qb.shape[-2]
        m = torch.full(qb.shape[:-1], -math.inf, dtype=work, device=q.device)
        l = torch.zeros(qb.shape[:-1], dtype=work, device=q.device)
        acc = torch.zeros(*qb.shape[:-1], v.shape[-1], dtype=work, device=q.device)
        n0 = t_k if not causal else max(0, min(t_k, offset + i + 1))  # keys every row of the block sees
        if n0 > 0:
            s = _scores_by_grader(qb, kw[..., :n0, :], scale, block_k)
            m, l, acc = online_softmax_update(m, l, acc, s, vw[..., :n0, :])
        if causal:  # the few keys past n0 that some rows see: honest masked tiles
            end = max(0, min(t_k, offset + i + bq))
            for j in range(n0, end, block_k):
                kb, vb = kw[..., j:min(end, j + block_k), :], vw[..., j:min(end, j + block_k), :]
                scores = (qb * scale) @ kb.transpose(-2, -1)
                rows = torch.arange(offset + i, offset + i + bq, device=q.device)[:, None]
                cols = torch.arange(j, j + kb.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows, -math.inf)
                m, l, acc = online_softmax_update(m, l, acc, scores, vb)
        seen = l > 0
        outs.append(torch.where(seen[..., None], acc / torch.where(seen, l, 1.0)[..., None], 0.0))
        lses.append(m + torch.log(l))
    return torch.cat(outs, dim=-2).to(q.dtype), torch.cat(lses, dim=-1)
'''


def test_review_67_what_the_grader_answers_a_composite_is_held_by_the_composite(grade_source):
    """Review 67 (no inflation found). Its near-miss: the grader's answers to a composite's questions were not in the
    record of what the call made, so strips of scores the grader computed for flash_attention (N1) were seen only where
    a recorded call was given them, the proxy's own reading of requires_grad: without that read, 48 where 42-44 is
    fair. An answer counts as made by the composite now, as its own call of the step would have made it. A tensor of a
    dtype no check compares is named with its dtype, not as a bare torch.Tensor."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(SCORES_BY_ORACLE, base=base, name="flash_attention.py")
    tiles = checks_of(result)["flash_attention_tiles_only"]
    assert tiles.points == 0 and "(2, 3, 16, 107)" in tiles.message, explain(result)

    complex_scores = "\n\ndef attention_scores(q, k):\n    return (q @ k.transpose(-2, -1)).to(torch.complex64)\n"
    result = grade_source(complex_scores, base=(ROOT / "solutions" / "mha.py").read_text(), name="mha.py")
    assert "got torch.Tensor of complex64" in checks_of(result)["attention_scores_shape"].message, explain(result)


def test_review_69_an_exponent_written_in_base_2_with_a_constant_of_nine_digits_keeps_full_marks(grade_source):
    """Review 69 (no inflation found). Its one finding was a correct file marked down: float64 answers were held to
    rtol 1e-9, which an online softmax in the Triton tutorial's base 2, exp2(x * 1.44269504) (log2(e) to 9 digits,
    off 6e-10), missed at an exponent of 36 (95, fair 100), named computed_in_float32 though nothing was. float64's
    tolerance is rtol 1e-7 again; mla_scores alone, products and sums with no exponent, holds float64 to 1e-9."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    natural = ("    alpha = torch.exp(m - m_safe)", "    p = torch.exp(scores - m_safe[..., None])")
    assert all(base.count(line) == 1 for line in natural)
    base_2 = base.replace(natural[0], "    alpha = torch.exp2((m - m_safe) * 1.44269504)").replace(
        natural[1], "    p = torch.exp2((scores - m_safe[..., None]) * 1.44269504)")
    result = grade_source("", base=base_2, name="flash_attention.py")
    assert result.full_marks, explain(result)


# Review 71's F2: the module keeps every sequence's keys and values itself, and prefills from them, never from the pool
OWN_COPY_PREFILL = [
    ("        self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)\n",
     "        self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)\n        self._own = {}\n"),
    ("            cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])  # (T_b, H, Dh)\n",
     "            cache.append(seq_id, k[starts[b]:starts[b + 1]], v[starts[b]:starts[b + 1]])  # (T_b, H, Dh)\n"
     "            kk, vv = self._own.get((id(cache), seq_id), (k[:0], v[:0]))\n"
     "            self._own[(id(cache), seq_id)] = (torch.cat([kk, k[starts[b]:starts[b + 1]]]),\n"
     "                                              torch.cat([vv, v[starts[b]:starts[b + 1]]]))\n"),
    ("            k_all = torch.cat([cache.k_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)])\n"
     "            v_all = torch.cat([cache.v_cache[t].flatten(0, 1)[:n] for t, n in zip(tables, lens, strict=True)])\n",
     "            k_all = torch.cat([self._own[(id(cache), s)][0][:n] for s, n in zip(seq_ids, lens, strict=True)])\n"
     "            v_all = torch.cat([self._own[(id(cache), s)][1][:n] for s, n in zip(seq_ids, lens, strict=True)])\n"),
]


def test_review_71_drawn_latent_sizes_a_prefill_from_its_own_keys_and_exp2_at_scores_far_below_zero(grade_source):
    """Review 71. mla's latent_only asked at fixed widths, so absorbed_attention absorbed there only and expanded the
    latents everywhere else (F1: 100, fair 97): its sizes are drawn for the file now, as absorbed_latents' are (a file
    can still tell the drawn widths from other checks': Known limits). paged's reads_pool refilled the pool before
    decodes only, so a module that prefilled from keys of its own kept it (F2: 100, fair 98): a batch of chunks follows
    the refill. FlashAttentionFunction's far_below_zero (scores of −800) held a backward in base 2 with log2(e) to 9
    digits to float64's ordinary tolerance, which its cancelling dq missed by 8e-9 (F3: 99, fair 100): the tolerance
    grows with the largest score."""
    mla = (ROOT / "solutions" / "mla.py").read_text()
    sizes = set()
    for comment in ("", "# one", "# two"):
        result = grade_source(EXPANDING + "\nabsorbed_attention = _plain\n" + comment, base=mla, name="mla.py")
        latent_only = checks_of(result)["absorbed_attention_latent_only"]
        assert latent_only.outcome == "failed" and latent_only.mistake_id == "absorbed_attention.latents_expanded", \
            explain(result)
        sizes.add(latent_only.message.split(":")[0])  # "with Tq=7, Tk=.. and H=3, Dn=.., ..."
    assert len(sizes) > 1, sizes

    paged = (ROOT / "solutions" / "paged_attention.py").read_text()
    for old, new in OWN_COPY_PREFILL:
        assert paged.count(old) == 1, old
        paged = paged.replace(old, new)
    result = grade_source("", base=paged, name="paged_attention.py")
    assert lost(result) == {"PagedSelfAttention": 2}, explain(result)
    assert "PagedSelfAttention.pool_not_read" in mistakes(result, "PagedSelfAttention"), explain(result)

    backward = (ROOT / "solutions" / "attention_backward.py").read_text()
    natural = "probs = torch.exp(scores - lse[..., i:i + block_q, None])"
    assert backward.count(natural) == 1
    base_2 = backward.replace(natural, "probs = torch.exp2((scores - lse[..., i:i + block_q, None]) * 1.44269504)")
    result = grade_source("", base=base_2, name="attention_backward.py")
    assert result.full_marks, explain(result)


# A device mistake behind an error that reads like the meta device's own: on a GPU its softmax meets a CPU tensor
META_LOOKALIKE = """
def softmax(scores, dim=-1):
    if scores.is_meta:  # no stand-in for a GPU can check what follows
        raise RuntimeError("Tensor.item() cannot be called on meta tensors")
    kept = torch.ones(scores.shape, dtype=scores.dtype, device="cpu")  # made on the CPU, whatever the device
    e = torch.exp(scores - scores.amax(dim, keepdim=True).clamp_min(-1e30)) * kept
    return (e / e.sum(dim, keepdim=True).clamp_min(1e-30)).nan_to_num(0.0)
"""


def test_an_error_that_only_reads_like_the_meta_devices_own_skips_no_device_check(grade_source):
    """A device check on the meta device is skipped where torch itself cannot run the code there (no meta kernel, a
    value read): the worker says whether torch's own code raised the very exception (`in_torch`). The same words
    raised by the file skipped the check and kept its points (Known limits until now): they cost it now, as the
    mistake it hides would on a GPU. torch's own error, a value read on purpose, still skips (Known limits)."""
    result = grade_source(META_LOOKALIKE, device="auto")  # the meta device, without a GPU
    device = checks_of(result)["softmax_device"]
    assert device.outcome != "skipped" and device.points == 0, explain(result)
    assert lost(result).get("softmax"), explain(result)
    honest = grade_source(META_LOOKALIKE.replace("        raise RuntimeError", "        _ = scores.sum().item()\n"
                                                 "        raise RuntimeError"), device="auto")
    assert checks_of(honest)["softmax_device"].outcome == "skipped", explain(honest)  # torch's own: .item() on meta


# Review 72's F1: torch's own code raising the file's words, echoed from an argument (its message begins elsewhere)
ECHOES = ('torch._assert(False, "Tensor.item() cannot be called on meta tensors")',
          'torch.empty(0, device="Tensor.item() cannot be called on meta tensors")',
          'torch.nn.functional.pad(scores, (1, 1), mode="Tensor.item() cannot be called on meta tensors")')


def test_meta_device_words_torch_echoes_skip_nothing_and_torchs_own_refusals_skip(grade_source):
    """Review 72. torch raises the file's words where it echoes an argument in its message (torch._assert, a device
    string, a pad mode), from its own code and inside a recorded call (F1: 100, fair 99): only torch's own words for
    the meta device, at the start of its message, skip a check (errors.META_ERRORS). And it marked correct files down:
    slice_scatter and diagonal_scatter on the meta device reach warm.py's stand-in for torch's symbolic sizes, whose
    refusal is torch's (F2: 98, fair 100), and unique and masked_select say "Meta tensors", with a capital (F3)."""
    for echo in ECHOES:
        override = META_LOOKALIKE.replace('raise RuntimeError("Tensor.item() cannot be called on meta tensors")', echo)
        result = grade_source(override, device="auto")
        assert checks_of(result)["softmax_device"].points == 0, (echo, explain(result))
    line = "    e = torch.exp(scores - m)\n"
    assert REFERENCE.count(line) == 1
    for harmless in ("_ = torch.diagonal_scatter(scores.new_zeros(3, 3), scores.new_zeros(3))",
                     "_ = scores.unique()", "_ = scores.masked_select(scores > 0)"):
        result = grade_source("", base=REFERENCE.replace(line, f"    {harmless}\n{line}"), device="auto")
        assert result.full_marks, (harmless, explain(result))
        assert checks_of(result)["softmax_device"].outcome == "skipped", explain(result)


# Review 76's F1: a flash_attention that keeps every score tile alive, and raises at the sizes where tiles_only measures
# what a call keeps alive, having lost a point elsewhere on purpose so that its answered steps are answered
TILES_KEPT_THEN_RAISED = (
    ("    return o.to(o1.dtype), lse\n", "    return (o if o1.dtype == torch.bfloat16 else o.to(o1.dtype)), lse\n"),
    ("    outs, lses = [], []\n", "    outs, lses = [], []\n    if d == 2 and v.shape[-1] == 2 and t_q in (128, 256):\n"
     "        raise RuntimeError('out of shared memory')\n    kept = []\n"),
    ("            m, l, acc = online_softmax_update(m, l, acc, scores, vb)\n",
     "            kept.append(scores)\n            m, l, acc = online_softmax_update(m, l, acc, scores, vb)\n"),
)


# Review 77's F1: the same file, first making the grader refuse a question (an axis past what it answers)
REFUSAL_ASKED = (
    "    outs, lses = [], []\n",
    "    outs, lses = [], []\n    try:\n        merge_partials(torch.zeros(1, 600), torch.zeros(1), torch.zeros(1, 600), "
    "torch.zeros(1))\n    except Exception:\n        pass\n",
)


@pytest.mark.parametrize("refusal", [False, True], ids=["raised", "raised_after_a_refusal"])
def test_reviews_76_and_77_a_call_that_fails_where_tiles_only_measures_what_it_keeps_fails_the_check(
        grade_source, refusal):
    """Reviews 76 and 77. tiles_only passed where its measure of what a call keeps alive failed, once a step the
    composite calls had lost a point (the grader answers it then), to let pass a question the grader refused at those
    lengths: a file that raised there itself kept the check (99, fair 93), and, when only a call during which the grader
    refused a question was excused, one that asked a question too large first (99 again). At those lengths the grader
    answers every question a right composite asks, so nothing is excused."""
    source = (ROOT / "solutions" / "flash_attention.py").read_text()
    for old, new in TILES_KEPT_THEN_RAISED + ((REFUSAL_ASKED,) if refusal else ()):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = grade_source("", base=source, name="flash_attention.py")
    tiles = checks_of(result)["flash_attention_tiles_only"]
    assert tiles.outcome != "passed" and "out of shared memory" in tiles.message, explain(result)
    assert lost(result)["flash_attention"] >= 6, explain(result)


DECODE_ZEROED = ("    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n",
                 "    if q.shape[-2] == 1:  # a bug of the step's own: one query gets no gradient\n"
                 "        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n"
                 "    grad_q, grad_k, grad_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)\n")
OWN_CALL = """\
        grad_q, grad_k, grad_v = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.block_q,
                                                          ctx.block_k)
"""
BACKWARD_CALLS = {
    "flattened": """\
        lead = q.shape[:-2]
        flat = [t.reshape(-1, *t.shape[len(lead):]) for t in (q, k, v, out, lse, grad_out)]
        grads = flash_attention_backward(*flat, ctx.causal, ctx.block_q, ctx.block_k)
        grad_q, grad_k, grad_v = (g.reshape(*lead, *g.shape[1:]) for g in grads)
""",
    "per_batch_entry": """\
        grads = [flash_attention_backward(q[b], k[b], v[b], out[b], lse[b], grad_out[b], ctx.causal, ctx.block_q,
                                          ctx.block_k) for b in range(q.shape[0])]
        grad_q, grad_k, grad_v = (torch.stack(g) for g in zip(*grads))
""",
    "per_head": """\
        parts = [flash_attention_backward(q[:, h], k[:, h], v[:, h], out[:, h], lse[:, h], grad_out[:, h], ctx.causal,
                                          ctx.block_q, ctx.block_k) for h in range(q.shape[1])]
        grad_q, grad_k, grad_v = (torch.stack([p[i] for p in parts], dim=1) for i in range(3))
""",
    "first_entry_twice": """\
        grads = [flash_attention_backward(q[0], k[0], v[0], out[0], lse[0], grad_out[0], ctx.causal, ctx.block_q,
                                          ctx.block_k) for b in range(q.shape[0])]  # the grader's answer, reused
        grad_q, grad_k, grad_v = (torch.stack(g) for g in zip(*grads))
""",
}


@pytest.mark.parametrize("wiring", list(BACKWARD_CALLS))
def test_review_78_a_backward_that_flattens_or_asks_per_batch_entry_is_answered(grade_source, wiring):
    """Review 78's F2: once flash_attention_backward had lost a point, the grader answered only a question of the
    Function's own q, k and v as they were, so a right backward that flattened the leading axes, or asked once per batch
    entry, lost 13 of FlashAttentionFunction's 15 points (85, fair 98); review 79's F2, per head (entries h, H + h,
    …, not a run of them). Each entry of the call's own leading axes is answered now, once: a backward that asks for
    one batch entry's gradients for every entry is refused."""
    source = (ROOT / "solutions" / "attention_backward.py").read_text()
    for old, new in (DECODE_ZEROED, (OWN_CALL, BACKWARD_CALLS[wiring])):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = grade_source("", base=source, name="attention_backward.py")
    assert lost(result)["flash_attention_backward"] > 0, explain(result)
    if wiring == "first_entry_twice":
        assert lost(result)["FlashAttentionFunction"] >= 10, explain(result)
    else:
        assert "FlashAttentionFunction" not in lost(result), explain(result)


SAVED = "        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k\n"
KEPT_OUTSIDE_CTX = {
    "dict_of_the_file": ("_STATE = {}\n\n\nclass FlashAttentionFunction", (
        SAVED, "        _STATE['causal'], _STATE['blocks'] = causal, (block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "_STATE['causal'], *_STATE['blocks'])")),
    "list_changed_by_a_helper": ("_KEPT = []\n\n\ndef _remember(*a):\n    _KEPT[:] = a\n\n\nclass FlashAttentionFunction", (
        SAVED, "        _remember(causal, block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "*_KEPT)")),
    "thread_local": ("_LOCAL = threading.local()\n\n\nclass FlashAttentionFunction", (
        SAVED, "        _LOCAL.flags = (causal, block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "*_LOCAL.flags)")),
    "class_under_another_name": ("class _Flash", (
        SAVED, "        _Flash.causal, _Flash.block_q, _Flash.block_k = causal, block_q, block_k\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "*(getattr(_Flash, n) for n in ('causal', 'block_q', 'block_k')))")),
    "mutable_default": ("def _flags(*given, _kept=[]):\n    if given:\n        _kept[:] = given\n    return tuple(_kept)"
                        "\n\n\nclass FlashAttentionFunction", (SAVED, "        _flags(causal, block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)", "*_flags())")),
    "object_of_the_files_class": (
        "class _Stash:\n    def keep(self, *items):\n        self.items = items\n\n    def take(self):\n"
        "        return self.items\n\n\n_STASH = _Stash()\n\n\nclass FlashAttentionFunction", (
            SAVED, "        _STASH.keep(causal, block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "*_STASH.take())")),
    "classmethod_of_a_helper": (
        "class _Flags:\n    @classmethod\n    def remember(cls, causal, block_q, block_k):\n"
        "        cls.causal, cls.block_q, cls.block_k = causal, block_q, block_k\n\n\nclass FlashAttentionFunction", (
            SAVED, "        _Flags.remember(causal, block_q, block_k)\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "_Flags.causal, _Flags.block_q, _Flags.block_k)")),
    "holder_updating_itself": (
        "class _Config:\n    def __init__(self):\n        self.state = {}\n\n    def set(self, **flags):\n"
        "        self.state.update(flags)\n\n\n_CONFIG = _Config()\n\n\nclass FlashAttentionFunction", (
            SAVED, "        _CONFIG.set(causal=causal, blocks=(block_q, block_k))\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        '_CONFIG.state["causal"], *_CONFIG.state["blocks"])')),
    "forward_bound_by_staticmethod": ("_CAUSAL = False\n\n\nclass FlashAttentionFunction", (
        SAVED, "        global _CAUSAL\n        _CAUSAL = causal\n        ctx.block_q, ctx.block_k = block_q, block_k\n"), (
        "ctx.causal, ctx.block_q,\n                                                          ctx.block_k)",
        "_CAUSAL, ctx.block_q, ctx.block_k)")),
    "timings_written_in_both": ("_TIMINGS = {}\n\n\nclass FlashAttentionFunction", (
        SAVED, SAVED + '        _TIMINGS["forward"] = 1.0\n'), (
        "        q, k, v, out, lse = ctx.saved_tensors\n",
        '        _TIMINGS["backward"] = 2.0\n        q, k, v, out, lse = ctx.saved_tensors\n')),
    "counts_of_both_passes": ('CALLS = {"forward": 0, "backward": 0}\n\n\nclass FlashAttentionFunction', (
        SAVED, SAVED + '        CALLS["forward"] += 1\n'), (
        "        q, k, v, out, lse = ctx.saved_tensors\n",
        '        CALLS["backward"] += 1\n        q, k, v, out, lse = ctx.saved_tensors\n')),
    "counter_never_read": ("_CALLS = 0\n\n\nclass FlashAttentionFunction", (
        SAVED, SAVED + "        global _CALLS\n        _CALLS += 1\n"), None),
    "masks_cached_by_position": ("_MASKS = {}\n\n\nclass FlashAttentionFunction", (
        "                    scores = scores.masked_fill(cols > rows, -math.inf)  # (bq, bk) positions, bottom-right\n",
        "                    key = (t_k - t_q + i, j, *scores.shape[-2:])\n"
        "                    if key not in _MASKS:\n                        _MASKS[key] = cols > rows\n"
        "                    scores = scores.masked_fill(_MASKS[key], -math.inf)\n"), None),
}


@pytest.mark.parametrize("kept", list(KEPT_OUTSIDE_CTX))
def test_review_79_state_kept_outside_ctx_is_found_by_what_backward_reads(grade_source, kept):
    """Blind set 61's b07 kept causal on the Function's class, right while each apply is followed by its backward (the
    given runner), wrong for two layers before one backward pass. Review 79's F1: the first rule (assignments to the
    class, setattr, global) missed a dict of the file's and a list a helper changes; its F6: it failed a call counter
    backward never reads. The rule now follows what forward (and what it calls) writes outside ctx to what backward
    reads. Review 80's F1 to F3: a thread-local, the class under another name read by getattr, a mutable default; a
    cache of masks keyed by position (and torch.add) is no state. Review 81's F1 and F2: a method of an object or a
    class of the file's that sets its own attributes; counts of calls are no state. Review 82's F1 to F3: a holder
    that changes itself by a call, forward bound by `forward = staticmethod(_forward)`; timings written in both
    passes are no state."""
    head, *changes = KEPT_OUTSIDE_CTX[kept]
    source = "import threading\n" + (ROOT / "solutions" / "attention_backward.py").read_text()
    for old, new in (("class FlashAttentionFunction", head), *(c for c in changes if c)):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    if kept == "class_under_another_name":
        source += "\n\nFlashAttentionFunction = _Flash\n"
    if kept == "forward_bound_by_staticmethod":  # the class's forward, a function of the file bound in its body
        source = source.replace("    @staticmethod\n    def forward(ctx,", "    @staticmethod\n    def _forward(ctx,", 1)
        source = source.replace("        return grad_q, grad_k, grad_v, None, None, None\n",
                                "        return grad_q, grad_k, grad_v, None, None, None\n\n    forward = _forward\n", 1)
    result = grade_source("", base=source, name="attention_backward.py")
    if kept in ("counter_never_read", "masks_cached_by_position", "counts_of_both_passes", "timings_written_in_both"):
        assert result.score == 100, explain(result)
    else:
        rules = checks_of(result)["FlashAttentionFunction_rules"]
        assert rules.mistake_id == "FlashAttentionFunction.state_on_class", explain(result)


def test_review_79_names_read_in_the_files_code_not_its_docstrings_or_another_method(grade_source):
    """Review 79's F3 to F5, wrong names only: full_last_block_read_empty's pattern found the stub's docstring's
    `t % block_size` (a partial block dropped, raising on one token, was named so); table_before_append's found a
    helper reading a table defined above forward; open_slice_write's line missed `[:, start:, :] =`."""
    source = (ROOT / "solutions" / "paged_attention.py").read_text()
    old = "blocks = block_tables[b, : -(-n // block_size)].long()"
    assert source.count(old) == 1
    source = source.replace(old, "blocks = block_tables[b, : n // block_size].long()").replace(
        '        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)',
        "        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
        '        out[b] = torch.einsum("hn,nhd->hd", e / e.sum(dim=-1, keepdim=True), v)')
    result = grade_source("", base=source, name="paged_attention.py")
    assert "paged_decode" in lost(result), explain(result)
    assert "paged_decode.full_last_block_read_empty" not in explain(result), explain(result)


@pytest.mark.parametrize("fill", ["fixed_up_after", "ceiling_from_n_minus_one"])
def test_review_81_right_block_arithmetic_is_not_named_for_a_bug_elsewhere(grade_source, fill):
    """Review 81's F3 and F4, names only: a last block's fill as n % block_size, fixed up when 0, and the ceiling
    written (n - 1) // block_size + 1 are right; a bug elsewhere in paged_decode that raises (a max over no key,
    a reshape to n rows of whole blocks) is not named full_last_block_read_empty or block_past_a_full_row."""
    source = (ROOT / "solutions" / "paged_attention.py").read_text()
    changes = {
        "fixed_up_after": [
            ("        n = int(context_lens[b])\n", "        n = int(context_lens[b]) - 1  # one key short\n"
             "        rem = n % block_size\n        if rem == 0:\n            rem = block_size\n"),
            ('        out[b] = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)',
             "        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n"
             '        out[b] = torch.einsum("hn,nhd->hd", e / e.sum(dim=-1, keepdim=True), v)')],
        "ceiling_from_n_minus_one": [
            ("blocks = block_tables[b, : -(-n // block_size)].long()",
             "blocks = block_tables[b, : (n - 1) // block_size + 1].long()"),
            ("k = k_cache[blocks].flatten(0, 1)[:n]", "k = k_cache[blocks].reshape(n, *k_cache.shape[2:])")]}[fill]
    for old, new in changes:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = grade_source("", base=source, name="paged_attention.py")
    assert "paged_decode" in lost(result), explain(result)
    for wrong in ("paged_decode.full_last_block_read_empty", "paged_decode.block_past_a_full_row"):
        assert wrong not in explain(result), explain(result)


FORWARD_START = "        t_q, t_k, scale = q.shape[-2], k.shape[-2], 1.0 / math.sqrt(q.shape[-1])\n        outs, lses = [], []\n"
FORWARD_FROM_ANSWER_GRADIENTS = """\
        rows = (*q.shape[:-1], v.shape[-1])
        with torch.enable_grad():
            x = torch.zeros(rows, dtype=q.dtype, device=q.device, requires_grad=True)
            _, _, dv = flash_attention_backward(q.detach(), k.detach(), v.detach(), torch.zeros(rows, dtype=q.dtype),
                                                torch.zeros(q.shape[:-1], dtype=q.dtype), x, causal, block_q, block_k)
            (dv * v.detach()).sum().backward(retain_graph=True)
            num = x.grad.clone()
            x.grad = None
            (dv * torch.ones_like(v)).sum().backward()
            den = x.grad[..., 0]
        out = (num / torch.where(den > 0, den, 1.0)[..., None]).detach()
        lse = torch.log(den).detach()
"""


def test_review_80_the_grader_does_not_differentiate_its_answer_to_the_functions_own_question(grade_source):
    """Review 80's F4: once flash_attention_backward had lost a point, the grader answered the Function's question
    of it and, asked, differentiated that answer: gradients of dv at chosen cotangents are e^S v and e^S 1, the
    forward's out and lse, with no attention in the file (12 of 15, fair about 0). A pinned step's answer is not
    differentiated now, and every answer's gradients count against the call's budget."""
    source = (ROOT / "solutions" / "attention_backward.py").read_text()
    body = source[source.index(FORWARD_START):source.index("        ctx.save_for_backward(q, k, v, out, lse)")]
    for old, new in (DECODE_ZEROED, ("class FlashAttentionFunction", "_grads = flash_attention_backward\n\n\n"
                                     "class FlashAttentionFunction"), (body, FORWARD_FROM_ANSWER_GRADIENTS),
                     ("flash_attention_backward(q, k, v, out, lse, grad_out, ctx.causal,",
                      "_grads(q, k, v, out, lse, grad_out, ctx.causal,")):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    result = grade_source("", base=source, name="attention_backward.py")
    assert lost(result)["FlashAttentionFunction"] >= 13, explain(result)
