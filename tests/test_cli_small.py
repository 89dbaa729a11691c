"""Small things of the command line (issue 18): Ctrl-C exits 130, --version, init --force keeps backups,
torch's multi-line errors read as one line in every report."""

import glob
import importlib.metadata
import json
import os
import platform
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader import cli, report
from grader.errors import printable
from grader.grade import kit_version
from tests.conftest import REFERENCE, ROOT

SLOW_SOFTMAX = '''

def softmax(scores, dim=-1):
    import os
    import time
    open("slow-step-started", "w").close()  # in the worker's own folder, under the grader's TMPDIR
    while not os.path.exists("release"):  # the test never writes it: only Ctrl-C ends this call
        time.sleep(0.01)
    return scores.softmax(dim)
'''
INTERRUPTED = "attn-grade: interrupted (Ctrl-C); run the command again to finish it."


def invoke(*args, input=None):
    result = CliRunner().invoke(cli.main, [str(a) for a in args], input=input)
    print(result.output)
    return result


def attn_grade(*args, **popen):
    command = shutil.which("attn-grade")
    assert command, "attn-grade is not on PATH: install the project with pip install -e ."
    return subprocess.Popen([command, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **popen)


def wait_for(found, process, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not found():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"never saw {what} (exit {process.returncode}):\n{out}\n{err}")
        time.sleep(0.01)


def _seen_in_a_worker(folder, pattern: str) -> bool:
    """A file a worker wrote in its working folder: a tmpfs of its own (grader/sandbox/isolation.py), seen from
    outside through the worker's root in /proc; in the portable sandbox, the folder itself."""
    if list(folder.glob(pattern)):
        return True
    for root in glob.glob("/proc/[0-9]*/root"):
        try:
            if list(Path(root + str(folder)).glob(pattern)):
                return True
        except OSError:
            pass
    return False


# -- Ctrl-C -----------------------------------------------------------------------------


@pytest.mark.parametrize("to", ["the command", "its process group"])
def test_a_grade_interrupted_by_ctrl_c_exits_130_with_one_line_and_no_traceback(tmp_path, to):
    """A terminal's Ctrl-C reaches the whole foreground process group, workers included; kill -INT the command."""
    path, temp = tmp_path / "mha.py", tmp_path / "temp"
    path.write_text(REFERENCE + SLOW_SOFTMAX)
    temp.mkdir()
    grading = attn_grade(path, "--device", "cpu", "--timeout", "120", env={**os.environ, "TMPDIR": str(temp)})
    try:
        wait_for(lambda: _seen_in_a_worker(temp, "attn-grade-worker-*/slow-step-started"), grading,
                 "the slow step start")
        (os.kill if to == "the command" else os.killpg)(grading.pid, signal.SIGINT)
        out, err = grading.communicate(timeout=60)
    finally:
        grading.kill()
    assert grading.returncode == 130, (out, err)
    assert err.strip() == INTERRUPTED and "Traceback" not in out + err, (out, err)
    assert "Total:" not in out
    assert not list(temp.iterdir())  # the workers and their folders are gone


def test_ctrl_c_at_a_prompt_exits_130_and_declining_still_exits_1(tmp_path):
    asking = attn_grade("solution", "mha", "softmax", "--workspace", tmp_path, stdin=subprocess.PIPE)
    said = []

    def asked() -> bool:
        if select.select([asking.stderr], [], [], 0.05)[0]:
            said.append(os.read(asking.stderr.fileno(), 4096).decode())
        return "Trying first teaches more" in "".join(said)

    try:
        wait_for(asked, asking, "the prompt")
        asking.send_signal(signal.SIGINT)
        out, err = asking.communicate(timeout=30)
    finally:
        asking.kill()
    err = "".join(said) + err
    assert asking.returncode == 130, (out, err)
    assert err.rstrip().endswith("\n" + INTERRUPTED) and "Traceback" not in out + err, err
    assert "def softmax" not in out  # not shown
    declined = invoke("solution", "mha", "softmax", "--workspace", tmp_path, input="n\n")
    assert declined.exit_code == 1 and "Aborted." in declined.stderr


# -- --version --------------------------------------------------------------------------


def test_version_names_the_kit_torch_and_python():
    result = invoke("--version")
    torch = importlib.metadata.version("torch")
    assert result.exit_code == 0
    assert result.stdout == f"attn-grade {kit_version()} (torch {torch}, Python {platform.python_version()})\n"


def test_version_does_not_import_torch():
    code = "import sys; from grader.cli import main; main(['--version']); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines() == [cli.version_line(), "False"], done


@pytest.mark.parametrize("module", ["grader", "grader.cli"])
def test_python_dash_m_runs_the_command(module):
    """Review 50's F8: `python -m grader.cli` did nothing and exited 0, which the command's contract reads as full
    marks."""
    done = subprocess.run([sys.executable, "-m", module, "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout == cli.version_line() + "\n", done
    done = subprocess.run([sys.executable, "-m", module, "grade", "no-such-file.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("attn-grade:"), done


# -- init --force -----------------------------------------------------------------------


def test_init_force_keeps_a_backup_of_every_file_with_work_and_says_where(tmp_path):
    assert invoke("init", tmp_path).exit_code == 0
    fresh = {name: (tmp_path / name).read_text() for name in ("mha.py", "masks.py", "gqa.py")}
    (tmp_path / "mha.py").write_text(fresh["mha.py"] + "# my mha\n")
    (tmp_path / "masks.py").write_text("# my masks\n")
    refused = invoke("init", tmp_path)
    assert refused.exit_code == 2 and "backup" in refused.stderr
    forced = invoke("init", tmp_path, "--force")
    assert forced.exit_code == 0
    for name, work in [("mha.py", fresh["mha.py"] + "# my mha\n"), ("masks.py", "# my masks\n")]:
        [backup] = tmp_path.glob(f"{name}.bak-*")
        assert re.fullmatch(rf"{re.escape(name)}\.bak-\d{{8}}-\d{{6}}", backup.name)
        assert backup.read_text() == work and (tmp_path / name).read_text() == fresh[name]
        assert f"wrote {tmp_path / name}; your version is in {backup}\n" in forced.stdout
    assert not list(tmp_path.glob("gqa.py.bak-*"))  # a fresh stub holds no work: nothing to keep
    assert f"wrote {tmp_path / 'gqa.py'}\n" in forced.stdout
    (tmp_path / "mha.py").write_text("# my second mha\n")  # again, within the same second: a backup of its own
    assert invoke("init", tmp_path, "--exercise", "mha", "--force").exit_code == 0
    backups = sorted(tmp_path.glob("mha.py.bak-*"))
    assert len(backups) == 2 and {b.read_text() for b in backups} == {fresh["mha.py"] + "# my mha\n",
                                                                       "# my second mha\n"}


def test_a_file_that_is_no_text_or_no_file_is_a_usage_error_not_a_grader_bug(tmp_path):
    """Review 48's B3: reset --step of a Latin-1 file, and init where mha.py is a folder, exited 3 with a
    traceback that called the user's input a bug in attn-grade."""
    latin = tmp_path / "mha.py"
    latin.write_bytes(b"def project(x, w, b):\n    return x  # caf\xe9\n")
    reset = invoke("reset", latin, "--step", "project", "--yes")
    assert reset.exit_code == 2 and "is not UTF-8 text" in reset.stderr and "Traceback" not in reset.output
    assert latin.read_bytes().endswith(b"caf\xe9\n") and not list(tmp_path.glob("mha.py.bak-*"))  # untouched
    (tmp_path / "ws" / "mha.py").mkdir(parents=True)
    init = invoke("init", tmp_path / "ws", "--exercise", "mha")
    assert init.exit_code == 2 and "is not a plain file" in init.stderr and len(init.stderr.splitlines()) == 1



def test_a_python_without_torch_is_told_to_install_it_not_a_grader_bug(tmp_path):
    """`python -m grader` in a checkout, from a Python where the kit is not installed, exited 3 with a traceback."""
    without_torch = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(f\"No module named '{name}'\", name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "sys.argv = ['attn-grade', 'grade', sys.argv[1]]\n"
        "from grader.cli import entry\n"
        "entry()\n")
    done = subprocess.run([sys.executable, "-c", without_torch, str(ROOT / "solutions" / "mha.py")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "torch is not installed in this Python" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1

# -- torch's multi-line errors -------------------------------------------------------------


def test_a_multi_line_torch_error_reads_as_one_line_in_every_report(grade_source):
    """A module whose w_o is the wrong shape: torch says "Error(s) in loading state_dict ...:\\n\\tsize mismatch"."""
    wrong = "self.w_o = nn.Linear(embed_dim, 2 * embed_dim, bias=bias)"
    base = REFERENCE.replace("self.w_o = nn.Linear(embed_dim, embed_dim, bias=bias)", wrong)
    assert wrong in base
    result = grade_source(base=base)
    step = next(s for s in result.steps if s.id == "MultiHeadAttention")
    said = [c.message for c in step.checks if "state_dict" in c.message]
    assert said, [c.message for c in step.checks]
    mismatch = "for MultiHeadAttention: size mismatch for w_o.weight: copying a param with shape torch.Size([12, 12])"
    assert all(mismatch in m and "\\" not in m for m in said), said
    assert any(". / size mismatch for w_o.bias: " in m for m in said), said  # bias=True: two lines, one line here
    for fmt in report.FORMATS:
        text = report.render(fmt, result)
        if fmt in ("json", "gradescope", "github"):
            text = "\n".join(_strings(json.loads(text)))
        assert "size mismatch for w_o.bias" in text, fmt
        assert "\\n" not in text and "\\t" not in text, fmt


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def test_printable_joins_lines_but_still_escapes_other_control_characters():
    assert printable("expected one of:\n * (Tensor input)\n\n * (Tensor input, int dim)\n") == (
        "expected one of: * (Tensor input) / * (Tensor input, int dim)"
    )
    assert printable("a\r\nb\tc") == "a / b c"
    assert printable("\x1b[31mred\x00") == "\\x1b[31mred\\x00"  # no recolouring of the grader's terminal
    assert len(printable("x" * 10_000)) == 600 and printable(None) == ""
