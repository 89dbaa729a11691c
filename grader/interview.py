"""An interview: a workspace with one exercise's stub, a countdown over the live step table, a scorecard.

`attn-grade interview mha --minutes 45 --candidate Ada FOLDER` writes the stub into FOLDER and
regrades the candidate's file on every save, as `watch` does, under a countdown. Every grade,
hint and model answer seen is recorded with its time in the workspace's progress file
(grader/progress.py), whichever command made it (`watch`'s h key, `attn-grade hint`,
`attn-grade solution` run in the folder). The session itself (who, which exercise, how long,
when it started) is `.attn-grade-interview.json` beside it, so the same command in the same
folder resumes the clock. When time is up, or the interviewer stops it (q, Ctrl-C), the
scorecard is written beside the file: `scorecard.md` and `scorecard.html` (one self-contained
page, inline CSS, made to print).

A scorecard written at time up is final: it is kept in the session file with the SHA-256 of the
file it graded, and the same command run later writes it again as it was, with the file as it is
now (its score, its hash, when it was graded) in a section of its own, "After time". A save is a
change of the file's content (its hash), not of its size and modification time.

The session file lies in the candidate's folder, so it is signed (HMAC-SHA256) with a key of the interviewer's
account, kept outside it (`key_path`): a session changed by anyone but attn-grade, such as a final scorecard
written by hand, is refused, and so is one started under another account or on another machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import html
import json
import math
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import click

from grader import keys, workspace
from grader.exercise import Exercise, UsageError, load_course
from grader.grade import grade
from grader.html import CSS as PICTURE_CSS
from grader.html import grid_of
from grader.html import pictures as draw_pictures
from grader.pool import Zygote
from grader.progress import Progress, read_regular, replace_file
from grader.report import _groups, markdown_text
from grader.score import Grade, StepResult
from grader.watch import KEYS, NOT_WRITTEN, Watcher, keys_and_zygote, loss
from grader.watch import run as run_watch

SESSION_FILE = ".attn-grade-interview.json"
SCORECARD = "scorecard"  # scorecard.md and scorecard.html
INTERVIEW_KEY = "interview.key"  # in the account's state folder (grader/keys.py)
NOTES = ("Approach and reasoning", "Communication", "Testing and debugging", "Overall")
ENDINGS = {"time up": "time up", "quit": "ended with q", "Ctrl-C": "stopped with Ctrl-C"}
AFTER_TIME = "After time (not part of the final score)"
AFTER_NOTE = ("Everything above is the scorecard as written at time up, with the SHA-256 of the file it graded. "
              "This is the file as it is now.")


@dataclass(frozen=True)
class Session:
    folder: Path
    exercise: Exercise
    candidate: str
    minutes: float
    started: float  # seconds since the epoch: a wall-clock time, so that a restart resumes the clock
    final: dict | None = None  # at time up: the scorecard as written then, and the SHA-256 of the file it graded

    @property
    def path(self) -> Path:
        return self.folder / self.exercise.file

    @property
    def deadline(self) -> float:
        return self.started + self.minutes * 60

    def save(self) -> None:
        data = {"version": 1, "exercise": self.exercise.name, "candidate": self.candidate,
                "minutes": self.minutes, "started": _iso(self.started)}
        if self.final:
            data["final"] = self.final
            _keep_final(self.folder, data)
        data["signature"] = _signature(data)
        path = self.folder / SESSION_FILE
        _written(path, lambda: replace_file(path, json.dumps(data, indent=2) + "\n"))


def start(folder: Path, exercise: str, minutes: float, candidate: str, clock=time.time) -> tuple[Session, bool]:
    """A new session in `folder` (a fresh stub, its progress started now), or the one there resumed: (it, resumed)."""
    exercises = load_course()
    if exercise not in exercises:
        raise UsageError(f"unknown exercise '{exercise}' (known: {', '.join(exercises)}).")
    candidate = " ".join(candidate.split())
    if not candidate or not candidate.isprintable():
        raise UsageError("--candidate: give the candidate's name on one line, e.g. --candidate 'Ada Lovelace'.")
    if not (math.isfinite(minutes) and minutes > 0):
        raise UsageError(f"--minutes: give the length of the interview in minutes, more than 0 (got {minutes}).")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file; give a folder for the interview (it is created if need be).")
    kept = _kept(folder)
    try:
        saved = _load(folder)
    except UsageError:
        if kept is None:
            raise
        saved = None  # damaged after time up: the final scorecard kept beside the key stands
    # A final scorecard kept for this folder stands over the session file's, or its absence: a copy of the file made
    # before time up and put back says none, and so does a deleted one (while the candidate's file is there).
    if kept and (kept["started"] == saved["started"] if saved else (folder / exercises[exercise].file).exists()):
        saved = kept
    if saved:
        if (saved["exercise"], saved["candidate"]) != (exercise, candidate):
            raise UsageError(f"{folder} holds {saved['candidate']}'s interview on {saved['exercise']}: give the same "
                             f"exercise and --candidate to resume it, or another folder for a new one.")
        if saved["final"]:  # over: no --minutes given now reopens it
            return Session(folder, exercises[exercise], candidate, saved["minutes"], saved["started"],
                           saved["final"]), True
        session = Session(folder, exercises[exercise], candidate, minutes, saved["started"])
        session.save()  # the length given now counts: an interviewer may give more time
        return session, True
    try:
        workspace.init(folder, [exercises[exercise]])
    except UsageError:
        raise UsageError(f"{folder / exercises[exercise].file} already holds work and {folder} no interview: "
                         f"give a new folder for the interview.") from None
    session = Session(folder, exercises[exercise], candidate, minutes, float(int(clock())))
    with contextlib.suppress(OSError):  # an earlier interview's, in a folder of this name since removed
        _kept_path(folder).unlink(missing_ok=True)
    progress = Progress.find(folder)
    progress.restart(exercise)  # a folder drilled in before: nothing of that counts here
    progress.exercise(exercise)["started"] = _iso(session.started)
    progress.save()
    session.save()
    return session, False


def run(folder: Path, exercise: str, minutes: float, candidate: str, options: dict, clock=time.time,
        read_key=None, zygote: Zygote | None = None) -> tuple[Path, Path]:
    """Run the interview until time is up, q or Ctrl-C; write the scorecard and return its two paths.

    `clock` is the wall clock (seconds since the epoch) and `read_key(timeout)` the keys pressed, as in
    watch: tests pass their own, and nothing here sleeps but the poll between saves.
    """
    session, resumed = start(Path(folder), exercise, minutes, candidate, clock)
    if session.final:
        return after_time(session, options, clock, zygote)
    late = resumed and clock() >= session.deadline  # no command was watching the file when time was up
    left = _left(session.deadline - clock())
    if resumed:
        started = _hhmm(session.started)
        click.echo(f"Resuming {session.candidate}'s interview on {exercise}, started {started}: {left} left.")
    else:
        click.echo(f"Interview of {session.candidate} on {exercise}, {minutes:g} min. "
                   f"The candidate edits {session.path}; every save is graded here.")
    with keys_and_zygote(options, read_key, zygote) as (zygote, read):
        help_line = f" · {KEYS} · q: end the interview" if read else ""
        watcher = Watcher(session.path, {**options, "exercise": exercise}, zygote, keys=read is not None,
                                 status=lambda: f"⏱ {_left(session.deadline - clock())} left{help_line}",
                                 suggest_next=False)
        try:
            ended = run_watch(watcher, read, deadline=session.deadline, clock=clock)
        except KeyboardInterrupt:
            ended = "Ctrl-C"
        resume = "" if ended == "time up" else "; the same command resumes it"
        ending = ENDINGS[ended]
        click.echo(f"\n{ending[0].upper() + ending[1:]} with {_left(session.deadline - clock())} left{resume}.")
        note = None
        watcher.saved()
        if watcher.result is None or watcher.graded_stamp != watcher.stamp:
            saved = _mtime(session.path)
            if ended == "time up" and not late and watcher.result is not None and (saved or 0) > session.deadline:
                # saved while the last grade ran, after time up: the final score is the last grade's
                note = f"a save at {_when(saved)}, after time up, is not counted"
            else:
                watcher.cache = {}  # the scorecard's grade is whole (Watcher.regrade_whole)
                watcher.regrade()  # the scorecard grades the file as it is now
        else:
            watcher.regrade_whole()
    # the hash of the content graded (read before grading it), not of whatever the file holds by now
    sha256 = watcher.graded_stamp if watcher.result is not None else _sha256(session.path)
    now = clock()
    if late and ended == "time up":
        note = _late(session, now)
    card = Scorecard.build(session, watcher.result, Progress.find(session.folder) or Progress(session.folder),
                           min(now, session.deadline), ended, sha256, note)
    if ended == "time up":  # final: what it says now is what every later run shows
        replace(session, final={"sha256": sha256, "scorecard": card.to_json()}).save()
    _write(session, card)
    return _paths(session)


def after_time(session: Session, options: dict, clock=time.time, zygote: Zygote | None = None) -> tuple[Path, Path]:
    """The final scorecard of an interview over, as written at time up, with the file as it is now apart."""
    final = Scorecard.from_json(session.final["scorecard"])
    score = dict(final.facts).get("Final score", "not graded")
    click.echo(f"{session.candidate}'s interview on {session.exercise.name} ended at time up, "
               f"{_hhmm(session.deadline)}; its scorecard is final ({score}). The file as it is now is under "
               f"\"After time\".")
    now, sha256 = clock(), _sha256(session.path)
    after = [("Graded at", f"{_when(now)}, {_since(now - session.deadline)} after time up")]
    if sha256 == session.final["sha256"]:
        after.append(("The file", f"unchanged since time up (SHA-256 {sha256}): its score is the final score"))
    else:
        try:
            result = grade(session.path, exercise=session.exercise.name, zygote=zygote, **options)
            now_score = f"{result.score}/{result.max_score}"
        except UsageError as error:
            now_score = f"not graded: {error}"
        except KeyboardInterrupt:  # the final scorecard is written whole all the same
            now_score = "not graded: stopped with Ctrl-C"
        after += [("Score now", f"{now_score} (final score: {score})"),
                  ("SHA-256 now", f"{sha256} (at time up: {session.final['sha256']})")]
        click.echo(f"After time: {now_score}, which the final score does not count.")
    _write(session, replace(final, after=after))
    return _paths(session)


def _write(session: Session, card: Scorecard) -> None:
    md, page = _paths(session)
    _written(md, lambda: replace_file(md, card.markdown()))
    _written(page, lambda: replace_file(page, card.html()))


def _written(path: Path, write) -> None:
    """`write()`, which writes `path`: what stands in its way (a folder of that name) is a usage error, in a line."""
    try:
        write()
    except OSError as error:
        raise UsageError(f"cannot write {path} ({error.strerror}): move away what is there and run the same command "
                         "again; a final scorecard is kept and shown then.") from None


def _paths(session: Session) -> tuple[Path, Path]:
    return session.folder / f"{SCORECARD}.md", session.folder / f"{SCORECARD}.html"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _late(session: Session, now: float) -> str:
    """What a scorecard says when no command was watching the file at time up: when it was graded, and saved."""
    saved = _mtime(session.path)
    when = "" if saved is None else (  # a time the file's owner can set: said as the file's, not as a fact
        f"; the file's modification time is {_when(saved)}, "
        + ("after time up: this score may count work done after time" if saved > session.deadline
           else "before time up, which whoever can write the folder can set: this score may count work done after "
                "time"))
    return (f"graded at {_when(now)}, {_since(now - session.deadline)} after time up (no interview command was "
            f"running at time up){when}")


@dataclass(frozen=True)
class Scorecard:
    """What the interviewer reads, once, for both formats: facts, a row per step, the named mistakes, the
    rules broken, a timeline (minutes from the start) and the notes to fill in."""

    title: str
    facts: list[tuple[str, str]]
    rows: list[tuple[str, ...]]  # step, score, first green, attempts, hints, model answer
    mistakes: list[tuple[str, list[str]]]  # step, one line per diagnosis
    rules: list[tuple[str, str]]  # step, the rule it broke
    timeline: list[tuple[str, str]]  # "+m:ss", what happened
    after: list[tuple[str, str]] = ()  # a final scorecard shown again: the file as it is now, apart
    pictures: list[tuple[str, dict]] = ()  # (step / check, its grid): masks and weights drawn, as the report does

    HEADER = ("Step", "Score", "First green", "Attempts", "Hints", "Model answer")

    @classmethod
    def build(cls, session: Session, result: Grade | None, progress: Progress, ended: float, how: str,
              sha256: str | None = None, note: str | None = None) -> Scorecard:
        name, at = session.exercise.name, lambda iso: _seconds(iso) - session.started
        hints, solutions = progress.hints(name), progress.solutions(name)
        steps = result.steps if result else ()
        ending = ENDINGS[how]
        facts = [
            ("Candidate", session.candidate),
            ("Date", datetime.fromtimestamp(session.started, timezone.utc).strftime("%Y-%m-%d")),
            ("Exercise", f"{session.exercise.title} ({name})"),
            ("Time", f"{session.minutes:g} min planned; started {_hhmm(session.started)}, {ending} at "
                     f"{_hhmm(ended)} after {_left(ended - session.started)}"),
            ("Final score", f"{result.score}/{result.max_score}" if result else "not graded"),
            ("Grades", f"{len(progress.grades(name))} (score over time: {_over_time(progress.grades(name))})"),
            ("Hints seen", str(len(hints))),
            ("Model answers seen", ", ".join(s["step"] or "the whole file" for s in solutions) or "none"),
            ("File", str(session.path)),
            ("SHA-256", sha256 or _sha256(session.path)),
        ]
        if note:
            facts.append(("Graded", note))
        if result and result.environment.get("file_error"):
            facts.append(("The file", result.environment["file_error"]))
        rows = []
        green = progress.time_to_green(name)
        for step in steps:
            levels = [str(h["level"]) for h in hints if h["step"] == step.id]
            seen = [s for s in solutions if s["step"] in (step.id, None)]
            rows.append((
                f"{_mark(step)} {step.id}", f"{step.score}/{step.max_score}",
                _offset(green[step.id]) if step.id in green else "–", str(progress.attempts(name, step.id)),
                f"levels {', '.join(levels)}" if levels else "–",
                f"seen at {_offset(at(seen[0]['at']))}" if seen else "–",
            ))
        timeline = [(0.0, "started")]
        for seconds in sorted(set(green.values())):  # steps that went green in the same grade: one line
            timeline.append((seconds, "first green: " + ", ".join(s for s, t in green.items() if t == seconds)))
        timeline += [(at(h["at"]), f"hint, level {h['level']}, for {h['step']}") for h in hints]
        timeline += [(at(s["at"]), f"model answer seen: {s['step'] or 'the whole file'}") for s in solutions]
        timeline.append((ended - session.started, ending + (f", {result.score}/{result.max_score}" if result else "")))
        return cls(
            title=f"Interview scorecard: {session.candidate}",
            facts=facts,
            rows=rows,
            mistakes=_mistakes(steps),
            rules=[(s.id, s.breach) for s in steps if s.breach],
            timeline=[(_offset(seconds), text) for seconds, text in sorted(timeline, key=lambda item: item[0])],
            pictures=_pictures(steps),
        )

    def to_json(self) -> dict:
        """What the session file keeps of a final scorecard: all of it but the after-time section."""
        return {"title": self.title, "facts": self.facts, "rows": self.rows, "mistakes": self.mistakes,
                "rules": self.rules, "timeline": self.timeline, "pictures": [list(p) for p in self.pictures]}

    @classmethod
    def from_json(cls, data: dict) -> Scorecard:
        pairs = lambda items: [(str(a), str(b)) for a, b in items]  # noqa: E731
        return cls(
            title=str(data["title"]),
            facts=pairs(data["facts"]),
            rows=[tuple(str(v) for v in row) for row in data["rows"]],
            mistakes=[(str(step), [str(line) for line in found]) for step, found in data["mistakes"]],
            rules=pairs(data["rules"]),
            timeline=pairs(data["timeline"]),
            # the grids only, checked and drawn anew: the session file lies in the candidate's folder
            pictures=[(str(label), found) for label, grid in data.get("pictures", [])
                      if (found := grid_of({"grid": grid})) is not None],
        )

    def markdown(self) -> str:
        cell = lambda text: markdown_text(str(text))  # noqa: E731  (the candidate's text: no markup of theirs runs)
        lines = [f"# {self.title}", ""]
        lines += [f"- **{label}**: {cell(value)}" for label, value in self.facts]
        lines += ["", "## Steps", "", "| " + " | ".join(self.HEADER) + " |", "| --- |" + " ---: |" * 3 + " --- | --- |"]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in self.rows]
        lines += ["", "## Named mistakes and failed checks", ""]
        lines += [f"- `{step}`: {cell(line)}" for step, found in self.mistakes for line in found] or ["- none"]
        lines += ["", "## Rules broken", ""]
        lines += [f"- `{step}` earns nothing: {cell(rule)}" for step, rule in self.rules] or ["- none"]
        lines += ["", "## Timeline", "", "| Time | Event |", "| ---: | --- |"]
        lines += [f"| {when} | {cell(what)} |" for when, what in self.timeline]
        if self.after:
            lines += ["", f"## {AFTER_TIME}", "", f"_{AFTER_NOTE}_", ""]
            lines += [f"- **{label}**: {cell(value)}" for label, value in self.after]
        lines += ["", "## Notes", ""]
        for prompt in NOTES:
            lines += [f"**{prompt}:**", "", "", ""]
        return "\n".join(lines).rstrip("\n") + "\n"

    def html(self) -> str:
        e = html.escape
        facts = "".join(f"<dt>{e(label)}</dt><dd>{e(value)}</dd>" for label, value in self.facts)
        head = "".join(f"<th>{e(h)}</th>" for h in self.HEADER)
        rows = "".join(
            f'<tr class="{_css(row[0])}">' + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in self.rows
        )
        mistakes = "".join(
            f"<li><code>{e(step)}</code>: {e(line)}</li>" for step, found in self.mistakes for line in found
        )
        rules = "".join(f"<li><code>{e(step)}</code> earns nothing: {e(rule)}</li>" for step, rule in self.rules)
        timeline = "".join(f"<tr><td>{e(when)}</td><td>{e(what)}</td></tr>" for when, what in self.timeline)
        notes = "".join(f'<h3>{e(prompt)}</h3><div class="lines">{"<p></p>" * 4}</div>' for prompt in NOTES)
        after = "".join(f"<dt>{e(label)}</dt><dd>{e(value)}</dd>" for label, value in self.after)
        figures = "".join(f"<h3><code>{e(label)}</code></h3>{draw_pictures({'grid': grid})}"
                          for label, grid in self.pictures)
        figures = f'<div class="attn-grade">{figures}</div>\n' if figures else ""
        after = (f'<section class="after">\n<h2>{e(AFTER_TIME)}</h2>\n<p>{e(AFTER_NOTE)}</p>\n<dl>{after}</dl>\n'
                 f"</section>\n") if self.after else ""
        return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(self.title)}</title>
<style>
body {{ font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1b1b;
       max-width: 54rem; margin: 2rem auto; padding: 0 1rem; }}
h1 {{ font-size: 1.5rem; margin: 0 0 1rem; }}
h2 {{ font-size: 1.1rem; border-bottom: 1px solid #bbb; padding-bottom: .2rem; margin-top: 1.8rem; }}
h3 {{ font-size: .95rem; margin: 1rem 0 .2rem; }}
dl {{ display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0; }}
dt {{ font-weight: 600; }}
dd {{ margin: 0; overflow-wrap: anywhere; }}
table {{ border-collapse: collapse; width: 100%; }}
th, td {{ border: 1px solid #d0d0d0; padding: .3rem .5rem; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
td:nth-child(n+2):nth-child(-n+4) {{ font-variant-numeric: tabular-nums; }}
tr.full td:first-child {{ color: #17692d; }}
tr.partial td:first-child {{ color: #8a5a00; }}
tr.none td:first-child {{ color: #a4161a; }}
code {{ font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .9em; }}
.lines p {{ border-bottom: 1px solid #999; height: 1.6rem; margin: 0; }}
.after {{ border-left: 4px solid #8a5a00; padding-left: .8rem; margin-top: 1.8rem; }}
.after h2 {{ margin-top: 0; }}
@media screen and (max-width: 600px) {{ table {{ font-size: .85em; }} th, td {{ padding: .2rem .25rem; }}
  td:first-child {{ overflow-wrap: anywhere; }} }}
{PICTURE_CSS}@page {{ margin: 1.6cm; }}
@media print {{
  body {{ font-size: 10.5pt; max-width: none; margin: 0; padding: 0; color: #000; }}
  th {{ background: none; }}
  h2, h3 {{ break-after: avoid; }}
  tr, li, .lines {{ break-inside: avoid; }}
  .lines p {{ height: 2.2rem; }}
}}
</style>
</head>
<body>
<h1>{e(self.title)}</h1>
<dl>{facts}</dl>
<h2>Steps</h2>
<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
<h2>Named mistakes and failed checks</h2>
<ul>{mistakes or "<li>none</li>"}</ul>
{figures}<h2>Rules broken</h2>
<ul>{rules or "<li>none</li>"}</ul>
<h2>Timeline</h2>
<table><thead><tr><th>Time</th><th>Event</th></tr></thead><tbody>{timeline}</tbody></table>
{after}<h2>Notes</h2>
{notes}
</body>
</html>
"""


