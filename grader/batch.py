"""Grade many candidate files in parallel worker processes, one CSV row per file.

Each of the `jobs` processes keeps one zygote (torch imported once) and grades files one
after another; a file that hangs, crashes or misbehaves costs only its own row. pytest
runs in each process's main thread, which is why the parallelism is processes, not threads.

A row is handed over (`on_row`) as its file finishes, so the command writes it at once: Ctrl-C
loses only the files being graded. The workers are in a process group of their own, away from
the terminal's Ctrl-C: the grader's process alone is interrupted, and it ends them (SIGTERM, which
each ends its grade, its zygote and itself on, quietly).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import hashlib
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import shutil
import signal
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from grader.exercise import CANDIDATE_SUFFIXES, GraderBug, UsageError, find_exercise, linked, load_course
from grader.progress import read_regular

GRADED = ("full marks", "points lost", "rule broken", "timed out", "crashed", "could not import")  # a file graded
STATUSES = (*GRADED, "usage error", "internal error")
PER_STEP = ("first_lost", "mistake", "mistake_id")  # the columns of each step, after the totals
ESTIMATE_AFTER = 2  # files graded before the progress line guesses the time left
REDRAW = 1.0  # seconds between progress lines while no file finishes
WORKER_DIED = "a batch worker process died while grading this file, twice; grade it alone to see why"
STOP_GRACE = 15.0  # seconds the workers get to end their grades on an interrupt before they are killed

_zygote = None  # each pool process's own
_private: str | None = None  # each pool process's temporary folder: every temporary file of its grades is in it


def find_files(paths: list[str]) -> tuple[list[Path], list[Path]]:
    """The files to grade: each path that is a file, and every .py and .ipynb under each folder
    (but in folders whose name starts with a dot, such as .ipynb_checkpoints or .git); and the links found
    under the folders, which are not graded (a student's link to the kit's model answer is no work of theirs)."""
    found: list[Path] = []
    links: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.suffix in CANDIDATE_SUFFIXES and p.is_file() and not any(
                        part.startswith(".") for part in p.relative_to(path).parts[:-1]):
                    (links if linked(p, path) else found).append(p)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"no such file or folder: {raw}. Pass candidate files or folders that hold them.")
    return found, links


# -- grading -----------------------------------------------------------------------------


def grade_all(files: list[Path], jobs: int, options: dict, on_row=None, on_progress=None) -> list[dict]:
    """One row per file, in the order given; `on_row(row)` gets each as its file finishes.

    A file whose exercise cannot be told (from --exercise or its name) gets its usage-error row at once.
    `on_progress(done, total, graded, running)` is called as files finish and every REDRAW seconds:
    `graded` the seconds each file graded so far took, `running` how long each file being graded has run.
    Ctrl-C (KeyboardInterrupt) stops the workers quietly and is raised again, once the rows of the
    files that finished are handed over.
    """
    rows: list[dict | None] = [None] * len(files)
    todo = []
    for i, path in enumerate(files):
        try:
            find_exercise(path, options.get("exercise"))
            todo.append(i)
        except UsageError as error:
            rows[i] = _row(str(path), "usage error", str(error), 0.0)
            if on_row:
                on_row(rows[i])
    graded: list[float] = []

    def progress(running: dict) -> None:
        if on_progress:
            now = time.monotonic()
            done = sum(row is not None for row in rows)
            on_progress(done, len(files), list(graded), [now - started for started in running.values()])

    if not todo:
        progress({})
        return rows
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch or pytest state inherited

    def new_pool() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start, initargs=(options,))

    pool = new_pool()
    running: dict[concurrent.futures.Future, float] = {}  # the files being graded, when each began
    index: dict[concurrent.futures.Future, tuple[int, ProcessPoolExecutor]] = {}
    waiting, retried = list(todo), set()
    try:
        while waiting or running:
            while waiting and len(running) < jobs:  # at most `jobs` handed out: a file's time is its own
                i = waiting.pop(0)
                with _sigint_held():  # a worker starts here: it must not take the terminal's Ctrl-C at birth
                    future = pool.submit(_grade_one, str(files[i]), options)
                running[future], index[future] = time.monotonic(), (i, pool)
            progress(running)
            finished, _ = concurrent.futures.wait(running, timeout=REDRAW, return_when="FIRST_COMPLETED")
            for future in finished:
                started, (i, its_pool) = running.pop(future), index.pop(future)
                try:
                    row = future.result()
                except BrokenProcessPool:  # a pool process died (killed from outside): every file it held fails
                    if its_pool is pool:
                        pool.shutdown(wait=False, cancel_futures=True)
                        pool = new_pool()
                    if i not in retried:  # once more, in a fresh pool: it may have been another file's doing
                        retried.add(i)
                        waiting.insert(0, i)
                        continue
                    row = _row(str(files[i]), "internal error", WORKER_DIED, time.monotonic() - started)
                rows[i] = row
                graded.append(row["seconds"])
                if on_row:
                    on_row(row)
        progress(running)
    except KeyboardInterrupt:
        interrupted = True
    else:
        interrupted = False
    if interrupted:
        with ctrl_c_ignored():
            _stop(pool)
            pool = running = index = finished = future = None  # the pool's queues are freed with it
        raise KeyboardInterrupt
    pool.shutdown()
    return rows


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the workers, each its grade and its zygote first (SIGTERM); kill any that has not ended in time.

    Freed before the command exits (it leaves by os._exit): multiprocessing's resource tracker would
    otherwise warn of the pool's semaphores as leaked."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    alive = {process.sentinel: process for process in processes}
    while alive and time.monotonic() < deadline:
        for sentinel in multiprocessing.connection.wait(list(alive), timeout=deadline - time.monotonic()):
            del alive[sentinel]
    for process in alive.values():
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGKILL)
    pool.shutdown(wait=True, cancel_futures=True)  # its manager thread has seen them go: it ends, and is joined


@contextlib.contextmanager
def _sigint_held():
    """SIGINT blocked (held pending, then delivered): a process started meanwhile starts with it blocked."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def ctrl_c_ignored():
    try:
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to hold off
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _start(options: dict) -> None:
    """A pool process: away from the terminal's Ctrl-C (a process group of its own), ended by SIGTERM; its own
    temporary folder (so that an interrupt can remove what a grade cut short left there); one zygote."""
    global _zygote, _private
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # drops a Ctrl-C held pending since its start
    os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _private = tempfile.mkdtemp(prefix="attn-grade-batch-")
    tempfile.tempdir = _private
    signal.signal(signal.SIGTERM, _on_term)
    from grader.pool import Zygote

    _zygote = Zygote(warm_device=options.get("device") != "cpu")
    multiprocessing.util.Finalize(None, _zygote.close, exitpriority=10)  # the pool's exit ends it too
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(_private, True), exitpriority=5)


