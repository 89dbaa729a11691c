"""attn-grade interview: a session with a countdown, everything recorded with its time, a scorecard.

The clock is injected: a test moves it forward itself, and the progress file's timestamps follow
it, so nothing here sleeps and the timeline's minutes are exact. `read_key` plays the interview:
each call is the next thing that happens (a key, a save, a command the candidate runs).
"""

import hashlib
import json
import os
import re
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from grader import cli, interview, progress, workspace
from grader.exercise import load_course
from grader.progress import Progress
from tests.conftest import REFERENCE, STUB, save, script, written

MASK_INVERTED = REFERENCE.replace("scores.masked_fill(~mask,", "scores.masked_fill(mask,")
SCALE_WRONG = "\ndef scale_scores(scores, head_dim):\n    return scores\n"
SOFTMAX_FORBIDDEN = "\ndef softmax(scores, dim=-1):\n    return torch.softmax(scores, dim)\n"
MASK_SPACED = REFERENCE.replace("scores.masked_fill(~mask,", "scores.masked_fill( mask,")  # inverted, same size


class Clock:
    """The wall clock of the session, moved by the test."""

    def __init__(self):
        self.now = float(int(datetime.now(timezone.utc).timestamp()))

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    stamp = lambda: datetime.fromtimestamp(clock.now, timezone.utc).isoformat(timespec="seconds")
    monkeypatch.setattr(progress, "now", stamp)
    return clock


def invoke(*args, input=None):
    result = CliRunner().invoke(cli.main, [str(a) for a in args], input=input)
    print(result.output)
    return result


def at(clock, seconds, action):
    """An action done at `seconds` after the start."""
    start = clock.now

    def run():
        clock.now = start + seconds
        return action()

    return run


def test_an_interview_records_grades_hints_and_solutions_and_writes_a_scorecard(tmp_path, zygote, clock):
    assert "scores.masked_fill(~mask," in REFERENCE
    folder = tmp_path / "iv"
    path = folder / "mha.py"
    actions = [
        at(clock, 60, lambda: save(path, MASK_INVERTED + SCALE_WRONG + SOFTMAX_FORBIDDEN)),
        at(clock, 120, lambda: "h"),  # the detail is scale_scores: the first step edited that lost points
        at(clock, 150, lambda: invoke("solution", "mha", "scale_scores", "--yes", "--workspace", folder)),
        at(clock, 200, lambda: save(path, MASK_INVERTED + SOFTMAX_FORBIDDEN)),
        at(clock, 601, lambda: None),  # ten minutes and a second
    ]
    start = clock.now
    md, page = interview.run(folder, "mha", 10, "Ada Lovelace", {"device": "cpu"}, clock=clock,
                             read_key=script(*actions), zygote=zygote)
    text = md.read_text()
    print(text)
    day = datetime.fromtimestamp(start, timezone.utc).strftime("%Y-%m-%d")
    assert "# Interview scorecard: Ada Lovelace" in text and f"- **Date**: {day}" in text
    planned = r"- \*\*Time\*\*: 10 min planned; started \d\d:\d\d UTC, time up at \d\d:\d\d UTC after 10:00"
    assert re.search(planned, text)
    # apply_mask lost 10, the module 2 end to end; softmax broke a rule
    assert "- **Final score**: 74/100" in text, text
    assert "- **Grades**: 3 (score over time: 0 → 67 → 74)" in text
    assert "- **Model answers seen**: scale_scores" in text
    assert f"- **SHA-256**: {hashlib.sha256(path.read_bytes()).hexdigest()}" in text
    assert "| ✓ scale_scores | 8/8 | +3:20 | 2 | levels 1 | seen at +2:30 |" in text
    assert "| ✓ project | 10/10 | +1:00 | 1 | – | – |" in text
    assert "| ✗ softmax | 0/14 | – | 1 | – | – |" in text
    assert re.search(r"- `apply_mask`: .*mask", text) and "`scale_scores`:" not in text.split("## Named mistakes")[1]
    assert re.search(r"## Rules broken\n\n- `softmax` earns nothing: .*softmax", text)
    for event in ["| +0:00 | started |", "| +1:00 | first green: project, split_heads",
                  "| +2:00 | hint, level 1, for scale_scores |", "| +2:30 | model answer seen: scale_scores |",
                  "| +3:20 | first green: scale_scores |", "| +10:00 | time up, 74/100 |"]:
        assert event in text
    timeline = text.split("## Timeline")[1]
    assert timeline.index("| +2:00 |") < timeline.index("| +2:30 |") < timeline.index("| +3:20 |")  # in order of time
    assert "## Notes" in text and "**Overall:**" in text
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "<style>" in html and "@media print" in html
    assert not re.search(r"<link|<script|src=|href=", html)  # one file: nothing to fetch
    for part in ["Ada Lovelace", "74/100", "+3:20", "seen at +2:30", "earns nothing", "Notes"]:
        assert part in html