def _pictures(steps) -> list[tuple[str, dict]]:
    """Per step, the mask or weights of its first lost check that returned them, as the report draws them."""
    found = []
    for step in steps:
        for first, _ in _groups(step):
            grid = grid_of(first.details)
            if grid is not None:
                found.append((f"{step.id} / {first.name}", grid))
                break  # one a step: its other lost checks show the same pattern on other inputs
    return found


def _mistakes(steps) -> list[tuple[str, list[str]]]:
    """Per step that lost points, its diagnoses; the steps not written at all, on one line at the end."""
    unwritten = [s.id for s in steps if s.score < s.max_score and loss(s) == "not written"]
    found = [(s.id, _diagnoses(s)) for s in steps if s.score < s.max_score and s.id not in unwritten]
    return found + ([(", ".join(unwritten), [NOT_WRITTEN])] if unwritten else [])


def _diagnoses(step: StepResult) -> list[str]:
    """One line per diagnosis of a step's lost checks: a named mistake once, with its count, else the message."""
    found: dict[str, list] = {}
    for check in step.checks:
        if check.points < check.max_points:
            key = check.mistake_id or check.message
            found.setdefault(key, [check, 0])[1] += 1
    lines = []
    for check, count in found.values():
        more = f" and {count - 1} more" if count > 1 else ""
        text = f"{check.name}{more}: {check.message}"
        lines.append(f"{check.mistake} ({text})" if check.mistake else text)
    return lines


