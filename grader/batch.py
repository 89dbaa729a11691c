"""Grade many candidate files in parallel worker processes, one CSV row per file.

Each of the `jobs` processes keeps one zygote (torch imported once) and grades files one
after another; a file that hangs, crashes or misbehaves costs only its own row. pytest
runs in each process's main thread, which is why the parallelism is processes, not threads.
"""

from __future__ import annotations

import csv
import io
import multiprocessing
import multiprocessing.util
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from grader.exercise import CANDIDATE_SUFFIXES, GraderBug, UsageError, find_exercise

_zygote = None  # each pool process's own


def find_files(paths: list[str]) -> list[Path]:
    """The files to grade: each path that is a file, and every .py and .ipynb under each folder
    (but in folders whose name starts with a dot, such as .ipynb_checkpoints or .git)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix in CANDIDATE_SUFFIXES and p.is_file()
                            and not any(part.startswith(".") for part in p.relative_to(path).parts[:-1]))
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"no such file or folder: {raw}. Pass candidate files or folders that hold them.")
    return found


def grade_all(files: list[Path], jobs: int, options: dict, on_progress=None) -> list[dict]:
    """One row per file, in the order given. A file whose exercise cannot be told (from --exercise or
    its name) gets its usage-error row at once; `on_progress(done, total)` counts the others as they finish."""
    rows: list[dict | None] = [None] * len(files)
    todo = []
    for i, path in enumerate(files):
        try:
            find_exercise(path, options.get("exercise"))
            todo.append(i)
        except UsageError as error:
            rows[i] = _row(str(path), f"usage error: {error}", 0.0)
    if todo:
        if on_progress:
            on_progress(0, len(todo))
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch or pytest state inherited
        with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start, initargs=(options,)) as pool:
            futures = {pool.submit(_grade_one, str(files[i]), options): i for i in todo}
            for done, future in enumerate(as_completed(futures), 1):
                rows[futures[future]] = future.result()
                if on_progress:
                    on_progress(done, len(todo))
    return rows


def progress_line(done: int, total: int, elapsed: float) -> str:
    """'grading: 3/9 files, about 12 s left': the time left comes from the files graded so far (none before the
    first)."""
    line = f"grading: {done}/{total} {plural(total, 'file')}"
    if 0 < done < total:
        left = round(elapsed / done * (total - done))
        line += f", about {left // 60} min {left % 60:02d} s left" if left >= 60 else f", about {left} s left"
    return line


def plural(count: int, noun: str) -> str:
    return noun if count == 1 else noun + "s"


def to_csv(rows: list[dict]) -> str:
    """Per step its score, then, after the totals, the first check it lost and that check's named mistake."""
    steps: list[str] = []
    for row in rows:
        steps += [s for s in row["steps"] if s not in steps]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["file", "exercise", *steps, "total", "max_score", "status", "seconds",
                     *(f"{s}_{column}" for s in steps for column in ("first_lost", "mistake"))])
    for row in rows:
        writer.writerow([row["file"], row["exercise"], *(row["steps"].get(s, "") for s in steps),
                         row["total"], row["max_score"], row["status"], f"{row['seconds']:.2f}",
                         *(value for s in steps for value in row["lost"].get(s, ("", "")))])
    return out.getvalue()


def _start(options: dict) -> None:
    global _zygote
    from grader.pool import Zygote

    _zygote = Zygote(warm_device=options.get("device") != "cpu")
    multiprocessing.util.Finalize(None, _zygote.close, exitpriority=10)  # the pool's exit ends it too


def _row(path: str, status: str, seconds: float, **graded) -> dict:
    row = {"file": path, "exercise": "", "steps": {}, "lost": {}, "total": 0, "max_score": 0}
    return dict(row, **graded, status=status, seconds=seconds)


def _grade_one(path: str, options: dict) -> dict:
    from grader.grade import grade

    start = time.monotonic()
    try:
        result = grade(path, zygote=_zygote, **options)
    except UsageError as error:
        return _row(path, f"usage error: {error}", time.monotonic() - start)
    except (GraderBug, Exception) as error:  # a grader fault costs this row, never the batch
        status = f"internal error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return _row(path, status, time.monotonic() - start)
    lost = {s.id: next(((c.name, c.mistake_id or "") for c in s.checks if c.points < c.max_points), ("", ""))
            for s in result.steps if s.score < s.max_score}
    return _row(path, "full marks" if result.full_marks else "points lost", time.monotonic() - start,
                exercise=result.exercise, total=result.score, max_score=result.max_score,
                steps={s.id: s.score for s in result.steps}, lost=lost)