def test_the_same_command_resumes_the_clock(tmp_path, clock):
    folder = tmp_path / "iv"
    first, resumed = interview.start(folder, "mha", 1, "Ada", clock)
    assert not resumed and (folder / "mha.py").read_text() == workspace.stub_text(load_course()["mha"])
    save(folder / "mha.py", written(STUB, softmax="    return scores"))
    clock.now += 30
    again, resumed = interview.start(folder, "mha", 1, "Ada", clock)
    assert resumed and again.started == first.started and again.deadline - clock() == 30
    assert (folder / "mha.py").read_text() != STUB  # the candidate's work is kept
    assert interview._left(again.deadline - clock()) == "0:30"


def test_stopped_with_ctrl_c_it_writes_the_scorecard_and_a_restart_resumes(tmp_path, zygote, clock, capsys):
    folder = tmp_path / "iv"

    def interrupt(timeout):
        clock.now += 90
        raise KeyboardInterrupt

    md, page = interview.run(folder, "mha", 5, "Ada <i>L</i>", {"device": "cpu"}, clock=clock, read_key=interrupt,
                             zygote=zygote)
    assert "stopped with Ctrl-C" in md.read_text() and "after 1:30" in md.read_text()
    assert "Stopped with Ctrl-C with 3:30 left; the same command resumes it." in capsys.readouterr().out
    steps = "project, split_heads, attention_scores, scale_scores, apply_mask, softmax, weighted_sum, merge_heads"
    assert f"- `{steps}, MultiHeadAttention`: not implemented yet\n" in md.read_text()  # the stub: one line, not nine
    assert "Ada &lt;i&gt;L&lt;/i&gt;" in page.read_text() and "<i>L</i>" not in page.read_text()
    clock.now += 600  # past the end: the same command writes the final scorecard at once
    md, _ = interview.run(folder, "mha", 5, "Ada <i>L</i>", {"device": "cpu"}, clock=clock, read_key=script(),
                          zygote=zygote)
    final = md.read_text()
    assert "time up" in final and "after 5:00" in final
    # no command watched the file at time up: the scorecard says when it graded it
    assert "- **Graded**: graded at " in final and "6:30 after time up (no interview command was running" in final
    assert "## After time" not in final
    clock.now += 60  # and once more: the final scorecard, the file unchanged since
    md, _ = interview.run(folder, "mha", 5, "Ada <i>L</i>", {"device": "cpu"}, clock=clock, read_key=script(),
                          zygote=zygote)
    again, after = split_after_time(md.read_text())
    assert again == final and "- **The file**: unchanged since time up" in after


def split_after_time(text: str, start="\n## After time (not part of the final score)\n", end="\n## Notes\n"):
    """(the scorecard without its after-time section, that section); the section must be there."""
    assert start in text, text
    section = text[text.index(start):text.index(end)]
    return text.replace(section, ""), section


def scorecard_line(text: str, label: str) -> str:
    return re.search(rf"^- \*\*{label}\*\*: (.*)$", text, re.M).group(1)


