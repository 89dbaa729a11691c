"""Stage 3 of a grade: run an exercise's hidden checks (its spec, grader/course/NAME/spec.py) on a candidate.

pytest runs in the grader's process with plugin autoloading off, the grader's own ini
file, rootdir and confcutdir, so nothing beside the candidate file (a conftest.py, a
pytest.ini) takes part. A small plugin collects the exercise's spec module through the
engine (grader/engine/runner.py) and one CheckResult per check, reading the step and check
each item carries and the exception itself rather than pytest's text.
pytest-timeout is the last-resort bound on every check; the worker's own per-call
deadline normally ends a hang long before.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import hashlib
import importlib
import io
import os
import re
from dataclasses import replace

import pytest

from grader import keys
from grader.candidate import Candidate, CandidateError
from grader.engine.failure import CheckFailed
from grader.engine.runner import Context, SpecFile, SpecItem, is_spec
from grader.engine.spec import ALWAYS, ON_META
from grader.exercise import ENGINE_DIR, Exercise, GraderBug
from grader.score import CheckResult
from grader.source import parse
from grader.source import read as read_source

UNUSED_PLUGINS = (
    "logging", "warnings", "unraisableexception", "threadexception", "faulthandler", "junitxml",
    "pastebin", "doctest", "tmpdir", "monkeypatch", "recwarn", "setuponly", "setupplan", "stepwise",
    "cacheprovider", "legacypath",
)  # not "terminal": pytest-timeout needs it to end a check (its output goes to `chatter` below)


def run_checks(exercise: Exercise, candidate: Candidate, seed: int, device: str, timeout: float,
               cache: dict | None = None) -> list[CheckResult]:
    """Run every check of `exercise`; `device` is where the device checks run ('cuda', 'meta' or 'cpu').

    With a `cache` (watch keeps one across saves), a check whose inputs are unchanged is not
    run again: its result is keyed by the source it depends on (see `check_keys`).
    """
    plugin = _Plugin(exercise, candidate, seed, device, cache)
    args = [
        str(exercise.checks_path),
        "-c", str(ENGINE_DIR / "pytest.ini"),
        "--rootdir", str(ENGINE_DIR),
        "--confcutdir", str(ENGINE_DIR),
        "-p", "pytest_timeout",
        # Built-in plugins the checks do not use cost time on every check (logging alone 0.2 s a grade).
        *[arg for name in UNUSED_PLUGINS for arg in ("-p", f"no:{name}")],
        "--timeout", str(_last_resort_timeout(timeout, candidate.import_timeout)),
        "-qq",
        "--capture=no",
        "--assert=plain",
        "--import-mode=importlib",
    ]
    saved = {k: os.environ.pop(k, None) for k in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    chatter = io.StringIO()  # pytest's own output, kept off our stdout (--format json prints one object)
    try:
        with contextlib.redirect_stdout(chatter):
            code = pytest.main(args, plugins=[plugin])
    finally:
        for key, value in saved.items():
            if value is not None:
                os.environ[key] = value
    if code == pytest.ExitCode.INTERRUPTED:  # Ctrl-C: pytest caught it; the caller should see it
        raise KeyboardInterrupt
    if plugin.bug is not None:
        raise plugin.bug
    every_check_cached = code == pytest.ExitCode.NO_TESTS_COLLECTED and plugin.outcomes
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and not every_check_cached:
        raise GraderBug(f"the checks for {exercise.name} did not run (pytest exit {int(code)}):\n{chatter.getvalue()}")
    return sorted(plugin.outcomes, key=lambda o: plugin.order.get(o.name, 0))


def _last_resort_timeout(timeout: float, import_timeout: float) -> int:
    # A check makes a handful of calls and may wait for one fresh worker.
    return int(import_timeout + 10 * timeout + 30)


def check_keys(source: str, spec) -> dict[str, str] | None:
    """What each step's checks depend on, as a hash: the file's code that runs at import (every statement but a
    top-level definition, and each definition's decorators, defaults and class-body statements), and the
    definitions the step reaches by name from its own, directly or through others: steps and helpers alike, a
    Triton launcher's kernel among them (every definition, if code that runs at import names a step, or if what it
    reaches looks a name up as it runs: LOOKS_UP). A name is
    reached where code or a string other than a docstring says it, so a launcher whose docstring speaks of the
    softmax does not reach the step. "" for the whole file, which the rules checks depend on. None when the file
    does not parse.
    """
    tree = parse(source)
    if tree is None:
        return None
    lines = re.split(r"\r\n|\r|\n", source)  # the parser's lines (splitlines would also split at a form feed)
    steps = {step.id for step in spec.steps}
    texts: dict[str, list[str]] = {name: [] for name in steps}  # a name's every top-level definition
    said: dict[str, set[str]] = {name: set() for name in steps}  # the words its code says
    at_import: list[str] = []  # code that runs at import
    everywhere: set[str] = set()  # the words it says: what it may call, whoever reaches the definition
    never_run = _never_run(tree)
    for node in tree.body:
        start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        segment = "\n".join(lines[start - 1 : node.end_lineno])
        if isinstance(node, _DEFINITIONS):
            texts.setdefault(node.name, []).append(segment)
            said.setdefault(node.name, set()).update(_words(node))
            runs = _import_time(node)  # a default argument may patch what every step calls
            if runs is not None:
                at_import.append(ast.unparse(runs))
                everywhere |= _words(runs) - {node.name}
        else:
            at_import.append(segment)
            everywhere |= set() if node in never_run else _words(node)
    everywhere &= set(texts)
    if everywhere & steps:  # through a step, any definition
        everywhere = set(texts)
    digest = lambda *parts: hashlib.sha256("\0".join(parts).encode()).hexdigest()  # noqa: E731
    keys = {"": digest(source)}
    for step in spec.steps:
        reached = frontier = {step.id} | everywhere
        while frontier:  # the definitions it names, and the ones those name
            if any(said[n] & LOOKS_UP for n in frontier):  # a name built at run time may reach any definition
                reached = set(texts)
                break
            frontier = set().union(*(said[n] for n in frontier)) & set(texts) - reached
            reached = reached | frontier
        keys[step.id] = digest(*at_import, *("\n".join(texts[n]) for n in sorted(reached)))
    return keys


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# What finds a definition by a name the code builds as it runs (`globals()["_sm_" + "impl"]`, review 68's F1), which
# the words of the code never say whole
LOOKS_UP = frozenset({"globals", "vars", "locals", "getattr", "__dict__", "__getattribute__", "eval", "exec",
                      "compile", "__import__", "import_module", "sys", "modules", "builtins", "__builtins__",
                      "attrgetter", "methodcaller", "inspect"})


def _reads_whole_file(check) -> bool:
    """A rules check reads the whole file's source (a name anywhere: what hides calls from the record, TorchScript,
    a kernel's Python, an import of torch in the NumPy exercise), not only what its step reaches."""
    return check.kind == "rules" or check.name == "rules"


