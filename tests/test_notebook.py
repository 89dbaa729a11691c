"""Candidate files that are not .py: Jupyter notebooks are graded by their code cells; anything else is a usage
error."""

import json

import pytest
from click.testing import CliRunner

from grader import cli, notebook
from grader.exercise import UsageError
from grader.grade import grade
from tests.conftest import REFERENCE, ROOT, explain


def write_notebook(path, cells):
    """A notebook (format 4) of (cell type, text) pairs, sources split into lines as Jupyter saves them."""
    data = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        {"cell_type": kind, "metadata": {}, "source": text.splitlines(keepends=True),
         **({"execution_count": None, "outputs": []} if kind == "code" else {})}
        for kind, text in cells
    ]}
    path.write_text(json.dumps(data))
    return path


MAGICS = [
    ("markdown", "# My attempt\nWe may not `import torch` in markdown: it is not code."),
    ("code", "%matplotlib inline\n!pip install torch\nimport torch"),
    ("code", "%%bash\necho this is no Python at all"),
    ("code", REFERENCE),
    ("code", "if True:\n    %time x = 1\n    !ls\n"),
]


def test_a_notebooks_code_cells_are_graded_with_magics_and_shell_lines_skipped(tmp_path, zygote):
    path = write_notebook(tmp_path / "attempt.ipynb", MAGICS)
    result = grade(path, "mha", zygote=zygote, device="cpu")
    assert result.full_marks, explain(result)
    assert result.file == str(path)