def test_a_final_scorecard_is_final_work_after_time_is_shown_apart(tmp_path, zygote, clock):
    clock.now -= 3600  # started an hour ago: the command run with the real clock below finds the time up
    folder = tmp_path / "iv"
    path = folder / "mha.py"
    actions = [at(clock, 60, lambda: save(path, MASK_INVERTED)), at(clock, 601, lambda: None)]
    md, page = interview.run(folder, "mha", 10, "Ada Lovelace", {"device": "cpu"}, clock=clock,
                             read_key=script(*actions), zygote=zygote)
    text, html = md.read_text(), page.read_text()
    score, sha = scorecard_line(text, "Final score"), hashlib.sha256(MASK_INVERTED.encode()).hexdigest()
    assert score != "100/100" and scorecard_line(text, "SHA-256") == sha
    timeline = text.split("## Timeline")[1].split("## Notes")[0]
    assert f"| +10:00 | time up, {score} |" in timeline and "apply_mask" not in timeline
    session = json.loads((folder / interview.SESSION_FILE).read_text())
    assert session["final"]["sha256"] == sha  # kept with the session, with the scorecard as written

    save(path, REFERENCE)  # the candidate fixes the mask 41 s after the end, and the command is run again
    clock.now += 40
    md, page = interview.run(folder, "mha", 10, "Ada Lovelace", {"device": "cpu"}, clock=clock, read_key=script(),
                             zygote=zygote)
    again, after = split_after_time(md.read_text())
    assert again == text  # the final score, the hash, the timeline: as they were at time up
    assert scorecard_line(after, "Score now") == f"100/100 (final score: {score})"
    new_sha = hashlib.sha256(REFERENCE.encode()).hexdigest()
    assert scorecard_line(after, "SHA-256 now") == f"{new_sha} (at time up: {sha})"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, 0:41 after time up", scorecard_line(after, "Graded at"))
    page_again = page.read_text()
    section = re.search(r'<section class="after">.*?</section>\n', page_again, re.S).group(0)
    assert page_again.replace(section, "") == html
    assert "After time (not part of the final score)" in section and "100/100" in section and new_sha in section

    # the command line, with more minutes: the interview does not reopen, the final scorecard stays
    result = invoke("interview", "mha", folder, "--minutes", "20", "--candidate", "Ada Lovelace", "--device", "cpu")
    assert result.exit_code == 0 and "its scorecard is final" in result.stdout, result.output
    assert split_after_time(md.read_text())[0] == text and "100/100" in split_after_time(md.read_text())[1]
    assert json.loads((folder / interview.SESSION_FILE).read_text()) == session


def test_a_save_seen_after_time_up_is_not_counted(tmp_path, zygote, clock):
    folder = tmp_path / "iv"
    path = folder / "mha.py"

    def late_save():  # while the last grade before the end ran
        path.write_text(REFERENCE)
        os.utime(path, (clock.now, clock.now))

    actions = [at(clock, 60, lambda: save(path, MASK_INVERTED)), at(clock, 605, late_save)]
    md, _ = interview.run(folder, "mha", 10, "Ada", {"device": "cpu"}, clock=clock, read_key=script(*actions),
                          zygote=zygote)
    text = md.read_text()
    assert scorecard_line(text, "Final score") != "100/100"
    assert scorecard_line(text, "SHA-256") == hashlib.sha256(MASK_INVERTED.encode()).hexdigest()
    assert re.fullmatch(r"a save at .* UTC, after time up, is not counted", scorecard_line(text, "Graded"))


def test_a_file_replaced_with_the_same_size_and_time_is_regraded(tmp_path, zygote, clock):
    folder = tmp_path / "iv"
    path = folder / "mha.py"
    assert len(MASK_SPACED) == len(REFERENCE) and MASK_SPACED != REFERENCE

    def replace_keeping_the_stamp():
        before = path.stat()
        path.write_text(REFERENCE)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = path.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)

    actions = [at(clock, 60, lambda: save(path, MASK_SPACED)), at(clock, 120, replace_keeping_the_stamp),
               at(clock, 601, lambda: None)]
    md, _ = interview.run(folder, "mha", 10, "Ada", {"device": "cpu"}, clock=clock, read_key=script(*actions),
                          zygote=zygote)
    text = md.read_text()
    assert scorecard_line(text, "Final score") == "100/100"
    assert re.fullmatch(r"3 \(score over time: 0 → \d+ → 100\)", scorecard_line(text, "Grades"))
    assert "| +2:00 | first green: apply_mask" in text


def test_a_damaged_final_scorecard_in_the_session_is_refused(tmp_path, clock):
    folder = tmp_path / "iv"
    interview.start(folder, "mha", 5, "Ada", clock)
    data = json.loads((folder / interview.SESSION_FILE).read_text())
    (folder / interview.SESSION_FILE).write_text(json.dumps({**data, "final": {"sha256": "0" * 64}}))
    with pytest.raises(interview.UsageError, match="no interview session attn-grade can read"):
        interview.start(folder, "mha", 5, "Ada", clock)


