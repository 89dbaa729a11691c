"""Scripts: a check of something that keeps state between calls runs actions in order in one worker.

A cache remembers what it was given, and a module that fills one answers differently on each call,
so one call cannot check them. A script builds the candidate's objects in the worker, calls their
methods in order, reads their attributes, and sends back each action's result as plain data; every
comparison runs here, in the grader (`Run.script` runs one, and names the action that raised).

The actions, as the worker reads them (objects are numbered in the order they are built):
  build  {"do": "build", "class": NAME, "init": [...], "init_kwargs": {...}, "state": dict or None,
          "stand_in": bool}
         the candidate's class, or with stand_in the class of that name in the exercise's
         stand_ins.py; with a state, a module: the grader's weights loaded, on the device, in eval mode
  call   {"do": "call", "object": i, "method": NAME or "__call__", "args": [...], "kwargs": {...},
          "refs": {keyword: object number}, "may_raise": bool}
         tensors go to the device; refs pass built objects; an exception of an action that may
         raise is its result, and the script goes on
  get    {"do": "get", "object": i, "attribute": NAME}
  storage {"do": "storage", "object": i, "attributes": [NAME, ...]}
         where each tensor the object keeps under those names lives (its storage's address, None where it keeps
         none itself, or its class decides what a read gets): the same address after every append is a buffer
         kept in place
  fill   {"do": "fill", "object": i, "attributes": [NAME, ...], "axis": 2, "start": NAME or int,
          "value": "nan"}
         the object's tensors named, from `start` on along `axis`, set to `value` (a NAME: the
         object's attribute that holds the start, such as a cache's length): what a later result
         shows must not depend on those slots

What a check makes of the results is an answer like any other, and its mistakes are named by
Run.explain: a record of what a stateful object showed is read by its step's mistakes' tests
(`expect_each`), and a module fed its input in chunks (`chunks`) is compared with one call over the
whole input, its mistakes' wrong answers made by the reference given the same splits (`expect_chunks`).
"""

from __future__ import annotations

import re

import torch

from grader.engine import diagnose
from grader.engine.failure import CheckFailed
from grader.engine.runner import Run, source_of
from grader.engine.spec import MATCHED_SOURCE, Call
from grader.engine.tolerance import Tolerance, expect_close, expect_form


def build(cls: str, *init, stand_in: bool = False, state: dict | None = None, **init_kwargs) -> dict:
    return {"do": "build", "class": cls, "init": list(init), "init_kwargs": init_kwargs, "state": state,
            "stand_in": stand_in}


def call(obj: int, method: str, *args, kwargs: dict | None = None, refs: dict | None = None,
         may_raise: bool = False) -> dict:
    return {"do": "call", "object": obj, "method": method, "args": list(args), "kwargs": kwargs or {},
            "refs": refs or {}, "may_raise": may_raise}


def get(obj: int, attribute: str) -> dict:
    return {"do": "get", "object": obj, "attribute": attribute}


def storage(obj: int, attributes: tuple[str, ...]) -> dict:
    return {"do": "storage", "object": obj, "attributes": list(attributes)}


def fill(obj: int, attributes: tuple[str, ...], axis: int, start: str | int, value: str = "nan") -> dict:
    return {"do": "fill", "object": obj, "attributes": list(attributes), "axis": axis, "start": start, "value": value}


class Script:
    """Actions to run in one worker, added in order: `build` gives the object's number, every other
    adder the index of its action's result in the list `Run.script` answers with."""

    def __init__(self) -> None:
        self.actions: list[dict] = []
        self.classes: list[str] = []  # each built object's class, by its number
        self.names: dict[int, tuple[str, ...]] = {}  # a call's argument names, for messages only

    def build(self, cls: str, *init, **options) -> int:
        self.actions.append(build(cls, *init, **options))
        self.classes.append(cls)
        return len(self.classes) - 1

    def call(self, obj: int, method: str, *args, names: tuple[str, ...] = (), **options) -> int:
        self.names[len(self.actions)] = names
        return self._add(call(obj, method, *args, **options))

    def get(self, obj: int, attribute: str) -> int:
        return self._add(get(obj, attribute))

    def storage(self, obj: int, attributes: tuple[str, ...]) -> int:
        return self._add(storage(obj, attributes))

    def fill(self, obj: int, attributes: tuple[str, ...], axis: int, start: str | int, **options) -> int:
        return self._add(fill(obj, attributes, axis, start, **options))

    def _add(self, action: dict) -> int:
        self.actions.append(action)
        return len(self.actions) - 1

    def describe(self, index: int | None) -> tuple[str, Call]:
        """Action `index` as a message says it ("call KVCache.append"), and its arguments as a Call, names and all."""
        if index is None or not 0 <= index < len(self.actions):
            return "", Call()
        action = self.actions[index]
        if action["do"] == "build":
            return f"build {action['class']}", Call(tuple(action["init"]), dict(action["init_kwargs"]))
        obj = action["object"]
        owner = self.classes[obj] if type(obj) is int and 0 <= obj < len(self.classes) else ""
        what = ".".join(str(n) for n in (owner, action.get("method") or action.get("attribute")) if n)
        args = Call(tuple(action.get("args") or ()), dict(action.get("kwargs") or {}), self.names.get(index, ()))
        return f"{action['do']} {what}", args