def _on_term(_signum, _frame) -> None:
    """The grader was interrupted: end the zygote (and so every worker child of the grade under way) and the
    temporary folder, and leave. Nothing is raised into the grade: it may be inside torch's C++ (an import)."""
    if _zygote is not None:
        with contextlib.suppress(Exception):
            _zygote.close()
    if _private is not None:
        shutil.rmtree(_private, ignore_errors=True)
    os._exit(0)


def _row(path: str, status: str, reason: str, seconds: float, **graded) -> dict:
    row = {"file": path, "exercise": "", "steps": {}, "lost": {}, "total": 0, "max_score": 0, "sha256": ""}
    return dict(row, **graded, status=status, reason=reason, seconds=seconds)


def _grade_one(path: str, options: dict) -> dict:
    from grader.grade import grade

    start = time.monotonic()
    try:
        result = grade(path, zygote=_zygote, **options)
    except UsageError as error:
        return _row(path, "usage error", str(error), time.monotonic() - start)
    except (GraderBug, Exception) as error:  # a grader fault costs this row, never the batch
        why = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return _row(path, "internal error", why, time.monotonic() - start)
    return dict(row_of(result, time.monotonic() - start), file=path)  # as named: --resume finds it so


def row_of(result, seconds: float) -> dict:
    """A graded file's row: its status (`verdict`), per step the score and what it first lost (`lost_by`)."""
    from grader.score import verdict

    status, reason = verdict(result)
    return _row(result.file, status, reason, seconds, exercise=result.exercise, total=result.score,
                max_score=result.max_score, sha256=result.sha256, steps={s.id: s.score for s in result.steps},
                lost={s.id: lost_by(s) for s in result.steps if s.score < s.max_score})