def test_a_session_file_nested_past_the_parsers_depth_is_refused_in_a_line(tmp_path, clock):
    """Review 51's F2: it raised RecursionError, exit 3."""
    folder = tmp_path / "iv"
    folder.mkdir()
    (folder / interview.SESSION_FILE).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(interview.UsageError, match="no interview session attn-grade can read"):
        interview.start(folder, "mha", 5, "Ada", clock)


def test_a_session_changed_by_hand_or_signed_by_another_account_is_refused(tmp_path, clock, monkeypatch):
    """Review 50's F5: the candidate wrote a final scorecard of 100/100 into the session file in their folder, and the
    interviewer's resume printed it, 29 minutes early. The session is signed with a key outside the folder."""
    folder = tmp_path / "iv"
    session, _ = interview.start(folder, "mha", 30, "Ada", clock)
    path = folder / interview.SESSION_FILE
    signed = json.loads(path.read_text())
    forged = {**signed, "final": {"sha256": "0" * 64, "scorecard": {}}}
    path.write_text(json.dumps(forged))
    with pytest.raises(interview.UsageError, match="changed outside attn-grade"):
        interview.start(folder, "mha", 30, "Ada", clock)
    path.write_text(json.dumps({**signed, "minutes": 300}))  # more time, given by hand
    with pytest.raises(interview.UsageError, match="changed outside attn-grade"):
        interview.start(folder, "mha", 30, "Ada", clock)
    path.write_text(json.dumps(signed))
    assert interview.start(folder, "mha", 30, "Ada", clock)[1]  # as attn-grade wrote it: resumed
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "another"))
    with pytest.raises(interview.UsageError, match="another account or machine"):
        interview.start(folder, "mha", 30, "Ada", clock)


def test_a_session_file_from_before_time_up_put_back_after_it_keeps_the_final_scorecard(tmp_path, zygote, clock):
    """Review 51's F3: every version of the session file is signed, so a copy made before time up, put back after it
    with the answer written and the file's time set back, reopened the interview and replaced the final 0/100 with
    100/100 "saved before time up". The final scorecard is kept beside the key too, and a file's time is its claim."""
    folder = tmp_path / "iv"
    interview.start(folder, "mha", 5, "Ada", clock)
    before_time_up = (folder / interview.SESSION_FILE).read_bytes()
    clock.now += 400  # past the end, no command running: the next one writes the final scorecard
    md, _ = interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(), zygote=zygote)
    final = md.read_text()
    assert scorecard_line(final, "Final score") == "0/100"
    assert "modification time is" in final and "whoever can write the folder can set" in final
    (folder / interview.SESSION_FILE).write_bytes(before_time_up)
    save(folder / "mha.py", REFERENCE)
    os.utime(folder / "mha.py", (clock.now - 600, clock.now - 600))
    md, _ = interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(), zygote=zygote)
    again, after = split_after_time(md.read_text())
    assert again == final and scorecard_line(after, "Score now") == "100/100 (final score: 0/100)"


def test_what_the_candidate_puts_in_the_way_of_the_final_scorecard_costs_it_nothing(tmp_path, zygote, clock):
    """Review 52's F2: a folder named scorecard.md, or one in place of the session file, made time up exit 3 with a
    traceback and no scorecard; a session file removed or replaced after time up reopened the interview with a fresh
    clock. What cannot be written is a usage error in a line, and the final scorecard kept beside the key stands."""
    folder = tmp_path / "iv"
    interview.start(folder, "mha", 5, "Ada", clock)
    (folder / "scorecard.md").mkdir()
    clock.now += 400
    with pytest.raises(interview.UsageError, match="cannot write .*scorecard.md.* run the same command again"):
        interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(), zygote=zygote)
    (folder / "scorecard.md").rmdir()
    for damage in (lambda path: (path.unlink(), path.mkdir()), lambda path: os.rmdir(path), lambda path: None):
        md, _ = interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(),
                              zygote=zygote)
        assert scorecard_line(md.read_text(), "Final score") == "0/100" and "## After time" in md.read_text()
        damage(folder / interview.SESSION_FILE)


