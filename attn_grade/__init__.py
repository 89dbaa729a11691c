"""Check your attention exercises from a Jupyter or Colab notebook: `attn_grade.check("mha")`.

    import attn_grade
    attn_grade.check("mha")             # every step of mha, graded
    attn_grade.check("mha", "softmax")  # one step (the whole notebook is graded; that step is shown)

What your cells defined (their imports, functions, classes and constants, in the order the kernel
ran them) becomes one Python file, graded exactly as `attn-grade FILE` grades a file: by a grader
process this module starts once per kernel and keeps warm, whose sandboxed worker runs your code.
This kernel never imports the grader, the model answers or the checks, and never runs a check, so
nothing a cell does here (patching torch, or this module) can change a score.

This module imports nothing of the grader's and nothing outside the standard library but IPython.
"""

from __future__ import annotations

import ast
import atexit
import json
import os
import subprocess
import sys
import tempfile

__all__ = ["Report", "check", "source_of_cells"]

MIME = "application/vnd.attn-grade+json"  # the grade as data, beside the HTML and the text
KEPT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
        ast.Assign, ast.AnnAssign, ast.AugAssign, ast.If, ast.Try, ast.Pass)
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
NOT_IN_THE_FILE = ("attn_grade", "get_ipython", "display")  # the notebook's own machinery


class Report:
    """A check's result: `score`, `max_score`, `steps` ({id: (score, max)}), `text`, and `html`, which a
    notebook shows (its `_repr_html_`)."""

    def __init__(self, reply: dict, exercise: str, steps: tuple[str, ...]):
        self.exercise, self.checked = exercise, steps
        self.steps = {k: tuple(v) for k, v in reply["steps"].items()}
        shown = [self.steps[s] for s in steps] if steps else list(self.steps.values())
        self.score, self.max_score = sum(s for s, _ in shown), sum(m for _, m in shown)
        self.file_score, self.file_max_score = reply["score"], reply["max_score"]
        self.text, self.html, self.data = reply["text"], reply["html"], reply["json"]
        self.recorded = reply.get("recorded")

    @property
    def full_marks(self) -> bool:
        return self.score == self.max_score

    def _repr_html_(self) -> str:
        return self.html

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        summary = {"exercise": self.exercise, "checked": list(self.checked), "score": self.score,
                   "max_score": self.max_score, "file_score": self.file_score,
                   "file_max_score": self.file_max_score, "steps": self.steps, "report": self.data,
                   "recorded": self.recorded}
        return {"text/html": self.html, "text/plain": repr(self), MIME: summary}

    def __repr__(self) -> str:
        if not self.checked:
            return self.text
        shown = ", ".join(f"{s} {self.steps[s][0]}/{self.steps[s][1]}" for s in self.checked)
        return f"{self.exercise}: {shown} (whole notebook {self.file_score}/{self.file_max_score})"


def check(exercise: str, *steps: str, source: str | None = None, device: str = "auto", seed: int = 0) -> Report:
    """Grade what this notebook's cells defined as `exercise` (all its steps, or only `steps` shown).

    `source` grades that Python text instead of the cells (outside a notebook, say). Lost points are
    no error: the report says what was lost and why.
    """
    _arguments_checked(exercise, steps, source, device, seed)
    shell = _shell()
    if source is None:
        if shell is None:
            raise RuntimeError("attn_grade.check reads the cells of a Jupyter or Colab notebook; outside one, "
                               "grade a file with `attn-grade FILE`, or pass source=the code.")
        source = source_of_cells(_executed_cells(shell))
    name = shell.user_ns.get("__session__") if shell is not None else None
    request = {"exercise": exercise, "steps": list(steps), "source": source,
               "workspace": os.getcwd(), "options": {"device": device, "seed": seed},
               "name": os.path.basename(name) if isinstance(name, str) and name else None}
    reply = _grader().ask(request)
    if not reply.get("ok"):
        raise ValueError(f"attn_grade.check: {reply.get('error')}")
    return Report(reply, exercise, steps)


def _arguments_checked(exercise, steps, source, device, seed) -> None:
    """A wrong argument is the caller's, said in one line (not the grader's internal error)."""
    if not isinstance(exercise, str):
        raise TypeError(f"attn_grade.check: the exercise is a name, e.g. check('mha'), not {type(exercise).__name__}")
    if not all(isinstance(step, str) for step in steps):
        raise TypeError("attn_grade.check: steps are names, each its own argument, e.g. check('mha', 'softmax', "
                        "'split_heads')")
    if source is not None and not isinstance(source, str):
        raise TypeError(f"attn_grade.check: source is Python text (a str), not {type(source).__name__}")
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"attn_grade.check: device is 'auto', 'cpu' or 'cuda', not {device!r}")
    if type(seed) is not int or not 0 <= seed < 2**63:
        raise ValueError(f"attn_grade.check: seed is an int from 0 to 2**63 - 1, not {seed!r}")


