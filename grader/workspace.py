"""A candidate's workspace: fresh stubs, a step's stub or model answer, by step name.

A step is a top-level function or class of the exercise file; its source is found with
`ast`, never by running the file.
"""

from __future__ import annotations

import ast
import hashlib
import shutil
from pathlib import Path

from grader import notebook
from grader.exercise import Exercise, UsageError, load_manifest
from grader.progress import Progress


def init(folder: Path, exercises: list[Exercise], force: bool = False) -> list[Path]:
    """Copy fresh stubs into `folder` and start its progress file; refuse to overwrite work without force."""
    folder.mkdir(parents=True, exist_ok=True)
    targets = [(e, folder / e.file) for e in exercises]
    changed = [t for e, t in targets if t.exists() and t.read_bytes() != e.stub_path.read_bytes()]
    if changed and not force:
        names = ", ".join(str(t) for t in changed)
        raise UsageError(f"{names} already has work in it; pass --force to replace it with a fresh stub.")
    progress = Progress.find(folder) or Progress(folder)
    for exercise, target in targets:
        shutil.copyfile(exercise.stub_path, target)
        progress.exercise(exercise.name)
    progress.save()
    return [t for _, t in targets]


def step_source(path: Path, step_id: str) -> str:
    """The source of the top-level function or class `step_id` in the file at `path`."""
    text = path.read_text(encoding="utf-8")
    node = _find(text, step_id, path)
    return "\n".join(text.splitlines()[_first_line(node) - 1 : node.end_lineno]) + "\n"


def step_sources(path: Path, step_ids) -> dict[str, str | None] | None:
    """Each step's source as the file defines it last (None for a step it lacks); None when the file
    cannot be read or does not parse. A notebook's code cells are read as the grader reads them."""
    try:
        text = notebook.read(path).source if path.suffix == notebook.SUFFIX else path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, UnicodeDecodeError, UsageError, SyntaxError, ValueError):
        return None
    found = {node.name: ast.get_source_segment(text, node) for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in step_ids}
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
        progress.record_grade(result, step_versions(path, load_manifest()[result.exercise]))
        progress.save()
    return progress


def reset_step(path: Path, stub: Path, step_id: str) -> None:
    """Put the stub's version of one step back into the candidate's file, leaving the rest as it is."""
    text = path.read_text(encoding="utf-8")
    try:
        node = _find(text, step_id, path)
    except UsageError:
        raise UsageError(f"{path} has no {step_id} to reset (it does not parse, or the step is gone); reset the whole file.")
    lines = text.splitlines()
    fresh = step_source(stub, step_id).rstrip("\n").splitlines()
    lines[_first_line(node) - 1 : node.end_lineno] = fresh
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _find(text: str, step_id: str, path: Path):
    try:
        tree = ast.parse(text)
    except SyntaxError as error:
        raise UsageError(f"{path} does not parse (line {error.lineno}): fix it or reset the whole file.") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == step_id:
            return node
    raise UsageError(f"{path} has no step {step_id}.")


def _first_line(node) -> int:
    return min([node.lineno, *(d.lineno for d in node.decorator_list)])