def lost_by(step) -> tuple[str, str, str]:
    """The check a step first lost (a broken rule's, if one was), what went wrong in a sentence (its named
    mistake's message, else the check's own: "timed out after 10 s"), and the mistake's id."""
    check = next((c for c in step.checks if c.breach), None) or next(
        (c for c in step.checks if c.points < c.max_points), None)
    if check is None:  # a step that lost no check's points
        return "", "", ""
    return check.name, check.mistake or check.message, check.mistake_id or ""


# -- progress ----------------------------------------------------------------------------


def progress_line(done: int, total: int, elapsed: float, graded=(), running=()) -> str:
    """'grading: 3/9 files, about 12 s left'. The time left is guessed from the files graded so far, once
    ESTIMATE_AFTER are, and never while a file has run twice as long as they took on average: then the line
    says how long it has run instead ('grading: 3/9 files, one file has run 20 s'). Never below how long
    any file being graded has run."""
    line = f"grading: {done}/{total} {plural(total, 'file')}"
    if done >= total:
        return line
    slowest = max(running, default=0.0)
    if len(graded) >= ESTIMATE_AFTER:
        typical = sum(graded) / len(graded)
        if slowest <= 2 * typical:
            left = max(round(elapsed / len(graded) * (total - done)), round(slowest), 1)
            return line + (f", about {left // 60} min {left % 60:02d} s left" if left >= 60
                           else f", about {left} s left")
    if slowest >= 5:
        line += f", one file has run {int(slowest)} s"
    return line


def plural(count: int, noun: str) -> str:
    return noun if count == 1 else noun + "s"


# -- the CSV -----------------------------------------------------------------------------


def columns(steps: list[str]) -> list[str]:
    """Per step its score; the totals, status, reason, seconds and the file's hash; then per step the first
    check it lost, what went wrong in a sentence and the named mistake's id."""
    return ["file", "exercise", *steps, "total", "max_score", "status", "reason", "seconds", "sha256",
            *(f"{s}_{column}" for s in steps for column in PER_STEP)]


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def flat(row: dict) -> dict[str, str]:
    """A row as the CSV's columns, as text (made inert only as it is written: `_cells`)."""
    data = {"file": row["file"], "exercise": row["exercise"], "total": str(row["total"]),
            "max_score": str(row["max_score"]), "status": row["status"], "reason": row["reason"],
            "seconds": f"{row['seconds']:.2f}", "sha256": row["sha256"]}
    data.update({step: str(score) for step, score in row["steps"].items()})
    for step, lost in row["lost"].items():
        data.update(zip((f"{step}_{column}" for column in PER_STEP), lost, strict=True))
    return data


def inert(text: str) -> str:
    """`text` as a spreadsheet shows it and never runs it: a cell starting with =, +, -, @, a tab or a carriage return
    is a formula to Excel, LibreOffice and Google Sheets (a candidate's exception class can be named
    `=HYPERLINK(...)`: the forty-fifth review), so it gets a leading ' (OWASP's advice on CSV injection); so does
    one that starts with ' already, so that `restored` gives back every text exactly."""
    return "'" + text if text[:1] in FORMULA_STARTS + ("'",) else text


def restored(text: str) -> str:
    """What `inert` was given: --resume compares the files' names and hashes of an earlier CSV as they were."""
    return text[1:] if text[:1] == "'" else text


def _cells(row: dict) -> dict:
    return {column: inert(text) if isinstance(text, str) else text for column, text in row.items()}


