"""A whole grade, stage by stage: find the exercise, start its worker, run the checks, score.

Reports are the last stage (grader/report.py); this module returns the Grade they print.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib.metadata
import sys
from dataclasses import replace
from pathlib import Path

from grader import notebook, source
from grader.candidate import (
    DEFAULT_FILE_TIMEOUT,
    DEFAULT_MEMORY_LIMIT_MB,
    DEFAULT_TIMEOUT,
    Candidate,
    CandidateError,
)
from grader.exercise import GRADER_DIR, UsageError, check_requirements, find_exercise, tomllib
from grader.pool import Zygote
from grader.progress import now
from grader.score import Grade, score

DEVICES = ("auto", "cpu", "cuda")


def grade(
    path: str | Path,
    exercise: str | None = None,
    device: str = "auto",
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB,
    file_timeout: float = DEFAULT_FILE_TIMEOUT,
    zygote: Zygote | None = None,
    cache: dict | None = None,
) -> Grade:
    """Grade one candidate file. Raises UsageError for bad input, GraderBug for a fault of the grader's.

    Pass a `zygote` to grade many files in a row without importing torch for each, and a
    `cache` (a dict kept between grades of one file) to run only the checks whose step changed.
    """
    if device not in DEVICES:
        raise UsageError(f"unknown device '{device}'; use one of {', '.join(DEVICES)}.")
    path = Path(path)
    found = find_exercise(path, exercise)
    check_requirements(found)
    data = source.file_bytes(path)  # a regular file of bounded size, or a usage error
    if path.suffix == notebook.SUFFIX:  # the Python its code cells make is what runs
        source.decoded(notebook.read(path).source.encode("utf-8"), path.name)
    else:
        source.decoded(data, path.name)
    about = {"seed": seed, "sha256": hashlib.sha256(data).hexdigest(), "graded_at": now()}
    warm = found.device_checks and device != "cpu"
    stand_ins = found.folder / "stand_ins.py"
    candidate = Candidate(path, timeout, memory_limit_mb, file_timeout, warm_device=warm, zygote=zygote,
                          stand_ins=stand_ins if stand_ins.exists() else None,
                          processes=warm and "triton" in found.requires)  # Triton compiles with cc and ptxas
    with candidate:
        # The worker is importing torch now; the grader imports pytest and torch beside it (and looks up
        # its own version, which takes a while, only now).
        with _imports_without_gc():
            about["kit_version"] = kit_version()
            import torch

            from grader.run_checks import run_checks
        # The grader's tensors are small: a second thread only spins, and takes the core the worker and,
        # in a batch, the other grades need.
        torch.set_num_threads(1)

        try:  # the worker's view decides: it is where the candidate's code runs
            cuda = candidate.ready()["cuda"]
        except CandidateError:  # the file does not import: every check says so, whatever the device
            cuda = torch.cuda.is_available()
        if device == "cuda" and not cuda:
            raise UsageError("--device cuda: torch sees no CUDA device here. "
                             "Use --device auto to check on the meta device instead.")
        # The device checks run on CUDA, or on the meta device as a stand-in; --device cpu runs them on the
        # CPU. An exercise without them (NumPy) says so rather than skipping them silently.
        under_test = "none" if not found.device_checks else "cpu" if device == "cpu" else "cuda" if cuda else "meta"
        outcomes = run_checks(found, candidate, seed, under_test, timeout, cache)
        environment = {"torch": torch.__version__, "device": under_test, "cuda_available": cuda,
                       "fs_isolation": candidate.fs_isolated is True}
        if candidate.limits:
            environment["limits"] = candidate.limits
        problem = _file_problem(found, candidate, path)
        if problem:
            environment["file_error"] = problem
        return replace(score(found, outcomes, shown(path), environment, candidate.output), **about)


def shown(path: Path) -> str:
    """The file's name as every report shows it: a byte that is no UTF-8, or a control character (a newline in a
    folder's name would forge a report's line), escaped."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) < 0xE000 else repr(c)[1:-1] for c in str(path))


@contextlib.contextmanager
def _imports_without_gc():
    """No garbage collection while torch and pytest load: each full collection on the way walks
    hundreds of thousands of new objects (a tenth of the imports' time). Then what they made is
    frozen, so the collections while the checks run walk only what the checks make. Once a
    process: a later grade (batch, watch) would freeze its predecessors' uncollected garbage."""
    if "grader.run_checks" in sys.modules:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


@functools.cache
def kit_version() -> str:
    """attn-grade's version: the installed distribution's, else (a checkout run uninstalled) pyproject.toml's."""
    try:
        return importlib.metadata.version("attn-grade")
    except importlib.metadata.PackageNotFoundError:
        try:
            pyproject = (GRADER_DIR.parent / "pyproject.toml").read_text(encoding="utf-8")
            return tomllib.loads(pyproject)["project"]["version"]
        except (OSError, KeyError, ValueError):
            return "unknown"


def _file_problem(exercise, candidate: Candidate, path: Path) -> str | None:
    """What stops the whole file from being graded, said once for the file rather than per check."""
    if candidate.import_error:
        return candidate.import_error
    steps = [step.id for step in exercise.steps]
    if candidate.missing >= set(steps):
        return (f"{path.name} defines none of {', '.join(steps)}: "
                "start from the stub (attn-grade init writes one) and keep its names.")
    return None
