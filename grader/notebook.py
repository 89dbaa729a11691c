"""A Jupyter notebook as a candidate file: its code cells, read as JSON, become one Python file.

IPython's own syntax is not Python, so a line magic (`%timeit f()`) or a shell line
(`!pip install torch`) that starts a logical line becomes `pass` at the same indentation, and every
line of a cell magic (`%%bash`, `%%timeit`) an empty one. What the notebook's own check leaves out
of the file it grades (attn_grade.source_of_cells: calls, `display`, trying the code out) is left
out here too, so both grade one program. Each line of the Python file is one line of a
cell, so `where(line)` can say "cell 3, line 2" for an error at line N of the file. Cells
are counted from the top of the notebook, markdown cells included, as a reader counts them.
Nothing here runs the notebook: the worker imports the Python file like any other.

`PythonSource` is the Python a grade reads and imports, whichever the candidate handed in.

`practice` writes the other way: an exercise as a practice notebook (`attn-grade init --notebook`),
its contract as markdown, a cell per step holding the stub, and after each an `attn_grade.check` cell.
"""

from __future__ import annotations

import ast
import io
import json
import re
import shutil
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path

from attn_grade import DEFINITIONS, kept
from grader.exercise import UsageError
from grader.source import MAX_BYTES, UNPARSEABLE, file_bytes

SUFFIX = ".ipynb"
PENDING = 200  # the most lines of one logical line followed to its end, for the escapes at the start of the next
PENDING_CHARACTERS = 10_000  # and the most characters


@dataclass(frozen=True)
class Notebook:
    source: str  # the code cells as one Python file
    cells: tuple[tuple[int, int], ...]  # for each line of `source`: (cell, line in that cell), from 1

    def where(self, line: int) -> str:
        """Line `line` of `source` as the notebook's reader sees it."""
        if 1 <= line <= len(self.cells):
            cell, in_cell = self.cells[line - 1]
            return f"cell {cell}, line {in_cell}"
        return f"line {line}"


def utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8: no lone surrogate, which JSON's escapes can make and Python refuses."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def read(path: Path) -> Notebook:
    """The code cells of the notebook at `path`; UsageError when it is not one."""
    again = "Save it again from Jupyter, or export its code as a .py file and grade that."
    try:
        data = json.loads(file_bytes(path).decode("utf-8"))  # a regular file, of bounded size
    except (UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{path} is not a Jupyter notebook (not JSON: {error}). {again}") from None
    except RecursionError:  # JSON nested deeper than the parser goes: no notebook is
        raise UsageError(f"{path} is not a Jupyter notebook (its JSON is nested too deep to read). {again}") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise UsageError(f"{path} has no list of cells, as a Jupyter notebook (format 4) has. {again}")
    lines, where, cells_lines, code = [], [], [], 0
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(part, str) for part in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise UsageError(f"{path}: cell {number} has no text as its source. {again}")
        if not utf8(source):  # JSON's \ud800 escapes a lone surrogate, which no file of Python holds (review 65's F2)
            raise UsageError(f"{path}: cell {number} holds a character that is not text (a lone surrogate such as "
                             f"\\ud800): delete it. {again}")
        code += len(source.encode("utf-8", errors="replace"))
        if code > MAX_BYTES:  # before any cell is read as Python: 2 MiB of code parsed took 2.6 GB (review 54's F3)
            raise UsageError(f"{path.name}'s code cells hold more than {MAX_BYTES // 1024} KiB of code, the most the "
                             "grader reads: keep data out of the notebook.")
        cell_lines = re.split(r"\r\n|\r|\n", source.removesuffix("\n").removesuffix("\r"))  # Python's lines: splitlines
        # would also split at U+2028, a form feed and the like, which a comment may hold
        cell_lines = [] if cell_lines == [""] else cell_lines
        if cell_lines and cell_lines[0].lstrip().startswith("%%"):
            cell_lines = [""] * len(cell_lines)
        cells_lines.append((number, _without_escapes(cell_lines)))
    defined = set()
    for _, cell_lines in cells_lines:
        tree = _parsed(cell_lines)
        defined |= {node.name for node in (tree.body if tree else ()) if isinstance(node, DEFINITIONS)}
    for number, cell_lines in cells_lines:
        lines += _only_kept(cell_lines, defined)
        where += [(number, in_cell) for in_cell in range(1, len(cell_lines) + 1)]
    return Notebook("".join(line + "\n" for line in lines), tuple(where))


def _without_escapes(lines: list[str]) -> list[str]:
    """A line magic or shell line (`%timeit f()`, `!pip install x`) as `pass`: only where a logical line starts, as
    IPython reads them, so that a line of an expression that starts with `%` or `!=` stays (review 50's F6)."""
    out, pending, held = [], [], 0
    for line in lines:
        code = line.lstrip()
        if not pending and code.startswith(("%", "!")):
            line = line[: len(line) - len(code)] + "pass"
        out.append(line)
        pending.append(line)
        # a logical line of more than PENDING lines or PENDING_CHARACTERS is taken as ended: each test tokenises the
        # whole of it, so a cell that never closes a bracket cost time growing with the square of its lines (review
        # 53's F4), or of its length (review 54's F6)
        held += len(line)
        if len(pending) > PENDING or held > PENDING_CHARACTERS or _complete(pending):
            pending, held = [], 0
    return out


def _complete(lines: list[str]) -> bool:
    """Whether the lines end a logical line: no bracket, string or backslash continuation left open."""
    try:
        for _ in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            pass
    except tokenize.TokenError:
        return False
    except (SyntaxError, ValueError):  # not Python: the parse says so in its own words, at its own line
        return True
    return True


def _parsed(lines: list[str]) -> ast.Module | None:
    try:
        return ast.parse("\n".join(lines))
    except UNPARSEABLE:  # ten thousand minus signs, or nesting past the parser's depth, too (review 53's F1)
        return None


def _only_kept(lines: list[str], defined: set[str]) -> list[str]:
    """The cell with what the notebook's own check leaves out of the file as `pass` (attn_grade.source_of_cells: a
    call, `display(...)`, `report = attn_grade.check("mha")`, trying the code out), each line where it was, so that a
    notebook graded as a file is the program its check grades (review 50's F7). A cell that does not parse is kept
    whole: the grade says where its error is."""
    tree = _parsed(lines)
    if tree is None:
        return lines
    lines = list(lines)
    kept_lines = {n for node in tree.body if kept(node, defined) for n in range(node.lineno, node.end_lineno + 1)}
    for node in tree.body:
        span = range(node.lineno, node.end_lineno + 1)
        if kept(node, defined) or kept_lines & set(span):  # `x = 1; check()` on one line: the line stays
            continue
        for n in span:
            lines[n - 1] = "pass" if n == node.lineno else ""
    return lines


@dataclass(frozen=True)
class PythonSource:
    """The Python file the checks read and the worker imports: the candidate's own, or a notebook's code cells."""

    path: Path
    notebook: Notebook | None = None

    @classmethod
    def of(cls, path: Path) -> PythonSource:
        """`path` itself, or for a notebook (UsageError if it is none) its code cells as a Python file,
        written to a folder of its own where the worker cannot rewrite it: the checks read it for the rules."""
        if path.suffix != SUFFIX:
            return cls(path)
        notebook = read(path)
        python = Path(tempfile.mkdtemp(prefix="attn-grade-source-")) / f"{path.stem}.py"
        python.write_text(notebook.source, encoding="utf-8")
        return cls(python, notebook)

    def where(self, line: int) -> str:
        """A line of `path` as its author knows it: "line N", or "cell C, line M" in a notebook."""
        return self.notebook.where(line) if self.notebook is not None else f"line {line}"

    def remove(self) -> None:
        """Remove the Python file made from a notebook; a candidate's own file stays."""
        if self.notebook is not None:
            shutil.rmtree(self.path.parent, ignore_errors=True)


# -- practice notebooks: `attn-grade init --notebook` ------------------------------------------

NBFORMAT = {"nbformat": 4, "nbformat_minor": 5}
KERNEL = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
          "language_info": {"name": "python"}}