def step_columns(files: list[Path], exercise: str | None, earlier: list[dict] = ()) -> list[str]:
    """The steps of every exercise the files (and the earlier rows) are, in order of first appearance."""
    course = load_course()
    names = [row.get("exercise", "") for row in earlier]
    for path in files:
        try:
            names.append(find_exercise(path, exercise).name)
        except UsageError:
            pass
    steps: list[str] = []
    for name in dict.fromkeys(names):
        if name in course:
            steps += [s.id for s in course[name].steps if s.id not in steps]
    return steps


def to_csv(rows: list[dict], steps: list[str] | None = None) -> str:
    """The CSV of `rows` (as `grade_all` gives them, or flat, as read back) under `columns(steps)`."""
    import io

    if steps is None:
        steps = []
        for row in rows:
            steps += [s for s in row.get("steps", {}) if s not in steps]
    out = io.StringIO()
    _writer(out, steps, [row if "lost" not in row else flat(row) for row in rows])
    return out.getvalue()


def _writer(stream, steps: list[str], rows: list[dict]) -> csv.DictWriter:
    writer = csv.DictWriter(stream, columns(steps), restval="", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(_cells(row) for row in rows)
    return writer


class CsvOutput:
    """The CSV file, a row added (and flushed) as each file finishes, rewritten whole in the files' order at
    the end (`finish`); a Ctrl-C leaves the rows so far. Rows of an earlier run (--resume) are written first."""

    def __init__(self, path: Path, steps: list[str], earlier: list[dict] = ()):
        self.path = path
        self.steps = steps
        self._replace(list(earlier))
        self._file = open(path, "a", newline="", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        self._writer = csv.DictWriter(self._file, columns(steps), restval="", extrasaction="ignore")

    def add(self, row: dict) -> None:
        self._writer.writerow(_cells(flat(row)))
        self._file.flush()

    def finish(self, rows: list[dict]) -> None:
        """All the rows (flat), in their final order, in place of what was written as the files finished."""
        self._file.close()
        self._replace(rows)

    def _replace(self, rows: list[dict]) -> None:
        partial = self.path.with_name(self.path.name + ".partial")
        with open(partial, "w", newline="", encoding="utf-8", errors="backslashreplace") as stream:
            _writer(stream, self.steps, rows)
        os.replace(partial, self.path)


def read_earlier(path: Path) -> list[dict]:
    """The rows of an earlier run's CSV at `path` (flat); [] if there is none."""
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as stream:
            reader = csv.DictReader(stream)
            rows = [{column: restored(text) if isinstance(text, str) else text for column, text in row.items()}
                    for row in reader]
            fields = reader.fieldnames or []
    except FileNotFoundError:
        return []
    except (OSError, csv.Error) as error:
        raise UsageError(f"cannot read {path} to resume: {error}. "
                         "Pass --output the CSV of the run to resume.") from None
    if not {"file", "status", "sha256"} <= set(fields):
        raise UsageError(f"{path} is no CSV that attn-grade batch wrote (it has no file, status and sha256 "
                         "columns): pass --output the CSV of the run to resume, or leave out --resume.")
    return rows


def already_graded(earlier: list[dict], files: list[Path]) -> set[str]:
    """The files (as named) an earlier row graded as they are now: same path, same SHA-256, a grade's status."""
    rows = {row["file"]: row for row in earlier if row.get("status") in GRADED and row.get("sha256")}
    done = set()
    for path in files:
        row = rows.get(str(path))
        if row is not None:
            with contextlib.suppress(OSError):
                if hashlib.sha256(read_regular(path)).hexdigest() == row["sha256"]:  # bounded: review 54's F5
                    done.add(str(path))
    return done


def in_order(files: list[Path], rows: list[dict]) -> list[dict]:
    """Flat rows in the order of `files`; rows of files not among them last, in the order they came."""
    place = {str(path): i for i, path in enumerate(files)}
    return sorted(rows, key=lambda row: place.get(row["file"], len(place)))
