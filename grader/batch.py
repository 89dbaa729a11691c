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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from grader.exercise import GraderBug, UsageError, load_manifest

_zygote = None  # each pool process's own


def find_files(paths: list[str]) -> list[Path]:
    """The files to grade: each path that is a file, and every exercise file under each folder."""
    names = {e.file for e in load_manifest().values()}
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.py") if p.name in names)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"no such file or folder: {raw}. Pass candidate files or folders that hold them.")
    return found


def grade_all(files: list[Path], jobs: int, options: dict, on_done=None) -> list[dict]:
    """One row per file, in the order given; `on_done(row)` is called as each finishes."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch or pytest state inherited
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_start, initargs=(options,)) as pool:
        futures = [pool.submit(_grade_one, str(f), options) for f in files]
        rows = []
        for future in futures:
            row = future.result()
            rows.append(row)
            if on_done:
                on_done(row)
    return rows


def to_csv(rows: list[dict]) -> str:
    steps: list[str] = []
    for row in rows:
        steps += [s for s in row["steps"] if s not in steps]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["file", "exercise", *steps, "total", "max_score", "status", "seconds"])
    for row in rows:
        writer.writerow([row["file"], row["exercise"], *(row["steps"].get(s, "") for s in steps),
                         row["total"], row["max_score"], row["status"], f"{row['seconds']:.2f}"])
    return out.getvalue()


def _start(options: dict) -> None:
    global _zygote
    from grader.candidate import Zygote

    _zygote = Zygote(warm_device=options.get("device") != "cpu")
    multiprocessing.util.Finalize(None, _zygote.close, exitpriority=10)  # the pool's exit ends it too


def _grade_one(path: str, options: dict) -> dict:
    from grader.grade import grade

    start = time.monotonic()
    row = {"file": path, "exercise": "", "steps": {}, "total": 0, "max_score": 0}
    try:
        result = grade(path, zygote=_zygote, **options)
    except UsageError as error:
        status = f"usage error: {error}"
    except (GraderBug, Exception) as error:  # a grader fault costs this row, never the batch
        status = f"internal error: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    else:
        row.update(exercise=result.exercise, total=result.score, max_score=result.max_score,
                   steps={s.id: s.score for s in result.steps})
        status = "full marks" if result.full_marks else "points lost"
    return dict(row, status=status, seconds=time.monotonic() - start)