def type_name(value) -> str:
    """What a result that should have been something else is, for a message (the name the worker sent, if any)."""
    return getattr(value, "type_name", None) or f"{type(value).__module__}.{type(value).__qualname__}"


def expect_result(what: str, got, expected: torch.Tensor, device: str = "cpu",
                  tolerance: Tolerance | None = None) -> None:
    """A script's result is a tensor of expected's shape, dtype and device, with its values (unless on the meta
    device); a failure's message starts with `what`."""
    try:
        expect_form(got, expected, device=device)
        if device != "meta":
            expect_close(got, expected, None, tolerance)
    except CheckFailed as failure:
        raise CheckFailed(f"{what}: {failure.message}", failure.mistake, failure.details) from None


def expect_count(run: Run, call: Call, not_int, said=lambda count: "") -> None:
    """The step's answer to `call` is its reference's count exactly, as an int (a float or a tensor is `not_int`);
    `said` adds to the message what the expected count means (its size in GiB, say)."""
    value = run.output(run.answer(call))
    expected = run.step.reference(*call.args)
    what = f"{run.step.id}({', '.join(map(repr, call.args))})"
    if type(value) is not int:
        shown = f" {value!r}" if isinstance(value, float) else ""
        raise CheckFailed(f"{what} returned {type_name(value)}{shown}; expected an int", not_int)
    if value != expected:
        raise CheckFailed(f"{what} = {value:,}; expected {expected:,}{said(expected)}", run.explain(value, call),
                          {"expected": expected, "got": value})


def expect_each(run: Run, answer, call: Call, *looks, prefix: str = "") -> None:
    """Each look at a script's answer in turn (a function that raises CheckFailed); a failure that names no
    mistake is given the one Run.explain finds in the answer, whose tests read it as the step's answer."""
    try:
        for look in looks:
            look(answer)
    except CheckFailed as failure:
        mistake = failure.mistake or run.explain(answer, call)
        raise CheckFailed(prefix + failure.message, mistake, failure.details) from None


def chunks(x: torch.Tensor, splits: tuple[int, ...]) -> list[torch.Tensor]:
    """x (B, T, ...) cut along its token axis into contiguous chunks of `splits` tokens."""
    starts = [sum(splits[:i]) for i in range(len(splits))]
    return [x[:, start:start + t].contiguous() for start, t in zip(starts, splits, strict=True)]


def expect_chunks(run: Run, call: Call, splits: tuple[int, ...], outputs: list, device: str = "cpu") -> None:
    """A module fed call's input in chunks of `splits` (keeping a state between them) gave, chunk by chunk, the
    output of one call over the whole input: each output the form of its tokens' part, together its values.

    The step's reference takes `splits=` (None: one call over the whole input), as its mistakes'
    variants do; a failure that names no mistake is given the one Run.explain finds in the outputs
    put together. A mistake recognised both by a wrong answer and by an exception raised in a source
    of its own (Raises.source) is named from its answer only in such a source.
    """
    native, exact = run.reference(call, exact=False), run.reference(call)
    got = []
    what = (f"{call.names[0] if call.names else 'the input'} of {sum(splits)} tokens fed in calls of "
            f"{', '.join(map(str, splits))}")
    try:
        expect_joined(outputs, splits, native, exact, device, got)
    except CheckFailed as failure:
        mistake = failure.mistake or _chunks_mistake(run, call, splits, outputs, got, native, device)
        raise CheckFailed(f"{what}: {failure.message}", mistake, failure.details) from None


def expect_joined(outputs: list, splits, native, exact, device: str = "cpu", got: list | None = None) -> None:
    """Each output of the form of its chunk of `native` (the tokens on axis 1), and all of them joined close to
    `exact`; `got` collects the outputs of the right form, in order, for a caller that names the mistake."""
    got = [] if got is None else got
    start = 0
    for value, t in zip(outputs, splits, strict=False):
        expect_form(value, native[:, start:start + t], device=device)
        got.append(value)
        start += t
    if device != "meta":
        expect_close(torch.cat(got, dim=1), exact, None, Tolerance.of(native, exact, device))


def _chunks_mistake(run: Run, call: Call, splits: tuple, outputs: list, got: list, native, device: str):
    if len(got) < len(splits):  # a chunk of the wrong form: that form's own mistake
        start = sum(splits[:len(got)])
        return diagnose.form(outputs[len(got)], native[:, start:start + splits[len(got)]], device=device)
    source = source_of(run.ctx.source, run.step.id)
    # the step's source as far as a Raises pattern reads it: its runs backtrack (the fifty-third review's F3)
    possible = [m for m in run.step.mistakes
                if not (m.raises and m.raises.source) or re.search(m.raises.source, source[:MATCHED_SOURCE])]
    whole = Call(call.args, {**call.kwargs, "splits": splits}, call.names, state=call.state)
    return run.explain(torch.cat(got, dim=1), whole, device, possible)
