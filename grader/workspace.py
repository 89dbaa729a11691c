"""A candidate's workspace: fresh stubs, a step's stub or model answer, by step name.

A step is a top-level function or class of the exercise file; its source is found with
`ast`, never by running the file. A stub copied into a workspace names the commands that
work there (`attn-grade watch mha.py`, not the kit's `attn-grade exercises/mha.py`).
"""

from __future__ import annotations

import ast
import hashlib
import shutil
from datetime import datetime
from pathlib import Path

from grader import notebook
from grader.exercise import Exercise, UsageError, load_course
from grader.progress import Progress
from grader.source import UNPARSEABLE, parse, segments
from grader.source import read as read_source


def init(folder: Path, exercises: list[Exercise], force: bool = False) -> list[tuple[Path, Path | None]]:
    """Copy fresh stubs into `folder` and start its progress file; refuse to overwrite work without force.

    Returns each file written with the backup its work was copied to first (as `reset` keeps one, see
    `backup_path`), None for a file that held no work (none, or a fresh stub).
    """
    folder.mkdir(parents=True, exist_ok=True)
    targets = [(e, folder / e.file) for e in exercises]
    for _, target in targets:
        if target.exists() and not target.is_file():
            raise UsageError(f"{target} is not a plain file (a folder?): move it away, or init another folder.")
    changed = [t for e, t in targets if t.exists()
               and _text(t, "replace") not in (stub_text(e), e.stub_path.read_text(encoding="utf-8"))]
    if changed and not force:
        names = ", ".join(str(t) for t in changed)
        has, it = ("have", "them with fresh stubs") if len(changed) > 1 else ("has", "it with a fresh stub")
        raise UsageError(f"{names} already {has} work in it; pass --force to replace {it} "
                         f"(your version is kept in a backup beside each).")
    backups = {}
    for target in changed:  # every backup before any stub: an error part way loses no work
        backups[target] = backup_path(target)
        shutil.copy2(target, backups[target])
    progress = Progress.find(folder) or Progress(folder)
    for exercise, target in targets:
        target.write_text(stub_text(exercise), encoding="utf-8")
        progress.exercise(exercise.name)
    progress.save()
    return [(t, backups.get(t)) for _, t in targets]


def stub_text(exercise: Exercise) -> str:
    """The stub as a workspace holds it: its "Grade your work with" command (and any other that names
    the kit's copy, exercises/FILE) is the one that works in the workspace folder."""
    text = exercise.stub_path.read_text(encoding="utf-8")
    return (text.replace(f"attn-grade exercises/{exercise.file}", f"attn-grade watch {exercise.file}")
            .replace(f"python exercises/{exercise.file}", f"python {exercise.file}"))


def backup_path(path: Path) -> Path:
    """Where `reset` and `init --force` keep the version they replace: FILE.bak-YYYYmmdd-HHMMSS beside it
    (-2, -3, ... when taken)."""
    stem = f"{path.name}.bak-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    found, n = path.with_name(stem), 1
    while found.exists():
        n += 1
        found = path.with_name(f"{stem}-{n}")
    return found


def reset(path: Path, exercise: Exercise, step_id: str | None, backup: Path) -> None:
    """Put the stub back into the candidate's file (only `step_id`'s definition, if given; the rest stays),
    after copying the file to `backup`. A file in a workspace gets the workspace's stub."""
    if path.suffix != ".py":
        raise UsageError(
            f"{path.name} is not a .py file; reset only rewrites Python files. Copy the stub's code by hand."
        )
    if step_id:
        text = _with_stub_step(path, exercise.stub_path, step_id)
    else:
        text = stub_text(exercise) if Progress.find(path.parent) else exercise.stub_path.read_text(encoding="utf-8")
    shutil.copy2(path, backup)
    path.write_text(text, encoding="utf-8")


def _text(path: Path, errors: str = "strict") -> str:
    """The user's file as text, or a usage error that says why not (a folder, unreadable, not UTF-8)."""
    try:
        return path.read_text(encoding="utf-8", errors=errors)
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text: save it as UTF-8, or reset the whole file.") from None
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror}.") from None


def step_source(path: Path, step_id: str) -> str:
    """The source of the top-level function or class `step_id` in the file at `path`."""
    text = path.read_text(encoding="utf-8")
    node = _find(text, step_id, path)
    return "\n".join(text.splitlines()[_first_line(node) - 1 : node.end_lineno]) + "\n"


def step_sources(path: Path, step_ids) -> dict[str, str | None] | None:
    """Each step's source as the file defines it last (None for a step it lacks); None when the file
    cannot be read or does not parse. A notebook's code cells are read as the grader reads them, a file within the
    grader's bounds (source.MAX_BYTES, MAX_DEPTH) only: watch reads it before each grade (review 54's F4)."""
    try:
        text = notebook.read(path).source if path.suffix == notebook.SUFFIX else read_source(path)
    except (OSError, UnicodeDecodeError, UsageError):
        return None
    tree = parse(text)
    if tree is None:
        return None
    steps = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in step_ids]
    found = dict(zip((node.name for node in steps), segments(text, steps), strict=True))
    return {step_id: found.get(step_id) for step_id in step_ids}


def step_versions(path: Path, exercise: Exercise) -> dict[str, str]:
    """A short hash of each step's source, for the steps written (not as the stub has them)."""
    ids = [step.id for step in exercise.steps]
    mine, stub = step_sources(path, ids) or {}, step_sources(exercise.stub_path, ids) or {}
    return {step_id: hashlib.sha256(source.encode()).hexdigest()[:16]
            for step_id, source in mine.items() if source and source != stub.get(step_id)}


def record_grade(path: Path, result) -> Progress | None:
    """Record a grade of the file at `path` in the workspace it lies in, if any; the workspace's progress."""
    progress = Progress.find(path.parent)
    if progress:
        progress.record_grade(result, step_versions(path, load_course()[result.exercise]))
        progress.save()
    return progress


def _with_stub_step(path: Path, stub: Path, step_id: str) -> str:
    """The candidate's file with the stub's version of one step in place of theirs."""
    text = _text(path)
    try:
        node = _find(text, step_id, path)
    except UsageError:
        raise UsageError(
            f"{path} has no {step_id} to reset (it does not parse, or the step is gone); reset the whole file."
        ) from None
    lines = text.splitlines()
    fresh = step_source(stub, step_id).rstrip("\n").splitlines()
    lines[_first_line(node) - 1 : node.end_lineno] = fresh
    return "\n".join(lines) + "\n"


def _find(text: str, step_id: str, path: Path):
    try:
        tree = ast.parse(text)
    except UNPARSEABLE as error:
        line = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        raise UsageError(f"{path} does not parse{line}: fix it or reset the whole file.") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == step_id:
            return node
    raise UsageError(f"{path} has no step {step_id}.")


def _first_line(node) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])