def _load(folder: Path) -> dict | None:
    path = folder / SESSION_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        signature = data.pop("signature", None)
        if not isinstance(signature, str) or not hmac.compare_digest(signature, _signature(data)):
            raise UsageError(f"{path} is no interview session attn-grade can read: it was changed outside attn-grade, "
                             f"or started under another account or machine (the key is {key_path()}); give another "
                             "folder for a new interview.")
        return _fields(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MemoryError):
        raise UsageError(
            f"{path} is no interview session attn-grade can read: move it away, or give another folder."
        ) from None


def _fields(data: dict) -> dict:
    """A session's fields, read whole now, so that a damaged one is refused where it is read, in one line."""
    final = data.get("final")
    if final is not None:
        final = {"sha256": str(final["sha256"]), "scorecard": Scorecard.from_json(final["scorecard"]).to_json()}
    return {"exercise": str(data["exercise"]), "candidate": str(data["candidate"]), "minutes": float(data["minutes"]),
            "started": _seconds(data["started"]), "final": final}


def key_path() -> Path:
    """The interviewer's key for session files: in the account's state folder, never in an interview's."""
    return keys.state_folder() / INTERVIEW_KEY


def _kept_path(folder: Path) -> Path:
    """Where the interviewer's account keeps the final scorecard of the interview in `folder`, beside the key: every
    version of the session file is signed, and the candidate may delete it, so a copy made before time up, put back
    after it, or none at all would otherwise reopen the interview."""
    where = str(Path(folder).resolve())
    return key_path().parent / "finals" / f"{hashlib.sha256(where.encode()).hexdigest()}.json"


