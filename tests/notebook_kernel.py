"""Run notebooks as a learner does, headless: nbclient with an ipykernel, cells in order, outputs read back.

Shared by tests/test_notebook_check.py and tests/test_notebook_practice.py. Without nbclient or
ipykernel (the test and notebook extras) those tests skip, saying how to install them; .ci/run sets
ATTN_GRADE_REQUIRE_NOTEBOOKS=1, so in CI they fail instead.
"""

from __future__ import annotations

import json
import os

import pytest

MIME = "application/vnd.attn-grade+json"
MISSING = "needs nbclient, nbformat and ipykernel: pip install -e '.[test,notebook]'"


def require_kernel():
    """nbclient and nbformat, or a skip (a failure where CI requires them)."""
    try:
        import ipykernel  # noqa: F401
        import nbclient
        import nbformat
    except ImportError:
        if os.environ.get("ATTN_GRADE_REQUIRE_NOTEBOOKS"):
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return nbclient, nbformat


def execute(notebook: dict, folder, timeout: int = 240) -> list[dict]:
    """Execute `notebook` (nbformat 4 as JSON data) in a fresh kernel whose working folder is `folder`;
    the executed cells."""
    nbclient, nbformat = require_kernel()
    nb = nbformat.reads(json.dumps(notebook), as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()
    return nb.cells


def of_cells(*sources: str) -> dict:
    """A notebook of code cells."""
    cells = [{"cell_type": "code", "id": f"cell-{i}", "metadata": {}, "execution_count": None, "outputs": [],
              "source": text.splitlines(keepends=True)} for i, text in enumerate(sources)]
    kernel = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": kernel, "cells": cells}


def checks(cells) -> list[dict]:
    """Each check's result, in order: the data its output carries beside the HTML (attn_grade.MIME)."""
    return [output["data"][MIME] | {"html": output["data"]["text/html"]}
            for cell in cells if cell.get("cell_type") == "code"
            for output in cell.get("outputs", []) if MIME in output.get("data", {})]


def last_value(cells) -> str:
    """The text/plain of the last cell's value."""
    outputs = [o for o in cells[-1].get("outputs", []) if "data" in o]
    return outputs[-1]["data"]["text/plain"] if outputs else ""
