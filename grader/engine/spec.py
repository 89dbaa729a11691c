"""The vocabulary of an exercise's checks: steps, their checks, and the mistakes they name.

An exercise's checks are data (grader/course/NAME/spec.py): for each step, how its inputs are
made, the reference, how an answer is compared, the checks (each a case with its points),
and the step's named mistakes. grader/engine/runner.py turns the steps into pytest items
and runs them; the command line (`attn-grade mistakes`), the reports and the docs read
the same declarations, so what a step checks is said once.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Callable

# The kinds of check a step can declare; the engine runs each kind one way.
#   shape:    the answer is a tensor (or tuple of them) of the reference's shape and dtype
#   values:   the answer matches the reference, on every dtype listed and on two input draws
#   rules:    the call used none of the step's forbidden functions (and is right)
#   device:   the step runs on the device under test and its result stays there
#   property: a plain function of its own (the escape hatch: statistics, causality, round trips)
KINDS = ("shape", "values", "rules", "device", "property")
# Where a check is gated (Check.gated): on every device, or only on the meta device
ALWAYS, ON_META = "always", "meta"


@dataclass(frozen=True)
class Raises:
    """How an exception the candidate's code raised is recognised: every given part must match.

    `types` are exception class names; `message` and `line` are regular expressions searched
    in the exception's message and in the candidate's own line that raised it; `source` is
    searched in the source of the step's function (or class); `uses` is what the line that raised
    uses, itself or through a name the step's source binds to it (`s = e.sum(-1)`, then `e / s`):
    a cause that is somewhere in the step but not in what raised is no cause. With `sliced`, the
    axis the message names ("at non-singleton dimension 1") is one the line writes through a slice
    with an end (`buf[:, start:end] = new`): that slice's length, not the buffer's shape, is off.
    """

    types: tuple[str, ...] = ()
    message: str = ""
    line: str = ""
    source: str = ""
    uses: str = ""
    sliced: bool = False

    def matches(self, error, line: str, source: str) -> bool:
        if self.types and error.type not in self.types:
            return False
        if self.message and not re.search(self.message, error.message):
            return False
        if self.line and not re.search(self.line, line[:MATCHED_LINE]):
            return False
        if self.sliced and not _written_through_slice(error.message, line[:MATCHED_LINE]):
            return False
        if self.uses and not _uses(self.uses, line[:MATCHED_LINE], source[:MATCHED_SOURCE]):
            return False
        return not self.source or bool(re.search(self.source, source[:MATCHED_SOURCE]))


def _written_through_slice(message: str, line: str) -> bool:
    """Whether the axis `message` names is one the assignment on `line` writes through a slice with an end."""
    axis = re.search(r"at non-singleton dimension (\d+)", message)
    try:
        tree = ast.parse(line.strip())
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    if axis is None:
        return False
    for node in ast.walk(tree):
        for target in node.targets if isinstance(node, ast.Assign) else ():
            if not isinstance(target, ast.Subscript):
                continue
            items = target.slice.elts if isinstance(target.slice, ast.Tuple) else [target.slice]
            if any(isinstance(i, ast.Constant) and i.value is Ellipsis for i in items):
                continue  # which axis each item is depends on the buffer's rank
            at = int(axis.group(1))
            if at < len(items) and isinstance(items[at], ast.Slice) and items[at].upper is not None:
                return True
    return False


# `a = ...` and `a, b = ...` at the start of a line: the names bound, and what they are bound to
BOUND = re.compile(r"(?m)^[ \t]*(\w+(?:[ \t]*,[ \t]*\w+)*)[ \t]*=(?!=)(.*)$")


def _uses(pattern: str, line: str, source: str) -> bool:
    """Whether `line` says what `pattern` matches, or a name `source` binds to something that does."""
    if re.search(pattern, line):
        return True
    names = {name.strip() for bound in BOUND.finditer(source) if re.search(pattern, bound.group(2)[:MATCHED_LINE])
             for name in bound.group(1).split(",")}
    return any(re.search(rf"\b{name}\b", line) for name in names)


# How much of the candidate's line and step source a Raises pattern reads: a pattern with a run between two literals
# backtracks over what follows each start, so its time grows with the square of the text (the fortieth review's f06:
# 107 KB of ".append(" held the grader 12 s a check); a step's own code fits in far less.
MATCHED_LINE, MATCHED_SOURCE = 1000, 8000


# A mistake's message is "what is wrong: how to fix it", in at most this many words; the rest goes to its `why`.
MESSAGE_WORDS = 30


@dataclass(frozen=True)
class Mistake:
    """A named mistake: an id, a message that says what is wrong and how to fix it, and how it is recognised.

    message: "what is wrong: how to fix it", at most MESSAGE_WORDS words (the reports show it);
    why:     what the message has no room for, the reason behind the fix (`attn-grade mistakes --why`).

    How it is recognised (a wrong answer, an exception, or both):
      variant: computes the wrong answer from the check's inputs; an answer equal to it is this mistake
               (a list of answers: the several forms the mistake takes, an answer equal to any of them);
      test:    looks at the answer itself, `test(value, *args, **kwargs)` -> bool;
      raises:  recognises the exception the candidate's code raised (the same mistake may raise
               on some inputs and answer wrongly on others: x @ weight is wrong when square).
    A mistake with none of them is named by its step's own property check.
    """

    id: str
    message: str
    variant: Callable | None = None
    test: Callable | None = None
    raises: Raises | None = None
    why: str = ""

    def __post_init__(self):
        if self.variant is not None and self.test is not None:
            raise ValueError(f"mistake {self.id}: give a variant or a test, not both")

    @property
    def recognised_by(self) -> str:
        signs = (("a wrong answer", self.variant or self.test), ("an exception", self.raises))
        ways = [way for way, given in signs if given]
        return " or ".join(ways) or "its own check"


@dataclass(frozen=True)
class Check:
    """One check of a step: a case of the step's inputs, and what is asked of the answer.

    The check's name is `<step prefix>_<name>` (with `[dtype]` for each dtype listed).
    `params` go to the step's input maker; `strided` lists the arguments handed over
    non-contiguous; `run` is the property check's own function, `run(ctx)`.

    `situation` is the mistake of the one thing this check adds to the step's plain case (a causal
    mask, rows with no key, a size the blocks do not divide): when the check fails, no mistake of the
    step explains the answer, and the step's plain check (StepSpec.plain) passed, the failure is
    named by it. It localises a bug nobody listed: wrong only when causal is a causal bug.
    """

    name: str
    points: int
    kind: str = "values"
    params: dict = field(default_factory=dict)
    dtypes: tuple = ()
    strided: tuple[int, ...] = ()
    run: Callable | None = None
    end_to_end: bool = False  # a composite run with the candidate's own steps, not the grader's
    situation: Mistake | None = None  # what this check's failure says when nothing names it and the plain case passed
    # where it earns its points only if every other check of its step earns, because it asks what a wrong answer
    # can have too: ALWAYS (a relation between the code's own answers), ON_META (a device check: on the meta
    # device it compares no values, only where the result is), "" nowhere
    gated: str = ""

    def __post_init__(self):
        if self.gated not in ("", ALWAYS, ON_META):
            raise ValueError(f"check {self.name}: gated is {ALWAYS!r}, {ON_META!r} or empty")
        if self.kind not in KINDS:
            raise ValueError(f"check {self.name}: unknown kind {self.kind!r}")
        if (self.kind == "property") != (self.run is not None):
            raise ValueError(f"check {self.name}: a property check, and only one, has a run function")


def shape(points: int = 1, name: str = "shape", **params) -> Check:
    return Check(name, points, "shape", params)


def values(name: str, points: int, dtypes: tuple = (), strided: tuple[int, ...] = (), situation: Mistake | None = None,
           **params) -> Check:
    return Check(name, points, "values", params, dtypes, strided, situation=situation)


def rules(points: int = 1, **params) -> Check:
    return Check("rules", points, "rules", params)


def device(points: int = 1, **params) -> Check:
    return Check("device", points, "device", params, gated=ON_META)


def prop(name: str, points: int, run: Callable, end_to_end: bool = False, situation: Mistake | None = None,
         gated: str = "") -> Check:
    return Check(name, points, "property", run=run, end_to_end=end_to_end, situation=situation, gated=gated)


@dataclass(frozen=True)
class Call:
    """The inputs of one call: positional and keyword arguments; for a module, how to build it.

    `names` label the positional arguments in messages ("called with q (2, 3, 5, 4), ...").
    """

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    names: tuple[str, ...] = ()
    init: tuple = ()
    init_kwargs: dict = field(default_factory=dict)
    state: dict | None = None


@dataclass(frozen=True)
class Probe:
    """A simpler case of a step (its input maker's `params`: one sequence, one head): answered right while the plain
    case fails, it names `mistake` (grader/engine/locate.py)."""

    params: dict
    mistake: Mistake


@dataclass(frozen=True)
class StepSpec:
    """A step of an exercise, as its checks see it.

    inputs(gen, dtype, **params) -> Call: the inputs of one check, from the grader's generator.
    reference(*args, **kwargs): the right answer (for a module step, reference(state, *args, **kwargs)).
    compare(value, expected, call): raises CheckFailed when the answer is wrong; None compares
    closely (tensors, arrays, tuples of them) under the tolerance policy of grader/engine/tolerance.py.
    outputs: names of the parts of a tuple answer ("output", "weights"), for messages.
    answered: for a composite step, the exercise's step functions the grader answers while
    it runs, those of them that lost points (so a bug in them is charged to them, not here);
    see grader/engine/runner.py.
    plain: the name of the check of the step's plain case, which a check's situation is told against
    (by default its first values check, else its check named "values").
    parts: for a tuple answer, ((names of the parts that are right), Mistake) pairs: the mistake such an answer
    shows, in the step's words (else the general parts_wrong says which parts are off).
    probes: simpler cases asked when the plain case fails (Probe).
    tiles: for a tiled step, tiles(call) -> TileSizes, the tiles a call's inputs imply: every call the step's checks
    make is then judged by them, and its tiles_only check fails on the first that made more (grader/engine/tiles.py).
    remake: for a step that may read no values, remake(call, rng) -> Call, the call on the same shapes and other
    values, still one the reference answers (its inputs consistent: a forward's out and lse from its q, k, v); by
    default every float tensor's values are drawn afresh (grader/engine/runner.py, `Run.steered`).
    largest: largest(call) -> the most elements one tensor a call of the step creates may hold: every call the
    step's checks make is then held to it, and one that made more breaks the step's rules (a gradient differentiated
    numerically, every direction at once, makes one tensor as large as the inputs times the outputs).
    """

    id: str
    inputs: Callable
    reference: Callable
    checks: tuple[Check, ...]
    mistakes: tuple[Mistake, ...] = ()
    compare: Callable | None = None
    outputs: tuple[str, ...] = ()
    prefix: str = ""
    module: bool = False
    answered: tuple[str, ...] = ()
    plain: str = ""
    parts: tuple[tuple[tuple[str, ...], Mistake], ...] = ()
    probes: tuple[Probe, ...] = ()
    tiles: Callable | None = None
    remake: Callable | None = None
    largest: Callable | None = None

    def __post_init__(self):
        situated = [c.name for c in self.checks if c.situation is not None]
        if situated and self.plain_check() is None:
            raise ValueError(f"step {self.id}: checks {situated} name a situation, but the step has no plain check")
        if self.plain_check() is not None and self.plain_check().situation is not None:
            raise ValueError(f"step {self.id}: the plain check cannot name a situation of its own")

    @property
    def check_prefix(self) -> str:
        return self.prefix or self.id

    def plain_check(self) -> Check | None:
        """The check of the step's plain case (see `plain`), if it has one."""
        if self.plain:
            return next((c for c in self.checks if c.name == self.plain), None)
        return next((c for c in self.checks if c.kind == "values"), None) or \
            next((c for c in self.checks if c.name == "values"), None)

    @property
    def named(self) -> tuple[Mistake, ...]:
        """Every mistake the step can name, each once: its own list, its checks' situations, its parts', its probes'."""
        found = {}
        situations = (c.situation for c in self.checks if c.situation is not None)
        for mistake in (*self.mistakes, *situations, *(m for _, m in self.parts), *(p.mistake for p in self.probes)):
            found.setdefault(mistake.id, mistake)
        return tuple(found.values())


@dataclass(frozen=True)
class Spec:
    """An exercise's checks: its steps, and what its functions take and return (torch or numpy)."""

    steps: tuple[StepSpec, ...]
    backend: str = "torch"  # numpy: arrays in and out, no device checks
    rules: Callable | None = None  # rules(answer, source, step id): what every rules check asks besides exercise.toml's
    # forbidden calls (NumPy: no torch in the file or the call)
    calls: Callable | None = None  # calls(answer, step id): what every call's record keeps besides exercise.toml's
    # forbidden calls, in every check (NumPy: no torch; a file can tell the rules check's call by its inputs' shapes)
    contract: str = ""  # the module whose signatures a composite's calls are bound by, if not the references'
    # (mha_numpy's softmax takes `axis` where the torch reference takes `dim`)