def _keep_final(folder: Path, data: dict) -> None:
    path = _kept_path(folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, json.dumps(data))
    except OSError as error:
        raise UsageError(f"cannot keep the final scorecard in {path.parent} ({error.strerror}): make it writable, or "
                         "set XDG_STATE_HOME to a folder of your own.") from None


def _kept(folder: Path) -> dict | None:
    """The session of the interview in `folder` as it was at time up, if one reached it on this account."""
    path = _kept_path(folder)
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        if data.get("final") is None:
            raise ValueError("no final scorecard")
        return _fields(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MemoryError):
        raise UsageError(f"{path} is no final scorecard attn-grade can read: move it away, and the session file in "
                         f"{folder} stands alone.") from None


def _signature(data: dict) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=True)
    return hmac.new(keys.account_key(INTERVIEW_KEY), text.encode(), hashlib.sha256).hexdigest()


def _over_time(grades: list[dict]) -> str:
    """The scores of the grades that changed it: 0 → 24 → 38."""
    scores = [g["score"] for g in grades]
    return " → ".join(str(s) for i, s in enumerate(scores) if i == 0 or s != scores[i - 1]) or "none"


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(read_regular(path)).hexdigest()
    except OSError as error:
        return f"unreadable ({error.strerror})"


def _mark(step: StepResult) -> str:
    return "✓" if step.score == step.max_score else "✗" if step.score == 0 else "~"


def _css(first_cell: str) -> str:
    return {"✓": "full", "~": "partial"}.get(first_cell[:1], "none")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _hhmm(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%H:%M UTC")


def _left(seconds: float) -> str:
    """m:ss, rounded up (a countdown that shows 0:00 is over)."""
    minutes, secs = divmod(max(0, math.ceil(seconds)), 60)
    return f"{minutes}:{secs:02d}"


def _since(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour on: how long after time up."""
    hours, rest = divmod(max(0, int(seconds)), 3600)
    return f"{hours}:{_offset(rest)[1:].zfill(5)}" if hours else _offset(rest)[1:]


def _offset(seconds: float) -> str:
    minutes, secs = divmod(max(0, int(seconds)), 60)
    return f"+{minutes}:{secs:02d}"