def test_links_the_candidate_puts_in_the_folder_are_replaced_never_written_through(tmp_path, zygote, clock):
    """Review 53's F7: a link at scorecard.md (or at the progress file's temporary name) to a file outside the folder,
    the interviewer's key among them, was written through at time up: the key became the scorecard, and the next
    interview was refused. Every file the kit writes there is made anew and moved into place."""
    folder = tmp_path / "iv"
    interview.start(folder, "mha", 5, "Ada", clock)
    key = interview.key_path()
    before = key.read_bytes()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (folder / "scorecard.md").symlink_to(key)
    (folder / "scorecard.html").symlink_to(victim)
    (folder / ".attn-grade.tmp").symlink_to(victim)  # the name the progress file was once written through
    clock.now += 400
    md, _ = interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(), zygote=zygote)
    assert key.read_bytes() == before and victim.read_text() == "mine"
    assert not md.is_symlink() and scorecard_line(md.read_text(), "Final score") == "0/100"


def test_a_pipe_or_a_device_in_place_of_the_file_is_no_save(tmp_path, zygote, clock):
    """Review 53's F8: a FIFO put in place of the candidate's file during a live interview hung the watcher (it read
    the pipe to see whether the file changed) past time up, and a link to /dev/zero filled the grader's memory (exit
    3): only a regular file is read, at most so far, and what stands in its place is no save."""
    from grader.watch import Watcher

    folder = tmp_path / "iv"
    interview.start(folder, "mha", 5, "Ada", clock)
    watcher = Watcher(folder / "mha.py", {"device": "cpu"}, zygote)
    assert watcher.saved()
    (folder / "mha.py").unlink()
    os.mkfifo(folder / "mha.py")
    assert not watcher.saved()  # at once: a pipe with no writer is not waited on
    (folder / "mha.py").unlink()
    (folder / "mha.py").symlink_to("/dev/zero")
    assert not watcher.saved()
    clock.now += 400
    with pytest.raises(interview.UsageError, match="not a (regular )?file"):
        interview.run(folder, "mha", 5, "Ada", {"device": "cpu"}, clock=clock, read_key=script(), zygote=zygote)


def test_the_countdown_shows_under_each_screen(tmp_path, zygote, clock, capsys):
    folder = tmp_path / "iv"
    actions = [at(clock, 75, lambda: save(folder / "mha.py", REFERENCE)), at(clock, 200, lambda: None)]
    interview.run(folder, "mha", 3, "Ada", {"device": "cpu"}, clock=clock, read_key=script(*actions), zygote=zygote)
    out = capsys.readouterr().out
    assert "⏱ 3:00 left · d: every failed check · h: next hint · q: end the interview" in out
    assert "⏱ 1:45 left" in out and "Total: 100/100" in out


def test_a_short_interview_from_the_command_line(tmp_path):
    result = invoke("interview", "mha", tmp_path / "iv", "--minutes", "0.001", "--candidate", "Ada", "--device", "cpu")
    assert result.exit_code == 0 and "Scorecard:" in result.stdout
    assert (tmp_path / "iv" / "scorecard.md").exists() and (tmp_path / "iv" / "scorecard.html").exists()
    assert Progress.find(tmp_path / "iv").grades("mha")  # graded once at the end


