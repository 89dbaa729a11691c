"""The portable sandbox, as on macOS (forced here with ATTN_GRADE_SANDBOX=portable), and where there is none.

The portable sandbox runs the worker in its own processes (the zygote and its forked children) with
rlimits, a session and an empty folder of their own, and nothing Linux-only: no namespaces, prctl,
seccomp or cgroups. A grade there is the same grade, and its report says the file system was not
isolated. On Windows without WSL every grading command says so in one line, exit 2.
"""

import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from grader import cli, pool, report
from grader import watch as watch_module
from grader.grade import grade
from grader.pool import SANDBOX_ENV, Zygote, cannot_grade_here, portable_sandbox
from grader.sandbox import isolation
from grader.watch import enter_note, terminal_keys, watch
from tests.conftest import REFERENCE, ROOT, STUB, explain, lost, mistakes, save, script
from tests.exercises.mha.variants import BUGGY


def _portable(processes: bool = False) -> Zygote:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SANDBOX_ENV, "portable")
        return Zygote(processes=processes)


@pytest.fixture(scope="module")
def portable_zygote():
    """A zygote made as the variable asks: every child in the portable sandbox."""
    with _portable() as zygote:
        yield zygote


def test_a_process_started_in_a_step_is_refused_by_the_guard_where_there_is_no_filter(tmp_path, portable_zygote):
    """No seccomp filter here: the guard refuses the audit events that start a process (os.fork, subprocess)."""
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\n\nimport os\n_softmax = softmax\n\ndef softmax(scores, dim=-1):\n    os.fork()\n"
                    "    return _softmax(scores, dim)\n")
    result = grade(path, zygote=portable_zygote, device="cpu")
    assert set(lost(result)) == {"softmax", "MultiHeadAttention"}, explain(result)
    said = [c.message for s in result.steps if s.id == "softmax" for c in s.checks if c.points < c.max_points]
    assert said and all("refuses starting a process (os.fork)" in m for m in said), explain(result)


def test_the_variable_forces_the_portable_sandbox_on_linux_and_other_systems_always_have_it(monkeypatch):
    monkeypatch.setattr(pool.platform, "system", lambda: "Linux")
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    assert not portable_sandbox() and cannot_grade_here() is None
    monkeypatch.setenv(SANDBOX_ENV, "portable")
    assert portable_sandbox() and cannot_grade_here() is None
    monkeypatch.delenv(SANDBOX_ENV)
    monkeypatch.setattr(pool.platform, "system", lambda: "Darwin")
    assert portable_sandbox() and cannot_grade_here() is None


def test_the_reference_scores_100_and_the_report_says_the_file_system_was_not_isolated(tmp_path, portable_zygote):
    assert portable_zygote.portable
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE)
    result = grade(path, zygote=portable_zygote, device="cpu")
    assert result.full_marks, explain(result)
    assert result.environment["fs_isolation"] is False
    assert report.NO_FS_ISOLATION in report.to_text(result)


def test_a_buggy_file_loses_its_points_to_the_named_mistake(tmp_path, portable_zygote):
    variant = next(v for v in BUGGY if v.name == "project_no_bias")
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\n\n" + variant.code + "\n")
    result = grade(path, zygote=portable_zygote, device="cpu")
    assert "project" in lost(result) and not result.full_marks, explain(result)
    assert variant.mistake in mistakes(result, "project"), explain(result)


PROBE = """
import os, resource
def softmax(scores, dim=-1):
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    print("SECCOMP", status["Seccomp"].strip(), "NO_NEW_PRIVS", status["NoNewPrivs"].strip())
    print("NET", os.readlink("/proc/self/ns/net"), "PID", os.readlink("/proc/self/ns/pid"))
    print("FSIZE", resource.getrlimit(resource.RLIMIT_FSIZE)[0], "CORE", resource.getrlimit(resource.RLIMIT_CORE)[0],
          "DATA", resource.getrlimit(resource.RLIMIT_DATA)[0])
    print("SESSION", os.getsid(0) == os.getpid(), "FOLDER", [f for f in os.listdir(".") if f != "__pycache__"])
    m = scores.amax(dim, keepdim=True).detach()
    e = torch.exp(scores - m.masked_fill(m == float("-inf"), 0.0))
    return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/ns"), reason="reads Linux's /proc to see what the worker has")
def test_a_portable_worker_has_its_rlimits_and_session_but_no_namespace_or_seccomp(tmp_path, portable_zygote):
    path = tmp_path / "mha.py"
    path.write_text(REFERENCE + "\n\n" + PROBE)
    result = grade(path, zygote=portable_zygote, device="cpu", memory_limit_mb=1024)
    assert result.full_marks, explain(result)
    line = next(line for line in result.candidate_output.splitlines() if line.startswith("SECCOMP"))
    assert line == "SECCOMP 0 NO_NEW_PRIVS 0", result.candidate_output  # no prctl, no seccomp
    ours = f"NET {os.readlink('/proc/self/ns/net')} PID {os.readlink('/proc/self/ns/pid')}"
    assert ours in result.candidate_output  # the grader's own namespaces: none of its own
    limits = f"FSIZE {isolation.FILE_SIZE_LIMIT} CORE 0 DATA {1024 * 1024 * 1024}"
    assert limits in result.candidate_output and "SESSION True FOLDER ['mha.py']" in result.candidate_output


LEFT_BEHIND = """
import subprocess, sys
def project(x, weight, bias=None):
    sleep = "import time; time.sleep({})"
    subprocess.Popen([sys.executable, "-c", sleep.format(4251)])  # in the child's process group
    subprocess.Popen([sys.executable, "-c", sleep.format(4252)], process_group=0)  # a group of its own
    subprocess.Popen([sys.executable, "-c", sleep.format(4253)], start_new_session=True)  # a session of its own
    y = x @ weight.T
    return y if bias is None else y + bias

