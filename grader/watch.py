"""Grade a file on every save, with a warm zygote so a regrade costs only the checks.

The file is polled (every 20 ms) rather than watched through an OS API: no extra
dependency, and editors that save by rename are seen the same way. A save shows
"regrading…" at once. The screen is the step table and one step in detail: the step whose
source changed since the last grade, else the first that lost points to a real failure, a
step not written yet last. On a terminal, keys act without Enter (rustlings style): d shows
every failed check of that step, h its next hint (recorded in the workspace, as `attn-grade
hint` does), q quits. Messages are wrapped at word boundaries to the terminal's width.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import re
import select
import shutil
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import click

from grader import source, workspace
from grader.exercise import Exercise, UsageError, find_exercise, load_course
from grader.grade import grade
from grader.pool import Zygote
from grader.progress import Progress
from grader.report import to_text
from grader.score import Grade, StepResult

POLL_SECONDS = 0.02
KEYS = "d: every failed check · h: next hint"
NOT_WRITTEN = "not implemented yet"  # the message of a step that raises NotImplementedError (the stub's)


def watch(path: Path, options: dict, rounds: int | None = None, read_key=None, zygote: Zygote | None = None) -> None:
    """Regrade `path` whenever it changes, until q or Ctrl-C (or `rounds` grades, for tests).

    `read_key(timeout)` returns the keys pressed within `timeout` seconds ("" for none); by
    default they come from the terminal when stdin is one, and off a terminal there are none.
    """
    try:
        with keys_and_zygote(options, read_key, zygote) as (zygote, read):
            help_line = f"{KEYS} · q: quit{enter_note(read)}" if read else "save to regrade, Ctrl-C to stop"
            watcher = Watcher(path, options, zygote, status=lambda: help_line, keys=read is not None)
            run(watcher, read, rounds=rounds)
        click.echo("\nStopped watching.")
    except KeyboardInterrupt:
        click.echo("\nStopped watching.")


@contextlib.contextmanager
def keys_and_zygote(options: dict, read_key=None, zygote: Zygote | None = None):
    """(a zygote, the keys to read): the zygote given, or a new one closed on the way out; the `read_key`
    given, or the terminal's keys (see terminal_keys), or None off a terminal."""
    own = zygote is None
    zygote = zygote or Zygote(warm_device=options.get("device") != "cpu")
    try:
        with terminal_keys() as keys:
            yield zygote, read_key or keys
    finally:
        if own:
            zygote.close()


def run(watcher: Watcher, read_key, rounds: int | None = None, deadline: float | None = None, clock=time.time) -> str:
    """Regrade on every save and act on keys: "quit" after q, "time up" at `deadline` (by `clock`),
    "rounds" after `rounds` grades. Ctrl-C raises KeyboardInterrupt, as ever."""
    graded = 0
    while rounds is None or graded < rounds:
        if deadline is not None and clock() >= deadline:
            return "time up"
        if watcher.saved():
            watcher.regrade()
            graded += 1
            continue
        watcher.tick()
        wait = POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - clock()))
        if read_key is None:
            time.sleep(wait)
        elif not all(map(watcher.press, read_key(wait))):
            return "quit"
    return "rounds"


