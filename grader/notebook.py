"""A Jupyter notebook as a candidate file: its code cells, read as JSON, become one Python file.

IPython's own syntax is not Python, so a line magic (`%timeit f()`) or a shell line
(`!pip install torch`) becomes `pass` at the same indentation, and every line of a cell
magic (`%%bash`, `%%timeit`) an empty one. Each line of the Python file is one line of a
cell, so `where(line)` can say "cell 3, line 2" for an error at line N of the file. Cells
are counted from the top of the notebook, markdown cells included, as a reader counts them.
Nothing here runs the notebook: the worker imports the Python file like any other.

`PythonSource` is the Python a grade reads and imports, whichever the candidate handed in.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader.exercise import UsageError

SUFFIX = ".ipynb"


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


def read(path: Path) -> Notebook:
    """The code cells of the notebook at `path`; UsageError when it is not one."""
    again = "Save it again from Jupyter, or export its code as a .py file and grade that."
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise UsageError(f"{path} is not a Jupyter notebook (not JSON: {error}). {again}") from None
    except RecursionError:  # JSON nested deeper than the parser goes: no notebook is
        raise UsageError(f"{path} is not a Jupyter notebook (its JSON is nested too deep to read). {again}") from None
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise UsageError(f"{path} has no list of cells, as a Jupyter notebook (format 4) has. {again}")
    lines, where = [], []
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(part, str) for part in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise UsageError(f"{path}: cell {number} has no text as its source. {again}")
        cell_lines = source.splitlines()
        cell_magic = bool(cell_lines) and cell_lines[0].lstrip().startswith("%%")
        for in_cell, line in enumerate(cell_lines, 1):
            code = line.lstrip()
            if cell_magic:
                line = ""
            elif code.startswith(("%", "!")):
                line = line[: len(line) - len(code)] + "pass"
            lines.append(line)
            where.append((number, in_cell))
    return Notebook("".join(line + "\n" for line in lines), tuple(where))


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