def _never_run(tree: ast.Module) -> list[ast.stmt]:
    """The statements whose words call nothing when the grader imports the file: the module's docstring, and an
    `if __name__ == "__main__":` block without an else (the worker imports the file under another name), unless the
    file may change its name (says `__name__` elsewhere, or reaches its namespace: `globals`, `vars`, `__dict__`,
    `sys`)."""
    main = [node for node in tree.body if isinstance(node, ast.If) and not node.orelse
            and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__")]
    first = tree.body[0] if tree.body else None
    doc = [first] if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else []
    said = set().union(*(_words(node) for node in tree.body if node not in main), *(_words(n.test) for n in main))
    if said & {"globals", "vars", "__dict__", "sys"} or sum(_count_name(n) for n in tree.body) > len(main):
        return doc
    return doc + main


def _count_name(node: ast.AST) -> int:
    """How many times the code says `__name__`."""
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == "__name__"
               or isinstance(n, ast.Attribute) and n.attr == "__name__")


def _words(node: ast.AST) -> set[str]:
    """Every name the code says: identifiers, attributes, imported names, and the words of its strings but for
    docstrings (`getattr(module, "softmax")` says softmax; a docstring that speaks of it calls nothing)."""
    docstrings = {id(n.body[0].value) for n in ast.walk(node) if isinstance(n, (*_DEFINITIONS, ast.Module))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            words.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            words.add(inner.attr)
        elif isinstance(inner, ast.alias):
            words.update((inner.name.split(".")[0], inner.asname or ""))
        elif isinstance(inner, (ast.Global, ast.Nonlocal)):
            words.update(inner.names)
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str) and id(inner) not in docstrings:
            words.update(re.findall(r"\w+", inner.value))
    return words


