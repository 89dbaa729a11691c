"""The oracle: the grader answering a composite's questions about the steps it calls with the reference's results.

A composite step (a module that calls the exercise's other steps) is graded on its own wiring: while
its checks run, the worker asks the grader for the answers of the step functions it calls that lost
points in their own checks (`StepSpec.answered`), and the oracle answers with the reference's. The
questions arrive through the process layer (grader/candidate.py) from code the candidate controls, so
each is bounded and validated here before the reference runs in the grader's process.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable

import numpy as np
import torch

from grader import wire
from grader.arrays import as_tensor_tree, describe, leaves

# The grader computes a question's answer in its own process, so a question is bounded: its
# inputs' elements and every one of their sizes (an answer can grow with the square of a size,
# q @ kᵀ), and the elements one call may ask about in all. Legitimate calls are far below.
MAX_QUESTION_ELEMENTS = 1 << 16
MAX_QUESTION_SIZE = 512  # the largest size of any axis of any input (mla asks at 262 tokens: positions past 256)
MAX_CALL_ELEMENTS = 1 << 24  # inputs and answers of all of one call's questions together
MAX_ANSWER_ELEMENTS = 1 << 22  # an upper bound on one answer (answer_size_bound), before the reference runs


class Oracle:
    """The grader's side of a composite's questions: the reference's answer for each step it calls.

    The worker asks {"op": "answer", "name", "args", "kwargs", "grad"} and, in backward,
    {"op": "answer_grad", "index", "grads"}; each reply is plain data. Anything a question
    holds that is not a well-formed question within bounds gets {"ok": false} and an error
    the candidate's code raises: never an exception here.
    """

    def __init__(self, references: dict, signatures: dict, backend: str = "torch"):
        self.references, self.signatures, self.backend = references, signatures, backend
        self.names = tuple(references)
        self.asked: dict[int, tuple] = {}  # the questions a backward pass may come back to
        self.questions = 0
        self.counts: dict[str, int] = {}  # the questions answered, by step: which steps the composite reached
        self.scales: dict[str, float] = {}  # a step's answers multiplied by this: does the composite use them?
        self.kept: dict[str, list] = {}  # the questions asked of the steps named here, (args, kwargs) each
        self.rules: dict[str, Callable] = {}  # a step -> why a question of it is refused (None: answered), for a
        # composite whose contract asks its steps only some questions (a spec sets it: `attention_backward`'s Function)
        self.pinned: set[str] = set()  # steps whose rule answers only questions of the shapes of the call's own
        # inputs: their answers are as large as the grader's own, and need no bound (a general bound overcounts)
        self.elements = 0

    def reply(self, frame: dict, blobs: list, out: list) -> dict:
        try:
            if frame.get("op") == "answer":
                return self._answer(frame, blobs, out)
            return self._answer_grad(frame, blobs, out)
        except wire.WireError:
            raise  # a malformed frame: the candidate's protocol error
        except Exception as exc:  # a well-formed question the reference cannot answer
            out.clear()
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}

    def _answer(self, frame: dict, blobs: list, out: list) -> dict:
        name = frame.get("name")
        args, kwargs = wire.decode(frame.get("args"), blobs), wire.decode(frame.get("kwargs"), blobs)
        well_formed = isinstance(args, tuple) and isinstance(kwargs, dict)
        if type(name) is not str or name not in self.references or not well_formed:
            return {"ok": False, "error": f"{str(name)[:40]!r} is not a step the grader answers here"}
        if self.backend == "numpy":  # NumPy promotes mixed float dtypes where torch refuses: promote as it would
            args, kwargs = _promoted(args), dict(zip(kwargs, _promoted(tuple(kwargs.values())), strict=True))
        args, kwargs = as_tensor_tree(args), {k: as_tensor_tree(v) for k, v in kwargs.items()}
        tensors = leaves(args, kwargs)
        size = sum(t.numel() for t in tensors)
        if size > MAX_QUESTION_ELEMENTS or any(n > MAX_QUESTION_SIZE for t in tensors for n in t.shape):
            return {"ok": False, "error": "inputs too large to answer"}
        meta = any(t.is_meta for t in tensors)
        if meta:  # shapes are all a meta answer has: computed on CPU zeros (the meta kernels cost a lazy import)
            args, kwargs = _zeros_for_meta(args), {k: _zeros_for_meta((v,))[0] for k, v in kwargs.items()}
        try:
            bound = self.signatures[name].bind(*args, **kwargs)  # by position, or by the contract's names
            bound.apply_defaults()
            if "device" in bound.arguments:  # answered on the CPU; the worker moves the answer where it was asked for
                bound.arguments["device"] = None
            refused = self.rules[name](bound.arguments, meta) if name in self.rules else None
            if refused:
                return {"ok": False, "error": refused}
            sizes = question_sizes(bound)
            if not all(math.isfinite(n) and abs(n) <= MAX_QUESTION_SIZE for n in sizes):
                return {"ok": False, "error": "inputs too large to answer"}
            most = 0 if name in self.pinned and name in self.rules else answer_size_bound(
                tensors, [math.ceil(abs(n)) for n in sizes])
            if most > MAX_ANSWER_ELEMENTS:
                return {"ok": False, "error": "inputs too large to answer"}
            if self.elements + size + most > MAX_CALL_ELEMENTS:  # before the reference runs, not after
                return {"ok": False, "error": "too many questions in one call"}
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
            value = self.references[name](*args, **kwargs)
            if name in self.scales:
                value = value * self.scales[name]
            if name in self.kept:
                self.kept[name].append((args, kwargs))
        except Exception as exc:  # the composite called the step with inputs outside its contract
            called = describe(args, kwargs, tuple(self.signatures[name].parameters))
            return {"ok": False, "error": f"it was called with {called}: {type(exc).__name__}: {exc}"[:400]}
        self.questions += 1
        self.counts[name] = self.counts.get(name, 0) + 1
        self.elements += size + sum(t.numel() for t in leaves(value if isinstance(value, tuple) else (value,), {}))
        if self.elements > MAX_CALL_ELEMENTS:
            return {"ok": False, "error": "too many questions in one call"}
        # a pinned step's answer is not differentiated: the Function asking it never needs to, and its gradients
        # at chosen cotangents would give the forward it asked about (review 80's F4)
        if frame.get("grad") is True and name not in self.pinned:
            self.asked[self.questions] = (name, args, kwargs)
        if self.backend == "numpy":
            value = _numpy_tree(value)
        encoded = wire.encode(value, out)
        if meta:  # a meta answer crosses as shapes and dtypes only
            out[:] = [b""] * len(out)
            encoded = _on_meta(encoded)
        return {"ok": True, "value": encoded, "index": self.questions}

    def _answer_grad(self, frame: dict, blobs: list, out: list) -> dict:
        index, grads = frame.get("index"), wire.decode(frame.get("grads"), blobs)
        if type(index) is not int or index not in self.asked or not isinstance(grads, tuple):
            return {"ok": False, "error": "no such answer to differentiate"}
        name, args, kwargs = self.asked[index]
        size = 2 * sum(t.numel() for t in leaves(args, kwargs)) + sum(t.numel() for t in leaves(grads, {}))
        if self.elements + size > MAX_CALL_ELEMENTS:  # the cotangents and the gradients count as answers do
            return {"ok": False, "error": "too many questions in one call"}
        self.elements += size
        return {"ok": True, "value": wire.encode(self._gradients(name, args, kwargs, grads), out)}

    def _gradients(self, name: str, args: tuple, kwargs: dict, grads: tuple) -> tuple:
        """The reference's vector-Jacobian product at the asked inputs: one gradient (or None) per tensor input."""
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]  # the worker's order: top level
        inputs = {id(t): t.detach().requires_grad_(t.is_floating_point()) for t in tensors}
        swap = lambda v: inputs.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
        with torch.enable_grad():
            value = self.references[name](*map(swap, args), **{k: swap(v) for k, v in kwargs.items()})
            outputs = value if isinstance(value, tuple) else (value,)
            pairs = [(o, g) for o, g in zip(outputs, grads, strict=False)
                     if isinstance(g, torch.Tensor) and o.requires_grad]
            if any(g.shape != o.shape for o, g in pairs):
                raise ValueError("the gradients do not have the answers' shapes")
            wanted = [t for t in inputs.values() if t.requires_grad]
            if not pairs or not wanted:
                return tuple(None for _ in tensors)
            # sum(o * g) has the gradients of backward(g), without the lazy import (sympy) explicit ones pay
            total = sum((o * g.to(o.dtype)).sum() for o, g in pairs)
            found = torch.autograd.grad(total, wanted, allow_unused=True)
        by_id = dict(zip((id(t) for t in wanted), found, strict=True))
        return tuple(by_id.get(id(inputs[id(t)])) for t in tensors)