@contextlib.contextmanager
def terminal_keys(stream=None):
    """Keys from the terminal, one at a time without Enter: a function of a timeout that waits that long
    at most and returns the keys pressed ("" for none); None when `stream` (stdin) is no terminal of ours.

    The terminal is in cbreak mode meanwhile (no echo, no line buffering; Ctrl-C still interrupts) and is
    put back as it was on the way out, whatever ends it: q, Ctrl-C, time up or an error. Where Python has
    no termios (Windows' own Python), the keys come a line at a time instead (`line_keys`).
    """
    stream = stream or sys.stdin
    try:
        import termios  # POSIX only (Linux and macOS have it): imported here, so watch runs without it
        import tty
    except ImportError:
        with line_keys(stream) as read:
            yield read
        return
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd) if stream.isatty() and _foreground(fd) else None
    except (AttributeError, OSError, ValueError, termios.error):
        saved = None
    if saved is None:
        yield None
        return

    def read(timeout: float) -> str:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return ""
        return os.read(fd, 64).decode(errors="ignore") or "q"  # end of input (the terminal hung up): quit

    try:
        tty.setcbreak(fd)
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def line_keys(stream):
    """Keys a line at a time, each line's keys once Enter is pressed: the terminal's keys where there is
    no termios to read them one by one. None when `stream` is no terminal.

    A thread reads the lines (select cannot wait on a console there), so a read waits `timeout` at most.
    """
    try:
        interactive = stream.isatty()
    except (AttributeError, OSError, ValueError):
        interactive = False
    if not interactive:
        yield None
        return
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        while True:
            try:
                line = stream.readline()
            except (OSError, ValueError):
                line = ""
            lines.put(line if isinstance(line, str) else line.decode(errors="ignore"))
            if not line:
                return

    threading.Thread(target=pump, daemon=True).start()

    def read(timeout: float) -> str:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return ""
        return line.strip() if line else "q"  # end of input: quit

    read.needs_enter = True
    yield read


def enter_note(read) -> str:
    """What the help line adds where keys are read a line at a time (`line_keys`)."""
    return " (then Enter)" if getattr(read, "needs_enter", False) else ""


def _foreground(fd: int) -> bool:
    """Whether we may set the terminal's mode: from the background of a shell, that would stop us (SIGTTOU)."""
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # not our controlling terminal: no job control to stop us
        return True