def test_the_command_line_grades_a_notebook(tmp_path):
    path = write_notebook(tmp_path / "attempt.ipynb", MAGICS)
    result = CliRunner().invoke(cli.main, [str(path), "--exercise", "mha", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "Total: 100/100" in result.output


def test_each_line_of_the_python_is_a_line_of_a_cell(tmp_path):
    read = notebook.read(write_notebook(tmp_path / "n.ipynb", [
        ("markdown", "# title"),
        ("code", "import torch\n%timeit torch.ones(1)\n"),
        ("code", "%%bash\nls\n"),
        ("code", "def f():\n    !ls\n    return 1"),
    ]))
    assert read.source == "import torch\npass\n\n\ndef f():\n    pass\n    return 1\n"
    assert read.where(1) == "cell 2, line 1" and read.where(3) == "cell 3, line 1" and read.where(7) == "cell 4, line 3"
    assert read.where(99) == "line 99"


def test_an_error_in_a_notebook_is_given_as_cell_and_line(tmp_path, zygote):
    cells = [("markdown", "# x"), ("code", "import torch"), ("code", "x = 1\ndef f(:\n    pass")]
    broken = write_notebook(tmp_path / "broken.ipynb", cells)
    result = grade(broken, "mha", zygote=zygote, device="cpu")
    assert result.score == 0
    assert result.environment["file_error"] == "could not import: SyntaxError at cell 3, line 2: invalid syntax"

    raising = REFERENCE + "\n\ndef softmax(scores, dim=-1):\n    raise ValueError('not yet')\n"
    line = len(raising.splitlines())
    raises = write_notebook(tmp_path / "raises.ipynb", [("code", "import torch"), ("code", raising)])
    result = grade(raises, "mha", zygote=zygote, device="cpu")
    messages = {c.message for s in result.steps if s.id == "softmax" for c in s.checks}
    assert {m.split(" [called with")[0] for m in messages} == {
        f"ValueError: not yet at cell 2, line {line}: `raise ValueError('not yet')`"}, explain(result)


def test_the_rules_read_the_code_cells_not_the_notebooks_json(tmp_path, zygote):
    numpy_reference = (ROOT / "solutions" / "mha_numpy.py").read_text()
    cells = [("markdown", "No `import torch` here."), ("code", numpy_reference)]
    clean = write_notebook(tmp_path / "clean.ipynb", cells)
    assert grade(clean, "mha_numpy", zygote=zygote).full_marks
    torch_cell = write_notebook(tmp_path / "torch.ipynb", [("code", numpy_reference), ("code", "import torch")])
    result = grade(torch_cell, "mha_numpy", zygote=zygote)
    assert not result.full_marks and "imports torch" in explain(result), explain(result)


@pytest.mark.parametrize("text, says", [
    ("{oops", "is not a Jupyter notebook (not JSON"),
    ("[1, 2]", "has no list of cells"),
    ('{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deep"),  # once a RecursionError: exit 3
    ('{"cells": [{"cell_type": "code", "source": 3}]}', "cell 1 has no text as its source"),
])
def test_a_broken_notebook_is_a_usage_error(tmp_path, text, says):
    path = tmp_path / "attempt.ipynb"
    path.write_text(text)
    with pytest.raises(UsageError, match="Save it again from Jupyter"):
        notebook.read(path)
    result = CliRunner().invoke(cli.main, [str(path), "--exercise", "mha"])
    assert result.exit_code == 2 and says in result.output, result.output


@pytest.mark.parametrize("name", ["mha.txt", "mha", "mha.py.bak"])
def test_a_file_that_is_neither_python_nor_a_notebook_is_a_usage_error(tmp_path, name):
    path = tmp_path / name
    path.write_text(REFERENCE)
    result = CliRunner().invoke(cli.main, [str(path), "--exercise", "mha"])
    assert result.exit_code == 2, result.output
    assert "is neither a Python file (.py) nor a Jupyter notebook (.ipynb)" in result.output
    assert "Total" not in result.output  # never graded, never a zero


def test_a_cell_is_split_into_lines_as_python_splits_a_file(tmp_path):
    """Review 49: a comment holding a pasted U+2028 (or a form feed) split the cell's line, and a correct notebook
    scored 0 with a SyntaxError; Python ends lines only at \\n, \\r\\n and \\r."""
    code = "x = 1  # a pasted\u2028line separator\ny = 2  # a form\x0cfeed\r\nz = 3\n"
    write_notebook(tmp_path / "nb.ipynb", [("code", code), ("code", "%time w = 4\n")])
    read = notebook.read(tmp_path / "nb.ipynb")
    assert read.source == "x = 1  # a pasted\u2028line separator\ny = 2  # a form\x0cfeed\nz = 3\npass\n"
    assert read.cells == ((1, 1), (1, 2), (1, 3), (2, 1))
    compile(read.source, "nb", "exec")


def test_an_expression_line_that_starts_with_an_operator_is_no_magic(tmp_path):
    """Review 50's F6: IPython reads a magic or a shell line only where a logical line starts; a line of an
    expression broken before `%` or `!=` (Black's style) became `pass`, and a correct notebook scored 0."""
    code = "n = (7\n     % 3)\nok = (n\n      != 2)\ns = '''\n%not a magic\n'''\nt = 1 \\\n    != 2\n%time u = 1\n"
    read = notebook.read(write_notebook(tmp_path / "nb.ipynb", [("code", code)]))
    namespace = {}
    exec(compile(read.source, "nb", "exec"), namespace)  # noqa: S102 (the test's own code)
    assert (namespace["n"], namespace["ok"], namespace["t"]) == (1, True, True) and "%not a magic" in namespace["s"]
    assert read.source.endswith("\npass\n") and len(read.cells) == len(code.splitlines())


def test_a_notebook_graded_as_a_file_leaves_out_what_its_check_leaves_out(tmp_path, zygote):
    """Review 50's F7: a notebook that kept its check's report (`report = attn_grade.check("mha")`) or called
    Jupyter's `display` scored 100 in the notebook and 0 as a file (NameError at import). The file is the program the
    notebook's check grades (attn_grade.source_of_cells); a cell that does not parse is kept, for its error."""
    cells = [("code", "import torch\nimport attn_grade"), ("code", REFERENCE),
             ("code", "x = torch.randn(1, 4, 8)\ndisplay(split_heads(x, 2).shape)\nshape = split_heads(x, 2).shape"),
             ("code", 'report = attn_grade.check("mha")\nreport.score\nprint(undefined_name)')]
    path = write_notebook(tmp_path / "kept.ipynb", cells)
    read = notebook.read(path)
    assert "display" not in read.source and "attn_grade" not in read.source and "shape =" not in read.source
    assert "x = torch.randn(1, 4, 8)" in read.source and len(read.cells) == len(read.source.splitlines())
    assert grade(path, "mha", zygote=zygote, device="cpu").full_marks


def test_a_cell_the_parser_cannot_hold_is_a_cell_that_does_not_parse(tmp_path, zygote):
    """Review 53's F1: a cell of ten thousand minus signs (the parser's MemoryError), or a sum nested past its
    depth (RecursionError), made the grade of a notebook exit 3. It is a cell that does not parse: scored 0 like
    any such file, and a grade of the rest is not attempted."""
    for cell in ("x = " + "-" * 10000 + "1", "x = " + "(" * 300 + "1" + ")" * 300):
        path = write_notebook(tmp_path / "attempt.ipynb", [("code", REFERENCE), ("code", cell)])
        result = grade(path, "mha", zygote=zygote, device="cpu")
        assert result.score == 0, explain(result)


def test_a_cell_that_never_closes_its_bracket_is_read_in_bounded_time(tmp_path, zygote):
    """Review 53's F4: each line of a logical line still open was tested by tokenising every line of it again, so a
    cell of thousands of lines inside one bracket cost time growing with their square (55 KB, 132 s of the file's
    20): a logical line is followed for notebook.PENDING lines at most, and the rest of the notebook keeps its
    points."""
    opened = "x = [\n" + "    1,\n" * 8000 + "]\n"
    path = write_notebook(tmp_path / "attempt.ipynb", [("code", REFERENCE), ("code", opened)])
    assert len(notebook._without_escapes(opened.splitlines())) == 8002
    result = grade(path, "mha", zygote=zygote, device="cpu", file_timeout=20)
    assert result.full_marks, explain(result)


def test_a_notebook_of_too_much_code_is_refused_before_its_cells_are_read(tmp_path):
    """Review 54's F3: the cells of a notebook were parsed before the 512 KiB limit was asked (2 MiB of code, 2.6 GB):
    the code's size is counted first. F6: a logical line of long lines is followed for PENDING_CHARACTERS at most."""
    from grader import source

    path = write_notebook(tmp_path / "attempt.ipynb", [("code", REFERENCE), ("code", "a\n" * source.MAX_BYTES)])
    with pytest.raises(UsageError, match="KiB of code"):
        notebook.read(path)
    long = ["x = ["] + ["1," * 2000] * 200 + ["]"]
    assert notebook._without_escapes(long) == long