def _promoted(values: tuple) -> tuple:
    floats = [v for v in values if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
    if not floats:
        return values
    common = np.result_type(*floats)
    return tuple(v.astype(common) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for v in values)


def _zeros_for_meta(values: tuple) -> tuple:
    return tuple(torch.zeros(v.shape, dtype=v.dtype) if isinstance(v, torch.Tensor) and v.is_meta else v
                 for v in values)


def _on_meta(item):
    """An encoded answer as a meta tensor's: its dtype and shape, on the meta device, no bytes."""
    if isinstance(item, dict) and item.get("kind") == "tensor":
        return {k: v for k, v in item.items() if k != "blob"} | {"device": "meta"}
    if isinstance(item, dict) and isinstance(item.get("items"), list):
        return dict(item, items=[_on_meta(v) for v in item["items"]])
    return item


def _float_parameter(parameter: inspect.Parameter) -> bool:
    return parameter.annotation in (float, "float") or type(parameter.default) is float


def question_sizes(bound: inspect.BoundArguments) -> list[float]:
    """The numbers in a question that may be sizes (t_q, num_heads, n_rep), whatever their type: ints, bools,
    floats, numpy scalars, tensors and arrays of one number, inside tuples, lists and dicts too. A float
    parameter (rope's base=10000) has none. A parameter annotated as a tensor or an array holds data, bounded
    by its shape: only its plain scalars count. One annotated otherwise is a size: its every number counts, and
    a tensor of more than MAX_SIZE_VALUES numbers there is an infinite size. An unannotated one (a spec's
    reference) counts its scalars and its tensors of one number; a longer tensor there is data."""
    sizes: list[float] = []
    for name, value in bound.arguments.items():
        parameter = bound.signature.parameters[name]
        if _float_parameter(parameter):
            continue
        annotation = parameter.annotation
        data = any(kind in str(annotation) for kind in ("Tensor", "ndarray"))
        sizes += _numbers(value, "data" if data else "unknown" if annotation is parameter.empty else "size")
    return sizes


MAX_SIZE_VALUES = 64  # numbers in a tensor given where a size is asked for


def _numbers(value, kind: str, depth: int = 0) -> list[float]:
    """The numbers in `value` that may be sizes, for a parameter of `kind` (see question_sizes)."""
    if isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)):
        return [float(value)]
    if isinstance(value, (torch.Tensor, np.ndarray)):
        tensor = as_tensor_tree(value)
        if kind == "data" or (kind == "unknown" and tensor.numel() > 1):
            return []
        if tensor.numel() > MAX_SIZE_VALUES or tensor.is_complex():
            return [math.inf]
        return tensor.detach().reshape(-1).to(torch.float64).tolist()
    if isinstance(value, (tuple, list, dict)):
        if depth >= 8:  # no size hides this deep in a contract's arguments
            return [math.inf]
        items = value.values() if isinstance(value, dict) else value
        return [n for item in items for n in _numbers(item, kind, depth + 1)]
    return []  # None, a string (a device), a dtype, an object that crossed as its type name only


def answer_size_bound(tensors: list, ints: list) -> int:
    """About the most elements a reference makes of these inputs, known before it runs: the broadcast of
    them all, every leading axis at its largest, then two axes as long as the longest of the last two
    or of the integer arguments (a matmul's Tq × Tk, a mask's t_q × t_k); or the whole broadcast times the
    largest integer, where that is more (repeat_kv's n_rep copies of every head: the twenty-eighth review's c05).
    A question whose inputs broadcast to more than the grader can hold is refused before anything is built."""
    rank = max((t.dim() for t in tensors), default=0)
    widest = [max((t.shape[t.dim() - rank + i] for t in tensors if t.dim() >= rank - i), default=1)
              for i in range(rank)]
    largest = max([1, *(abs(n) for n in ints)])
    longest = max(largest, 1, *widest[-2:])
    return max(math.prod(widest[:-2]) * longest * longest, math.prod(widest) * largest)


def _numpy_tree(value):
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, tuple):
        return tuple(_numpy_tree(v) for v in value)
    return value