def _import_time(node: ast.AST) -> ast.AST | None:
    """What of a definition runs code when the file is imported (None if nothing does): all of it but
    the bodies of its functions, unless that is only signatures and plain values (`dim: int = -1`,
    `x: torch.Tensor`, `nn.Module`). A decorator, a call or a walrus anywhere, or any statement in a class's
    body (`scale = 0.5`, `global X; X = 1`, `SETTINGS["scale"] = 0.5`), may change what another step sees
    without naming it, so it is in every step's key: a change there regrades the whole file."""
    if not any(getattr(inner, "decorator_list", None) or not isinstance(inner, _PLAIN)
               for inner in _outside_bodies(node)):
        return None
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.body = [ast.Expr(ast.Constant(...))]
    return node


def _outside_bodies(node: ast.AST):
    """Every node of `node` but what lies in its functions' bodies (what runs only when they are called)."""
    todo = [node]
    while todo:
        inner = todo.pop()
        yield inner
        functions = isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
        todo.extend(child for field, value in ast.iter_fields(inner) if not (functions and field == "body")
                    for child in (value if isinstance(value, list) else [value]) if isinstance(child, ast.AST))


# what a definition's import-time part may hold and still run nothing: its shape, names, literals, a docstring
_PLAIN = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arguments, ast.arg, ast.keyword, ast.Expr,
          ast.Pass, ast.Constant, ast.Name, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple, ast.List, ast.Dict,
          ast.Set, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Starred, ast.expr_context, ast.operator, ast.unaryop,
          ast.boolop)


