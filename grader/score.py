"""Stage 4 of a grade: turn check outcomes into per-step scores, using the points of exercise.toml.

Results are small frozen dataclasses whose totals are computed from their parts. A
passed check earns its points; so does a skipped one (a check the grader could not
run, such as an op the meta device lacks, costs the candidate nothing), but only in a
step whose other checks all passed, so code that cannot run at all earns nothing by
being unrunnable on the meta device; a failed or errored check earns none. A gated
check (a device check on the meta device, a relation between the code's own answers:
what a wrong answer can pass too) earns only beside a right answer: where the step's
plain case (its first values check, on every dtype) passed, or, in a step without one,
where its other checks passed but for losses charged to other steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from grader.exercise import Exercise, GraderBug

EARNING = ("passed", "skipped")
# a CandidateError's kind (grader/errors.py) -> how a report sorts the loss; the other kinds (raised,
# not_implemented, missing) are the code's own answer, an ordinary failure
FAILURE_KINDS = {"import": "could not import", "timeout": "timed out", "died": "crashed", "memory": "crashed",
                 "protocol": "crashed"}


@dataclass(frozen=True)
class CheckResult:
    step: str
    name: str
    outcome: str  # passed | failed | error | skipped
    max_points: int
    message: str = ""
    mistake_id: str | None = None
    mistake: str | None = None
    counts: bool = True  # a skipped or gated check earns its points only when this is true (see above)
    details: dict = field(default_factory=dict)  # a failure's numbers: max abs and relative error, where, ...
    breach: bool = False  # a forbidden call: the whole step earns nothing
    end_to_end: bool = False  # a composite run with the candidate's own steps
    charged_elsewhere: tuple[str, ...] = ()  # an end-to-end loss whose cause other steps already paid for
    seconds: float = 0.0  # how long the check ran (pytest's duration of its call)
    error_kind: str | None = None  # why the candidate's code gave no answer (a CandidateError's kind): timeout, died...
    output: str = ""  # what the candidate's code printed while this check ran, capped
    gated: bool = False  # earns only beside a right answer (see above)
    plain: bool = False  # the step's plain case (StepSpec.plain_check)

    @property
    def lost_because(self) -> str | None:
        """Why the check lost its points, as a report's headline sorts it: "timed out", "crashed", "could not
        import", or None for an ordinary failure (a wrong answer, an exception the code raised)."""
        return FAILURE_KINDS.get(self.error_kind) if self.outcome == "error" else None

    @property
    def points(self) -> int:
        return self.max_points if self.outcome in EARNING and self.counts else 0


@dataclass(frozen=True)
class StepResult:
    id: str
    title: str
    checks: tuple[CheckResult, ...]

    @property
    def score(self) -> int:
        return 0 if self.breach else sum(c.points for c in self.checks)

    @property
    def max_score(self) -> int:
        return sum(c.max_points for c in self.checks)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.checks)

    @property
    def breach(self) -> str | None:
        """The broken rule's message, if the step's code called a forbidden function: the step earns nothing."""
        return next((c.message for c in self.checks if c.breach), None)


@dataclass(frozen=True)
class Grade:
    exercise: str
    title: str
    file: str
    steps: tuple[StepResult, ...]
    environment: dict = field(default_factory=dict)  # torch, device, cuda_available
    candidate_output: str = ""
    seed: int = 0  # of the grader's random inputs
    sha256: str = ""  # of the file as it was when grading began
    graded_at: str = ""  # when grading began, UTC, ISO 8601
    kit_version: str = ""  # attn-grade's

    @property
    def score(self) -> int:
        return sum(s.score for s in self.steps)

    @property
    def max_score(self) -> int:
        return sum(s.max_score for s in self.steps)

    @property
    def full_marks(self) -> bool:
        return self.score == self.max_score


def score(
    exercise: Exercise, checks_run: list[CheckResult], file: str, environment: dict, candidate_output: str = ""
) -> Grade:
    """The grade, steps in course order; a step whose checks do not add up to its points is a grader bug."""
    steps = []
    losing = {c.step for c in checks_run if c.points < c.max_points and not c.end_to_end}
    for step in exercise.steps:
        checks = tuple(_charged_elsewhere(c, checks_run, losing) for c in checks_run if c.step == step.id)
        if any(c.outcome not in EARNING for c in checks):
            checks = tuple(_uncounted(c) if c.outcome == "skipped" else c for c in checks)
        if not _right(checks):
            checks = tuple(_uncounted(c) if c.gated and c.outcome == "passed" else c for c in checks)
        result = StepResult(step.id, step.title, checks)
        if not checks or result.max_score != step.points:
            raise GraderBug(
                f"step {step.id} of {exercise.name} has checks worth {result.max_score} points; "
                f"exercise.toml says {step.points}"
            )
        steps.append(result)
    return Grade(exercise.name, exercise.title, file, tuple(steps), environment, candidate_output)


def _right(checks: tuple[CheckResult, ...]) -> bool:
    """Whether the step answered right: its plain case passed, or, without one, every check but the gated ones
    earned or lost only through other steps."""
    plain = [c for c in checks if c.plain]
    if plain:
        return all(c.outcome == "passed" for c in plain)
    return all(c.outcome in EARNING or c.charged_elsewhere for c in checks if not c.gated)


def _uncounted(check: CheckResult) -> CheckResult:
    """A skipped or gated check in a step whose other checks did not all earn: no points, and the report says why."""
    why = "no points: other checks of this step failed"
    return replace(check, counts=False, message=f"{check.message} ({why})" if check.message else why)


def _charged_elsewhere(check: CheckResult, checks_run: list[CheckResult], losing: set[str]) -> CheckResult:
    """An end-to-end check lost while the composite's own checks all passed and other steps lost points:
    its cause is in those steps, already charged there; the report says so."""
    if not check.end_to_end or check.outcome in EARNING:
        return check
    own = [c for c in checks_run if c.step == check.step and not c.end_to_end]
    calls = check.details.get("calls")  # the steps the composite's source names, when the check knows them
    others = tuple(sorted((losing - {check.step}) & (set(calls) if calls is not None else losing)))
    if others and all(c.outcome in EARNING for c in own):
        steps = ", ".join(others)
        return replace(check, charged_elsewhere=others,
                       message=f"{check.message} (only through steps already charged: {steps})")
    return check


def verdict(grade: Grade) -> tuple[str, str]:
    """The grade in a few words, and why in a sentence ("" for full marks): "could not import" (the file's
    error and its line), "timed out", "crashed" (the first such step and what happened), "rule broken",
    "points lost" or "full marks", in that order of precedence."""
    checks = [(step, check) for step in grade.steps for check in step.checks]
    file_error = grade.environment.get("file_error") or ""
    if any(check.lost_because == "could not import" for _, check in checks):
        why = file_error or "the file could not be imported"
        if "timed out" in why or "time limit" in why:
            return "timed out", why
        if why.startswith("could not import: "):
            return "could not import", why.removeprefix("could not import: ")
        return "crashed", why
    for kind in ("timed out", "crashed"):
        found = next((f"{step.id}: {check.message}" for step, check in checks if check.lost_because == kind), None)
        if found:
            return kind, found
    broken = [step for step in grade.steps if step.breach]
    if broken:
        return "rule broken", "; ".join(f"{step.id}: {step.breach}" for step in broken)
    if grade.full_marks:
        return "full marks", ""
    if file_error:
        return "points lost", file_error
    lost = [step.id for step in grade.steps if step.score < step.max_score]
    return "points lost", f"lost points in {len(lost)} of {len(grade.steps)} steps: {', '.join(lost)}"