def practice(exercise, answers: str = "stub") -> dict:
    """The practice notebook of `exercise` (nbformat 4, as JSON data): its contract and why as markdown, a
    setup cell, then per step a markdown cell, a code cell holding the step (the stub's, or with
    answers="reference" the model answer's) and a check cell; a check of every step last."""
    import ast

    path = exercise.stub_path if answers == "stub" else exercise.stub_path.parent.parent / "solutions" / exercise.file
    text = path.read_text(encoding="utf-8")
    lines, tree = text.splitlines(), ast.parse(text)
    ids = [step.id for step in exercise.steps]
    setup, code, pending, end = [], {}, [], 0
    for i, node in enumerate(tree.body):
        segment = "\n".join(lines[end : node.end_lineno]).strip("\n")  # the comments above it too
        end = node.end_lineno
        if i == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
            continue  # the module's docstring: the markdown says it
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            continue  # a demo for `python FILE`; the check cells do it here
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in ids:
            code[node.name] = "\n\n".join([*pending, segment])
            pending = []
        elif code:
            pending.append(segment)
        else:
            setup.append(segment)
    if pending:  # definitions after the last step: they belong to it
        last = next(reversed(code))
        code[last] = "\n\n".join([code[last], *pending])
    docstring = ast.get_docstring(tree) or ""
    cells = [_markdown(f"# {exercise.title} ({exercise.name})\n\n{_contract(exercise)}"),
             _markdown(_statement(docstring, exercise)),
             _code("\n\n".join([*setup, "import attn_grade  # the checker: it grades in a process of its own"]))]
    for number, step in enumerate(exercise.steps, 1):
        cells.append(_markdown(f"## Step {number}: `{step.id}`, {step.title} ({step.points} points)\n\n"
                               "Write it in the next cell, run that cell, then run the check below it."))
        cells.append(_code(code.get(step.id, f"# {step.id}: not found in {path.name}")))
        cells.append(_code(f'attn_grade.check("{exercise.name}", "{step.id}")'))
    cells.append(_markdown("## Every step\n\nThe whole notebook, graded as `attn-grade` grades a file."))
    cells.append(_code(f'attn_grade.check("{exercise.name}")'))
    for number, cell in enumerate(cells):
        cell["id"] = f"{exercise.name}-{number}"[:64]  # nbformat 4.5's cell ids: the same notebook, the same bytes
    return {**NBFORMAT, "metadata": KERNEL, "cells": cells}


def init(folder: Path, exercises, force: bool = False) -> list[tuple[Path, Path | None]]:
    """Write each exercise's practice notebook, NAME.ipynb, into `folder` and start its progress, as
    `workspace.init` writes stubs: a notebook holding work is replaced only with `force`, after a backup."""
    from grader import workspace
    from grader.progress import Progress

    folder.mkdir(parents=True, exist_ok=True)
    targets = [(e, folder / (Path(e.file).stem + SUFFIX), json.dumps(practice(e), indent=1) + "\n")
               for e in exercises]
    changed = [path for _, path, text in targets if path.exists() and path.read_text(encoding="utf-8") != text]
    if changed and not force:
        names = ", ".join(str(path) for path in changed)
        raise UsageError(f"{names} already exist; pass --force to replace them "
                         "(your version is kept in a backup beside each).")
    backups = {}
    for path in changed:
        backups[path] = workspace.backup_path(path)
        shutil.copy2(path, backups[path])
    progress = Progress.find(folder) or Progress(folder)
    for exercise, path, text in targets:
        path.write_text(text, encoding="utf-8")
        progress.exercise(exercise.name)
    progress.save()
    return [(path, backups.get(path)) for _, path, _ in targets]


def _contract(exercise) -> str:
    contract = exercise.folder / "contract.md"
    return contract.read_text(encoding="utf-8").strip() if contract.exists() else ""


def _statement(docstring: str, exercise) -> str:
    """The stub's prose, with its commands for a file turned into the notebook's."""
    text = docstring.replace(f"attn-grade exercises/{exercise.file}", f'attn_grade.check("{exercise.name}")')
    return "## How to work here\n\n" + text + (
        "\n\nEach step's check grades every cell this notebook has run, in a grader process of its own: "
        "your code runs sandboxed there, never beside the checks. Re-run a step's cell after editing it.")


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def _code(text: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
            "source": text.splitlines(keepends=True)}