class Watcher:
    """One file on screen: its last grade, the step shown in detail, and what the keys do.

    `status` gives the bottom line (the keys, or an interview's countdown); on a terminal it is
    rewritten in place by `tick`, and every other message is printed above it.
    """

    def __init__(self, path: Path, options: dict, zygote: Zygote, status=lambda: "", keys: bool = False,
                 suggest_next: bool = True):
        self.path, self.options, self.zygote = Path(path), options, zygote
        self.exercise: Exercise = find_exercise(self.path, options.get("exercise"))
        self.status, self.keys, self.suggest_next = status, keys, suggest_next
        self.terminal = sys.stdout.isatty()
        self.cache: dict = {}  # checks whose step did not change are not run again
        self.stamp = self.graded_stamp = None  # the file's SHA-256 when last seen, and when last graded
        self.sources: dict | None = None  # each step's source at the last grade of a file that parsed
        self.result: Grade | None = None
        self.focus: StepResult | None = None
        self.why = ""
        self.hints_shown: dict[str, int] = {}  # outside a workspace, the hint levels shown so far
        self._status_shown: str | None = None

    def saved(self) -> bool:
        """Whether the file's content changed since it was last seen. Its SHA-256, not its size and
        modification time: a file replaced by another of the same size and time is still a save."""
        try:  # a regular file only, read at most so far: a pipe or a device in its place is no save (review 53's F8)
            stamp = hashlib.sha256(source.file_bytes(self.path)).hexdigest()
        except UsageError:
            return False
        changed, self.stamp = stamp != self.stamp, stamp
        return changed

    def regrade(self) -> Grade | None:
        """Grade the file now: "regrading…" at once, then the new screen."""
        self.say(click.style(f"{'regrading' if self.result else 'grading'} {self.path.name}…", fg="cyan"))
        stamp, started = self.stamp, time.monotonic()
        ids = [step.id for step in self.exercise.steps]
        sources = workspace.step_sources(self.path, ids)
        try:
            result = grade(self.path, zygote=self.zygote, cache=self.cache, **self.options)
        except UsageError as error:
            self.say(f"attn-grade: {error}")
            return None
        progress = workspace.record_grade(self.path, result)
        edited = [i for i in ids if sources and self.sources and sources[i] != self.sources[i]]
        self.sources = sources or self.sources
        self.result, self.graded_stamp = result, stamp
        self.focus, self.why = focus(result, edited)
        self.show(self._screen(result, edited, progress, time.monotonic() - started))
        return result

    def regrade_whole(self) -> Grade | None:
        """The last grade's content graded again without the cache, recording nothing new: the cache keeps the checks
        of a step whose text did not change, and a file can change what a step does without changing its text (it
        may read its own comments). What a scorecard reports."""
        try:
            self.result = grade(self.path, zygote=self.zygote, cache=None, **self.options)
        except UsageError as error:
            self.say(f"attn-grade: {error}")
        return self.result

    def press(self, key: str) -> bool:
        """Act on one key; False for q."""
        if key == "q":
            return False
        if key == "d":
            self.say("\n".join(self._detail(compact=False)) if self.focus else self._nothing())
        elif key == "h":
            self.say(self._hint() if self.focus else self._nothing())
        return True

    # -- output: a screen, messages under it, the status line at the bottom --------------

    def show(self, screen: str) -> None:
        if self.terminal:
            click.clear()
        click.echo(screen)
        self._status()

    def say(self, text: str) -> None:
        if self.terminal:
            click.echo("\r\033[K" + text)
            self._status()
        else:
            click.echo(text)

    def tick(self) -> None:
        """Bring the status line up to date (an interview's countdown), in place on a terminal."""
        if self.terminal and textwrap.shorten(self.status(), _width(), placeholder=" …") != self._status_shown:
            self._status()

    def _status(self) -> None:
        self._status_shown = textwrap.shorten(self.status(), _width(), placeholder=" …")  # one line: rewritten in place
        if self.terminal:
            click.echo("\r\033[K" + self._status_shown, nl=False)
        elif self._status_shown:
            click.echo(self._status_shown)

    # -- what is shown ---------------------------------------------------------------------

    def _screen(self, result: Grade, edited: list[str], progress, seconds: float) -> str:
        table, _, total = split_report(result)
        below = []
        green = [s.id for s in result.steps if s.id in edited and s.score == s.max_score]
        if green:
            below += _wrap(click.style(f"✓ {', '.join(green)}: every check passes now.", fg="green"), _width())
        if self.focus:
            below += self._detail(compact=True)
        elif result.full_marks and self.suggest_next:
            below += self._next(progress)
        return "\n".join([*table, *([""] + below if below else []), "", f"{total}   (graded in {seconds:.2f} s)"])

    def _detail(self, compact: bool) -> list[str]:
        """The focused step's lost checks, wrapped: all of them, or the first diagnosis and a count of the rest."""
        step, width = self.focus, _width()
        _, details, _ = split_report(replace(self.result, steps=(step,), environment={}))
        lines = details[step.id]
        title = f"▸ {step.id} {step.score}/{step.max_score} ({self.why}): {step.title}"
        head = _wrap(click.style(title, bold=True), width)
        if not compact:
            return [*head, *(w for line in lines for w in _wrap(line, width))]
        first = lines[:1] + [line for line in lines[1:2] if click.unstyle(line).lstrip().startswith("→")]
        shown = [*head, *(w for line in first for w in _wrap(line, width, max_lines=3))]
        rest = sum(not click.unstyle(line).lstrip().startswith("→") for line in lines[len(first):])
        if rest:
            shown.append(f"      … {rest} more" + (": press d" if self.keys else ""))
        return shown

    def _hint(self) -> str:
        """The focused step's next hint not seen, recorded in the workspace; once all are seen, where the model
        answer is (recorded no more)."""
        from grader.progress import hint_line, next_hint_level, no_more_hints

        step, name = self.exercise.step(self.focus.id), self.exercise.name
        progress = Progress.find(self.path.parent)
        seen = progress.hint_levels(name, step.id) if progress else range(1, self.hints_shown.get(step.id, 0) + 1)
        level = next_hint_level(seen, len(step.hints))
        if level is None:
            text = no_more_hints(name, step.id, len(step.hints))
        else:
            self.hints_shown[step.id] = level
            if progress and progress.record_hint(name, step.id, level):
                progress.save()
            note = "" if progress else " (not recorded: this folder is no workspace)"
            text = hint_line(name, step.id, step.hints, level) + note
        return "\n".join(_wrap(click.style(text, fg="cyan"), _width()))

    def _nothing(self) -> str:
        if self.result is None:
            return "Nothing graded yet."
        if self.result.environment.get("file_error"):
            return "\n".join(_wrap(self.result.environment["file_error"], _width()))
        return "Every step has full marks."

    def _next(self, progress) -> list[str]:
        """What to do after full marks: the next exercise, and the command for it on a line of its own."""
        following = next_exercise(self.exercise.name, progress)
        if following is None:
            done = "Full marks, and on every exercise of this workspace. Well done."
            return _wrap(click.style(done, fg="green"), _width())
        there = self.path.with_name(following.file)
        commands = [f"attn-grade watch {there}"]
        if not there.exists():
            commands.insert(0, f"attn-grade init {self.path.parent} --exercise {following.name}")
        text = click.style(f"Full marks! Next: {following.name} ({following.title}):", fg="green")
        return [*_wrap(text, _width()), *(f"  {command}" for command in commands)]