def source_of_cells(cells) -> str:
    """The Python file that the cells (in the order they ran) make: imports, definitions and constants.

    A statement that only does something (a call, a print, a loop, a magic or shell line, which IPython
    turns into a call) is left out, as is an assignment that calls a function or class the cells define
    (`out = model(x)`: trying the code out is no part of the answer) or that changes an object rather
    than names one (`torch.allclose = ...`), and anything naming attn_grade.
    A cell that does not parse never ran: it is left out too.

    Cells run again make no longer a file: of a function or class defined several times only the last
    definition is kept (where it was run), of a statement run several times word for word only the first.
    So a check after re-running one step's cell finds only that step changed, and regrades only it, as
    `watch` regrades a saved file.
    """
    trees = []
    for number, cell in enumerate(cells, 1):
        try:
            trees.append((number, cell, ast.parse(cell)))
        except (SyntaxError, ValueError):
            continue
    defined = {node.name for _, _, tree in trees for node in tree.body
               if isinstance(node, DEFINITIONS)}
    found = []  # (cell, the key that makes a repeat the same, its text)
    for number, cell, tree in trees:
        lines = cell.splitlines()
        for node in tree.body:
            if isinstance(node, ast.Import) and any(_names(a) & set(NOT_IN_THE_FILE) for a in node.names):
                others = [a for a in node.names if not _names(a) & set(NOT_IN_THE_FILE)]
                if others:  # `import sys, attn_grade`: the file imports sys
                    text = ast.unparse(ast.Import(names=others))
                    found.append((number, ("statement", text), text))
            elif kept(node, defined):
                text = _segment(cell, lines, node)
                named = isinstance(node, DEFINITIONS)
                found.append((number, ("definition", node.name) if named else ("statement", text), text))
    last = {key: i for i, (_, key, _) in enumerate(found) if key[0] == "definition"}
    first = {}
    for i, (_, key, _) in enumerate(found):
        first.setdefault(key, i)
    chosen = [(number, text) for i, (number, key, text) in enumerate(found)
            if i == (last[key] if key[0] == "definition" else first[key])]
    parts = []
    for number, text in chosen:
        if parts and parts[-1][0] == number:
            parts[-1][1].append(text)
        else:
            parts.append((number, [text]))
    return "\n\n\n".join(f"# cell {number}\n" + "\n\n".join(texts) for number, texts in parts) + "\n"


def _segment(cell: str, lines: list[str], node: ast.stmt) -> str:
    """A top-level statement's text: a compound one (a def, its decorators) by whole lines, a simple one
    exactly (`x = 1; check()` is two statements on a line)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.Try)):
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        return "\n".join(lines[first - 1 : node.end_lineno])
    return ast.get_source_segment(cell, node)


def kept(node: ast.AST, defined: set[str]) -> bool:
    """Whether a top-level statement is part of the file the cells make (a notebook graded as a file keeps the same,
    grader/notebook.py)."""
    if not isinstance(node, KEPT):
        return False
    if isinstance(node, DEFINITIONS):
        return True
    if _names(node) & set(NOT_IN_THE_FILE):
        return False
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Store))
                   for target in targets for n in ast.walk(target)):
            return False  # `torch.allclose = ...`, `d[k] = ...`: changing an object is doing, not defining
        value = node.value
        return value is None or not any(isinstance(n, ast.Call) and _names(n.func) & defined for n in ast.walk(value))
    if isinstance(node, (ast.If, ast.Try)):  # a constant or import chosen at run time: only what may be kept
        bodies = [node.body, node.orelse, *([h.body for h in node.handlers] + [node.finalbody]
                                            if isinstance(node, ast.Try) else [])]
        return all(kept(child, defined) for body in bodies for child in body)
    return True


def _names(node: ast.AST) -> set[str]:
    """Every name a statement reads or imports (the root of a dotted import: attn_grade of attn_grade.x)."""
    found = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            found.add(n.id)
        elif isinstance(n, ast.alias):
            found.add(n.name.split(".")[0])
        elif isinstance(n, ast.ImportFrom) and n.module:
            found.add(n.module.split(".")[0])
    return found


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _executed_cells(shell) -> list[str]:
    """The cells the kernel ran, in order, as Python (IPython has turned magics into calls)."""
    cells = shell.user_ns.get("In")
    if not isinstance(cells, list):
        cells = list(shell.history_manager.input_hist_parsed)
    return [cell for cell in cells[1:] if isinstance(cell, str)]


class _Grader:
    """The grader process, kept for the kernel's life: `python -m grader.notebook_grader`, a JSON line each way."""

    def __init__(self):
        self.log = tempfile.TemporaryFile(mode="w+", prefix="attn-grade-serve-")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "grader.notebook_grader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, encoding="utf-8",
            start_new_session=True,  # the kernel's interrupt (Ctrl-C to its group) leaves it warm
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def ask(self, request: dict) -> dict:
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except KeyboardInterrupt:  # the kernel was interrupted mid-grade: the reply would come out of turn
            self.close()
            raise
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.close()
            self.log.seek(0)
            said = self.log.read()[-2000:]
            raise RuntimeError("attn_grade: the grader process stopped. Is attn-grade installed in this kernel's "
                               f"Python ({sys.executable})? What it said:\n{said}")
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


_GRADER: _Grader | None = None


def _grader() -> _Grader:
    global _GRADER
    if _GRADER is None or not _GRADER.alive():
        _GRADER = _Grader()
    return _GRADER


@atexit.register
def _stop() -> None:
    if _GRADER is not None:
        _GRADER.close()