class _Plugin:
    def __init__(self, exercise: Exercise, candidate: Candidate, seed: int, device: str, cache: dict | None = None):
        self.exercise = exercise
        self._candidate = candidate
        self.seed = seed
        self._device = device
        self.cache = cache
        self.outcomes: list[CheckResult] = []
        self.order: dict[str, int] = {}  # check name -> its place among the collected checks
        self.bug: GraderBug | None = None

    def pytest_collect_file(self, file_path, parent):
        """A spec module (it declares SPEC) is collected by the engine: its steps become items."""
        if file_path == self.exercise.checks_path:
            name = self.exercise.spec_module
            if is_spec(importlib.import_module(name)):
                return SpecFile.from_parent(parent, path=file_path, context=self.context(), module_name=name)
        return None

    def context(self) -> Context:
        source = read_source(self._candidate.path)
        forbidden = {step.id: step.forbidden for step in self.exercise.steps}
        allowed = {step.id: step.allowed for step in self.exercise.steps if step.allowed is not None}
        self._context = Context(self._candidate, self.seed, self._device, source, forbidden, self.outcomes,
                                allowed=allowed, draw_key=keys.draw_key())
        return self._context

    def pytest_collection_modifyitems(self, items) -> None:
        steps = {s.id for s in self.exercise.steps}
        for item in items:
            step_id, points = _step_and_points(item)
            if step_id not in steps or not isinstance(points, int) or points < 0:
                self.bug = GraderBug(f"check {item.nodeid} has no valid step ({step_id!r}, {points!r})")
        self.order = {item.name: i for i, item in enumerate(items)}
        if self.cache is not None:
            keys = check_keys(read_source(self._candidate.path),
                              importlib.import_module(self.exercise.spec_module).SPEC)
            items[:] = [item for item in items if not self._cached(item, keys)]

    def _cached(self, item, keys: dict | None) -> bool:
        """Whether an earlier grade's result for this check still holds; if so it is taken, and the check not run."""
        if keys is None or not isinstance(item, SpecItem):
            return False
        # A composite's checks depend on the steps it is answered for too: their code, and whether each passed,
        # which decides whether it runs as written or the grader answers it (Run.oracle in grader/engine/runner.py),
        # even one it never names. Whether a step passed depends on its rules check too, on the whole file, and is
        # known only once it ran: such a check is looked up when its turn comes (`pytest_runtest_protocol`).
        parts = [""] if _reads_whole_file(item.check) else [item.step.id, *item.step.answered]
        item.cache_key = (item.name, "\0".join(keys[part] for part in parts), self.seed, self._device,
                          hashlib.sha256(self._context.draw_key).hexdigest())  # the sizes drawn under it too
        if parts != [""] and item.step.answered and not item.check.end_to_end:
            item.answered_from_cache = True
            return False
        return self._hit(item)

    def _hit(self, item) -> bool:
        hit = self.cache.get(item.cache_key)
        if hit is not None:
            self.outcomes.append(hit)
        return hit is not None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        """A composite's check, taken from an earlier grade if its steps passed or failed as they did then."""
        if getattr(item, "answered_from_cache", False):
            passed = tuple(self._context.passed(name) for name in item.step.answered)
            item.cache_key = (*item.cache_key, passed)
            if self._hit(item):
                return True  # done: not run
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item, call):
        """Record the outcome and hand pytest a bare report: its own would render every traceback."""
        failed = call.excinfo is not None
        if call.when == "call" or (call.when == "setup" and failed):
            outcome = replace(self._outcome(item, call.excinfo), seconds=call.duration, gated=self._gated(item),
                              plain=isinstance(item, SpecItem) and item.check is item.step.plain_check(),
                              output=self._candidate.take_output())  # what this check's calls printed
            self.outcomes.append(outcome)
            if self.cache is not None and hasattr(item, "cache_key") and not _timing(outcome):
                self.cache[item.cache_key] = outcome
            status = {"passed": "passed", "skipped": "skipped"}.get(outcome.outcome, "failed")
            longrepr = (str(item.path), 0, outcome.message) if status == "skipped" else outcome.message or None
            return pytest.TestReport(item.nodeid, item.location, {}, status, longrepr, call.when)
        return pytest.TestReport(item.nodeid, item.location, {}, "failed" if failed else "passed", None, call.when)

    def _gated(self, item) -> bool:
        """Whether a check that passed earns only beside its step's other checks (Check.gated)."""
        gated = item.check.gated if isinstance(item, SpecItem) else ""
        return gated == ALWAYS or (gated == ON_META and self._device == "meta")

    def _outcome(self, item, excinfo) -> CheckResult:
        step_id, points = _step_and_points(item)
        name = item.name.removeprefix("test_")
        if excinfo is None:
            return CheckResult(step_id, name, "passed", points, end_to_end=_end_to_end(item))
        error = excinfo.value
        if excinfo.errisinstance(pytest.skip.Exception):
            return CheckResult(step_id, name, "skipped", points, str(error.msg))
        if isinstance(error, CheckFailed):
            mistake = error.mistake
            return CheckResult(
                step_id, name, error.outcome, points, error.message,
                mistake.id if mistake else None, mistake.message if mistake else None,
                details=error.details, breach=error.breach, end_to_end=_end_to_end(item),
                error_kind=_error_kind(error) if error.outcome == "error" else None,
            )
        if isinstance(error, CandidateError):
            return CheckResult(step_id, name, "error", points, error.message, end_to_end=_end_to_end(item),
                               error_kind=error.kind)
        failed = error.__context__
        if isinstance(failed, CheckFailed) and not excinfo.errisinstance(pytest.fail.Exception):
            # the check had failed, and naming its mistake met an answer the diagnosis could not read (a buffer of
            # another shape): the failure stands, unnamed, rather than ending the grade as the grader's fault
            return CheckResult(step_id, name, failed.outcome, points, failed.message, details=failed.details,
                               end_to_end=_end_to_end(item))
        if excinfo.errisinstance(pytest.fail.Exception) and "Timeout" in str(error):
            return CheckResult(step_id, name, "error", points, "the check ran past the grader's last-resort time limit",
                               error_kind="timeout")
        self.bug = self.bug or GraderBug(f"check {item.nodeid} crashed:\n{excinfo.getrepr(style='short')}")
        return CheckResult(step_id, name, "error", points, "internal error in the grader")


def _error_kind(error: BaseException) -> str | None:
    """The kind of the CandidateError a check's failure was raised for (the engine raises its CheckFailed while
    handling it, `from None`: it is the failure's context), or None."""
    for _ in range(8):
        error = error.__context__
        if error is None or isinstance(error, CandidateError):
            return error.kind if error is not None else None
    return None


def _timing(outcome: CheckResult) -> bool:
    """A result that depends on time (a timeout; the whole file's depends on the other steps too): never cached."""
    return outcome.outcome == "error" and ("timed out" in outcome.message or "time limit" in outcome.message)


def _end_to_end(item) -> bool:
    return isinstance(item, SpecItem) and item.check.end_to_end


def _step_and_points(item) -> tuple[str | None, int | None]:
    """The step a collected check belongs to and the points it is worth: the item carries its step and check."""
    if not isinstance(item, SpecItem):
        return None, None
    return item.step.id, item.check.points