def focus(result: Grade, edited: list[str]) -> tuple[StepResult | None, str]:
    """The step to show in detail and why: one just edited that lost points, else the first that lost
    points to its own code, else one that lost them only through other steps, else one not written yet."""
    if result.environment.get("file_error"):
        return None, ""  # the table's head says it once for the file
    lost = [(_rank(step, edited), i, step) for i, step in enumerate(result.steps) if step.score < step.max_score]
    if not lost:
        return None, ""
    (_, why), _, step = min(lost, key=lambda item: (item[0][0], item[1]))
    return step, why


def _rank(step: StepResult, edited: list[str]) -> tuple[int, str]:
    if step.id in edited:
        return 0, "just edited"
    return {"failing": (1, "first failing step"), "through others": (2, "only through other steps"),
            "not written": (3, "not written yet")}[loss(step)]


def loss(step: StepResult) -> str:
    """How a step that lost points lost them: "failing" (its own code failed a check or broke a rule),
    "through others" (only a composite's end-to-end run, through steps charged already), "not written"
    (every lost check says NotImplementedError: the stub's body)."""
    lost = [c for c in step.checks if c.points < c.max_points and c.outcome != "skipped"]
    if step.breach or any(not c.charged_elsewhere and not c.message.startswith(NOT_WRITTEN) for c in lost):
        return "failing"
    return "through others" if any(c.charged_elsewhere for c in lost) else "not written"


def split_report(result: Grade) -> tuple[list[str], dict[str, list[str]], str]:
    """The text report's lines: the head and one row per step; each step's lines under its row; the total."""
    lines = to_text(result).split("\n")
    ids = [step.id for step in result.steps]
    table, details, current = [], {}, None
    for line in lines[:-2]:  # the last two: a blank line and the total
        if len(details) < len(ids) and re.match(rf"  \S {re.escape(ids[len(details)])} ", click.unstyle(line)):
            current = ids[len(details)]
            details[current] = []
            table.append(line)
        elif current:
            details[current].append(line)
        else:
            table.append(line)
    return table, details, lines[-1]


def next_exercise(current: str, progress: Progress | None) -> Exercise | None:
    """The next exercise of the course (after `current`, then from the top) without full marks in the workspace."""
    exercises = list(load_course().values())
    i = [e.name for e in exercises].index(current)
    for exercise in exercises[i + 1 :] + exercises[:i]:
        if not (progress and all(progress.full_marks(exercise.name, s.id) for s in exercise.steps)):
            return exercise
    return None


def _wrap(line: str, width: int, max_lines: int | None = None) -> list[str]:
    """A line wrapped at word boundaries (its indent kept, two more on the lines after), cut with … after
    `max_lines`; a word longer than the width stays whole. A coloured line stays coloured."""
    plain = click.unstyle(line)
    indent = " " * (len(plain) - len(plain.lstrip()))
    colour = re.match(r"(\x1b\[[0-9;]*m)+", line)
    wrapped = textwrap.wrap(plain.strip(), width, initial_indent=indent, subsequent_indent=indent + "  ",
                            break_long_words=False, break_on_hyphens=False, max_lines=max_lines, placeholder=" …")
    return [colour.group(0) + part + "\x1b[0m" for part in wrapped] if colour else wrapped or [""]


def _width() -> int:
    return max(20, shutil.get_terminal_size().columns - 1)