@pytest.mark.parametrize("args, says", [
    (["mha", "--minutes", "5"], "--candidate"),
    (["mha", "--candidate", "Ada"], "--minutes"),
    (["mha", "--minutes", "0", "--candidate", "Ada"], "--minutes"),
    (["nope", "--minutes", "5", "--candidate", "Ada"], "unknown exercise 'nope'"),
    (["mha", "--minutes", "5", "--candidate", "  "], "--candidate"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, args, says):
    result = invoke("interview", *args[:1], tmp_path / "iv", *args[1:])
    assert result.exit_code == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_folder_with_work_or_someone_elses_interview_is_refused(tmp_path, clock):
    (tmp_path / "drills").mkdir()
    (tmp_path / "drills" / "mha.py").write_text(REFERENCE)
    refused = invoke("interview", "mha", tmp_path / "drills", "--minutes", "5", "--candidate", "Ada")
    assert refused.exit_code == 2 and "already holds work" in refused.stderr
    assert (tmp_path / "drills" / "mha.py").read_text() == REFERENCE
    interview.start(tmp_path / "iv", "mha", 5, "Ada", clock)
    other = invoke("interview", "mha", tmp_path / "iv", "--minutes", "5", "--candidate", "Grace")
    assert other.exit_code == 2 and "holds Ada's interview on mha" in other.stderr


def test_the_scorecard_grades_whole_what_the_live_table_took_from_its_cache(tmp_path, zygote, clock):
    """Round 8: a step that reads its own file's comments changes what it does without changing its text, so the
    watcher's cache kept its pass; the scorecard's grade takes nothing from the cache."""
    folder = tmp_path / "iv"
    path = folder / "mha.py"
    line = "    m = scores.amax(dim=dim, keepdim=True).detach()"
    reads_itself = REFERENCE.replace(line, '''    with open(__file__, encoding="utf-8") as own:
        if "# mode: " + "library" in own.read():
            return torch.softmax(scores, dim=dim).nan_to_num(0.0)
''' + line, 1)
    assert reads_itself != REFERENCE
    actions = [at(clock, 60, lambda: save(path, reads_itself)),
               at(clock, 120, lambda: save(path, reads_itself + "\n\n# mode: library\n")), at(clock, 601, lambda: None)]
    md, _ = interview.run(folder, "mha", 10, "Ada", {"device": "cpu"}, clock=clock, read_key=script(*actions),
                          zygote=zygote)
    final = scorecard_line(md.read_text(), "Final score")
    assert final != "100/100" and int(final.split("/")[0]) <= 86, final


def test_records_damaged_in_the_progress_file_are_left_out_of_the_scorecard(tmp_path, zygote, clock):
    """The progress file lies in the candidate's folder: an entry missing a field, or a time that is none, is passed
    over (and left in the file), never a crash that leaves the session without a scorecard (review 48's B1)."""
    folder = tmp_path / "iv"
    path = folder / "mha.py"

    def damage():
        data = json.loads((folder / ".attn-grade.json").read_text())
        entry = data["exercises"]["mha"]
        entry["hints"] += [{"step": "softmax"}, {"step": "softmax", "level": 1}, {"level": 2, "at": "noon"}]
        entry["solutions"] += [{"at": 5}, "softmax"]
        entry["grades"] += [{"score": "all"}, {"at": entry["started"], "score": 7.5}]
        entry["steps"]["project"]["first_green"] = "yesterday"
        (folder / ".attn-grade.json").write_text(json.dumps(data))

    actions = [at(clock, 60, lambda: save(path, MASK_INVERTED)), at(clock, 90, lambda: "h"), at(clock, 120, damage)]
    md, _ = interview.run(folder, "mha", 3, "Ada", {"device": "cpu"}, clock=clock, read_key=script(*actions),
                          zygote=zygote)
    text = md.read_text()
    assert scorecard_line(text, "Hints seen") == "1" and scorecard_line(text, "Model answers seen") == "none"
    assert scorecard_line(text, "Grades").startswith("2 (")  # the stub and the save
    assert "| +1:30 | hint, level 1, for apply_mask |" in text
    assert "first green: project" not in text
    kept = json.loads((folder / ".attn-grade.json").read_text())["exercises"]["mha"]["hints"]
    assert {"step": "softmax"} in kept  # passed over, not deleted


def test_the_candidates_text_makes_no_markdown_in_the_scorecard():
    """Review 49: an exception message's image, link and bold text were live in scorecard.md (the HTML page and
    `--format markdown` escaped them already)."""
    said = "![p](http://example.invalid/p.png) [click](http://example.invalid) **100/100** `x` | y"
    card = interview.Scorecard(title="Interview scorecard: Ada", facts=[("Final score", "3/10")],
                               rows=[("✗ softmax", "0/14", "–", "1", "–", "–")], mistakes=[("softmax", [said])],
                               rules=[("softmax", said)], timeline=[("+0:00", "started")])
    text = card.markdown()
    assert "![p](" not in text and "[click](" not in text and "**100/100**" not in text, text
    assert r"!\[p\](http://example.invalid/p.png) \[click\](http://example.invalid) \*\*100/100\*\* \`x\` \| y" in text
