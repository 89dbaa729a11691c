"""watch: "regrading…" at once, the edited step in detail, keys, wrapping, the next exercise.

watch runs in this process with a scripted `read_key`: each call is the next thing the person
does (a key, or a save), so nothing here sleeps or waits on a clock. A save sets a new
modification time explicitly, so watch sees it whatever the file system's timestamp granularity.
"""

import os
import pty
import termios

import pytest

from grader import watch as watch_module
from grader import workspace
from grader.exercise import load_course
from grader.progress import Progress
from grader.watch import terminal_keys, watch
from tests.conftest import REFERENCE, STUB, save, script, written

NAIVE_SOFTMAX = "    return scores.exp() / scores.exp().sum(dim, keepdim=True)"  # overflows: a real failure


def screens(output: str) -> list[str]:
    """The output cut at each "grading…"/"regrading…" line: what each save showed, keys' output included."""
    parts, current = [], None
    for line in output.splitlines():
        if line.startswith(("grading ", "regrading ")):
            current = []
            parts.append(current)
        if current is not None:
            current.append(line)
    return ["\n".join(part) for part in parts]


def test_a_save_shows_regrading_before_the_grade_runs(tmp_path, zygote, monkeypatch, capsys):
    path = tmp_path / "mha.py"
    path.write_text(STUB)
    on_screen = []
    grade = watch_module.grade

    def spy(*args, **kwargs):
        on_screen.append(capsys.readouterr().out.splitlines()[-1])  # the last line shown when the grade starts
        return grade(*args, **kwargs)

    monkeypatch.setattr(watch_module, "grade", spy)
    watch(path, {"device": "cpu"}, read_key=script(lambda: save(path, REFERENCE)), zygote=zygote)
    assert on_screen == ["grading mha.py…", "regrading mha.py…"]


def test_a_file_replaced_with_the_same_size_and_modification_time_is_regraded(tmp_path, zygote, monkeypatch):
    """A save is a change of content: an editor (or a candidate) that keeps size and mtime still gets a regrade."""
    path = tmp_path / "mha.py"
    inverted = REFERENCE.replace("scores.masked_fill(~mask,", "scores.masked_fill( mask,")
    assert len(inverted) == len(REFERENCE) and inverted != REFERENCE
    path.write_text(inverted)
    scores = []
    grade = watch_module.grade

    def spy(*args, **kwargs):
        result = grade(*args, **kwargs)
        scores.append(result.score)
        return result

    def replace_keeping_the_stamp():
        before = path.stat()
        path.write_text(REFERENCE)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    monkeypatch.setattr(watch_module, "grade", spy)
    watch(path, {"device": "cpu"}, read_key=script(replace_keeping_the_stamp), zygote=zygote)
    assert len(scores) == 2 and scores[0] < 100 == scores[1], scores

def test_the_detail_is_the_edited_step_else_a_real_failure_and_unwritten_steps_last(tmp_path, zygote, capsys):
    path = tmp_path / "mha.py"
    path.write_text(written(STUB, softmax=NAIVE_SOFTMAX))  # project, first in the table, is not written yet
    no_transpose = "    return x.reshape(x.shape[0], num_heads, x.shape[1], -1)"
    wrong_split = written(STUB, softmax=NAIVE_SOFTMAX, split_heads=no_transpose)
    right_softmax = REFERENCE[REFERENCE.index("    # Subtract the max"):REFERENCE.index("\n\n\ndef weighted_sum")]
    fixed_softmax = wrong_split.replace(NAIVE_SOFTMAX, right_softmax)
    edits = [lambda: save(path, wrong_split), lambda: save(path, fixed_softmax)]
    watch(path, {"device": "cpu"}, read_key=script(*edits), zygote=zygote)
    first, second, third = screens(capsys.readouterr().out)
    assert "▸ softmax 10/14 (first failing step)" in first and "likely mistake: not numerically stable" in first
    assert "▸ split_heads 2/10 (just edited)" in second, second
    assert "✓ softmax: every check passes now." in third and "▸ split_heads 2/10 (first failing step)" in third, third
    assert "▸ project" not in first + second + third


def test_keys_show_every_failed_check_the_next_hint_recorded_and_quit(tmp_path, zygote, capsys):
    workspace.init(tmp_path, [load_course()["mha"]])
    path = tmp_path / "mha.py"
    save(path, written(STUB, softmax=NAIVE_SOFTMAX))
    watch(path, {"device": "cpu"}, read_key=script("d", "h", "h", "q", "h"), zygote=zygote)
    out = capsys.readouterr().out
    screen, keys = out.split("d: every failed check · h: next hint · q: quit\n", 1)
    assert "softmax_large_logits" in screen and "softmax_all_masked_rows" not in screen and "1 more: press d" in screen
    assert "softmax_all_masked_rows" in keys and "a slice that is all -inf gives NaN" in keys
    assert "mha/softmax, hint 1 of 3" in keys and "mha/softmax, hint 2 of 3" in keys
    assert keys.rstrip().endswith("Stopped watching.")
    assert [(h["step"], h["level"]) for h in Progress.find(tmp_path).hints("mha")] == [("softmax", 1), ("softmax", 2)]


def test_long_messages_wrap_at_word_boundaries_to_the_terminal_width(tmp_path, zygote, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "40")
    path = tmp_path / "mha.py"
    long_error = "    raise ValueError('the scores ' * 12 + 'overflowed at 123456.789 for sure')"
    path.write_text(written(STUB, softmax=long_error))
    watch(path, {"device": "cpu"}, read_key=script("d", "h"), zygote=zygote)
    out = capsys.readouterr().out
    detail = [line for line in out[out.index("▸ softmax"):].splitlines() if not line.startswith("Total:")]
    assert len(detail) > 6 and all(len(line) <= 40 or " " not in line.strip() for line in detail), "\n".join(detail)
    assert any("123456.789" in line for line in detail), "\n".join(detail)  # a number is never cut


def test_full_marks_suggest_the_next_exercise_not_done_in_the_workspace(tmp_path, zygote, capsys):
    exercises = load_course()
    workspace.init(tmp_path, list(exercises.values()))
    progress = Progress.find(tmp_path)
    for step in exercises["self_attention"].steps:  # the next in the course is done already
        done = {"best": step.points, "max": step.points, "first_green": None}
        progress.exercise("self_attention")["steps"][step.id] = done
    progress.save()
    path = tmp_path / "mha.py"
    save(path, REFERENCE)
    watch(path, {"device": "cpu"}, rounds=1, zygote=zygote)
    out = capsys.readouterr().out
    assert "Full marks! Next: mha_numpy" in out and f"attn-grade watch {tmp_path / 'mha_numpy.py'}" in out, out


def test_terminal_keys_come_without_enter_and_the_terminal_is_restored_after_ctrl_c():
    master, slave = pty.openpty()
    with os.fdopen(slave, "rb", buffering=0) as terminal:
        before = termios.tcgetattr(slave)
        with pytest.raises(KeyboardInterrupt):
            with terminal_keys(terminal) as read:
                assert read is not None and not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO)
                os.write(master, b"h")
                assert read(30) == "h"  # returns as soon as the key is there: no Enter
                assert read(0) == ""
                raise KeyboardInterrupt  # Ctrl-C while watching
        assert termios.tcgetattr(slave) == before
    os.close(master)


def test_off_a_terminal_there_are_no_keys(tmp_path):
    with open(tmp_path / "input", "w+") as not_a_terminal, terminal_keys(not_a_terminal) as read:
        assert read is None