def softmax(scores, dim=-1):
    while True:
        pass
"""


def test_a_hang_is_killed_at_its_timeout_with_what_the_step_started(tmp_path):
    """Where a child may start processes (Triton's compilers, on CUDA), a hang's are ended with it."""
    path = tmp_path / "mha.py"
    mark = f"425{os.getpid()}"  # this run's own: another suite on the machine starts the same processes
    path.write_text(REFERENCE + "\n\n" + LEFT_BEHIND.replace("425", mark))
    start = time.monotonic()
    with _portable(processes=True) as zygote:
        result = grade(path, zygote=zygote, device="cpu", timeout=1.0)
    assert time.monotonic() - start < 60
    assert set(lost(result)) == {"softmax", "MultiHeadAttention"}, explain(result)
    assert any("timed out" in c.message for s in result.steps if s.id == "softmax" for c in s.checks), explain(result)

    def left() -> list[str]:
        shown = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        return [line for line in shown.splitlines() if f"sleep({mark}" in line]

    deadline = time.monotonic() + 30  # SIGKILL is sent: wait for the kernel to end them, however loaded
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left(), left()


def test_watch_starts_and_grades_in_the_portable_sandbox(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SANDBOX_ENV, "portable")
    made = []

    class Recorded(Zygote):
        def _start(self):
            made.append(self)
            super()._start()

    monkeypatch.setattr(watch_module, "Zygote", Recorded)
    path = tmp_path / "mha.py"
    path.write_text(STUB)
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, REFERENCE)))
    out = capsys.readouterr().out
    assert made and all(z.portable for z in made)
    assert "grading mha.py…" in out and "regrading mha.py…" in out and "Stopped watching." in out
    assert "100/100" in out, out


class FakeTerminal:
    """A terminal, as far as line_keys can tell: its lines are those given, then the end of input."""

    def __init__(self, *lines: str):
        self.lines = list(lines)

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        return self.lines.pop(0) if self.lines else ""


def test_without_termios_keys_come_a_line_at_a_time(monkeypatch):
    monkeypatch.setitem(sys.modules, "termios", None)  # as on Windows' Python: import termios fails
    with terminal_keys(FakeTerminal("d\n", "\n", "h\n")) as read:
        assert read is not None and enter_note(read) == " (then Enter)"
        assert [read(30), read(30), read(30), read(30)] == ["d", "", "h", "q"]  # Enter alone: nothing; the end: q
    with terminal_keys(open(os.devnull)) as read:
        assert read is None


def test_watch_imports_where_python_has_no_termios():
    code = "import sys; sys.modules['termios'] = sys.modules['tty'] = None; import grader.watch; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


GRADING = [["mha.py"], ["grade", "mha.py"], ["watch", "mha.py"], ["batch", "."],
           ["interview", "mha", "--minutes", "5", "--candidate", "Ada"]]


@pytest.mark.parametrize("system", ["Windows", "CYGWIN_NT-10.0"])
@pytest.mark.parametrize("args", GRADING, ids=lambda args: args[0])
def test_on_windows_every_grading_command_says_in_one_line_that_it_needs_wsl(monkeypatch, tmp_path, args, system):
    monkeypatch.setattr(pool.platform, "system", lambda: system)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2, result.output
    assert result.output.splitlines() == [f"attn-grade: {pool.WINDOWS_NEEDS_WSL}"]
    assert not list(tmp_path.iterdir())  # nothing was started or written


def test_on_windows_the_commands_that_run_no_code_still_work(monkeypatch):
    monkeypatch.setattr(pool.platform, "system", lambda: "Windows")
    result = CliRunner().invoke(cli.main, ["list"])
    assert result.exit_code == 0 and "mha" in result.output


def test_a_sandbox_variable_that_means_nothing_is_one_line_and_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv(SANDBOX_ENV, "potable")
    result = CliRunner().invoke(cli.main, ["grade", str(tmp_path / "mha.py")])
    assert result.exit_code == 2 and len(result.output.splitlines()) == 1
    assert "ATTN_GRADE_SANDBOX='potable'" in result.output and "portable" in result.output


def test_processes_are_counted_by_ps_where_there_is_no_proc():
    assert isolation._own_processes() >= 2  # at least this test and ps's parent's
