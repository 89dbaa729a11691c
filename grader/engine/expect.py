"""What an answer is held to: its form (type, shape, dtype, device), its values under the
tolerance policy, and the rules of its step.

Every comparison runs here, in the grader's process, on plain tensors decoded from the
worker's bytes, so nothing the candidate patches in its own process can change a verdict.
A failed expectation raises CheckFailed with a message that says what was expected and
what came back, and the numbers as data (max abs and relative error, where, expected, got).

The tolerance policy, stated once: the reference is computed in float64 (float32 for the
half types, upcast); float32 and float64 answers are held to TOLERANCES; an answer in a
half type is accepted within max(LOW_PRECISION_FACTOR x the error of the plain same-dtype
implementation, the dtype's floor in TOLERANCES), the rule of the FlashAttention tests,
so correct low-precision code never fails by luck and wrong code never passes.
"""

from __future__ import annotations

import ast
import math
import re
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from grader.wire import Opaque, device_of

# (rtol, atol) per dtype: loose enough for einsum, loops over heads and fused matmuls,
# tight enough that every named mistake is far outside. For the half types, the floor.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
DEVICE_TOLERANCES = {torch.float32: (1e-3, 1e-4)}  # another device sums in another order
LOW_PRECISION_FACTOR = 2
HALF_TYPES = (torch.float16, torch.bfloat16)

# Ways to switch off the worker's record of torch calls; a file that names one keeps no rule.
# Names of ways to blind the worker's record of torch calls: switching the mode off, or reaching the
# record itself (the mode stack, the worker's frames, the garbage collector's list of every object).
TAMPERING = ("DisableTorchFunction", "_disable_torch_function", "_pop_mode", "_set_torch_function_mode", "torch.ops.",
             "_get_current_function_mode_stack", "_getframe", "currentframe", "f_locals", "f_back", "get_objects")


class CheckFailed(AssertionError):
    """The candidate's answer is wrong (or its code raised: outcome "error"); `mistake` names a
    known mistake that explains it; `details` carry the numbers (max abs error, where, ...);
    `breach` marks a broken rule, which costs the whole step.
    """

    def __init__(self, message: str, mistake=None, details: dict | None = None, outcome: str = "failed",
                 breach: bool = False):
        super().__init__(message)
        self.message = message
        self.mistake = mistake
        self.details = details or {}
        self.outcome = outcome
        self.breach = breach


def generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded from the grader's seed and the check's name: the same inputs on every run."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def random_mask(rng: torch.Generator, *shape: int, keep_first: bool = True) -> torch.Tensor:
    """A random bool mask (True = may attend); with keep_first no row is blocked entirely."""
    mask = torch.rand(shape, generator=rng) < 0.6
    if keep_first:
        mask[..., 0] = True
    return mask


def expect_tensor(value, shape=None, dtype=None, device: str = "cpu") -> torch.Tensor:
    """The value is a plain torch.Tensor with this shape, dtype and device."""
    if isinstance(value, Opaque):
        raise CheckFailed(f"expected a torch.Tensor, got {value.type_name}")
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"expected a torch.Tensor, got {type(value).__module__}.{type(value).__qualname__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"expected shape {tuple(shape)}, got {tuple(value.shape)}")
    if dtype is not None and value.dtype != dtype:
        raise CheckFailed(f"expected dtype {_name(dtype)} (the input's), got {_name(value.dtype)}")
    where = device_of(value)
    if where.split(":")[0] != device.split(":")[0]:
        raise CheckFailed(f"expected the result on {device} (the input's device), got it on {where}")
    return value


def expect_array(value, shape=None, dtype=None) -> np.ndarray:
    """The value is a plain np.ndarray with this shape and dtype."""
    if isinstance(value, Opaque):
        raise CheckFailed(f"expected a numpy.ndarray, got {value.type_name}")
    if not isinstance(value, np.ndarray):
        raise CheckFailed(f"expected a numpy.ndarray, got {type(value).__module__}.{type(value).__qualname__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"expected shape {tuple(shape)}, got {tuple(value.shape)}")
    if dtype is not None and value.dtype != np.dtype(dtype):
        raise CheckFailed(f"expected dtype {np.dtype(dtype).name} (the input's), got {value.dtype.name}")
    return value


def expect_no_import(source: str, module: str) -> None:
    """The candidate file does not import `module` (read, never run: the grader parses it)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        raise CheckFailed("the file does not parse") from None
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if any(n == module or n.startswith(module + ".") for n in names):
            raise CheckFailed(f"imports {module} at line {node.lineno}: this exercise must not use it")


def as_tensor(value) -> torch.Tensor:
    """An ndarray as a tensor (sharing its memory where it can); a tensor as it is."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"not an array: {type(value).__qualname__}")


def as_array(value) -> np.ndarray:
    """A CPU tensor as an ndarray; an ndarray as it is."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    raise TypeError(f"not an array: {type(value).__qualname__}")


def _difference(value: torch.Tensor, expected: torch.Tensor) -> str:
    a, b = value.to(torch.float64), expected.to(torch.float64)
    bad_nan = torch.isnan(a) & ~torch.isnan(b)
    if bad_nan.any():
        where = tuple(int(i) for i in bad_nan.nonzero()[0])
        return f"got NaN at {where} where the reference is {b[where].item():.6g} ({int(bad_nan.sum())} NaN in all)"
    error = (a - b).abs().nan_to_num(nan=float("inf"))
    error[(a == b)] = 0  # equal infinities are not an error
    flat = int(error.argmax())
    where = tuple(int(i) for i in np.unravel_index(flat, a.shape))  # torch.unravel_index imports sympy (0.2 s)
    return (
        f"values differ from the reference: max abs error {error.max().item():.3g} at {where} "
        f"(expected {b[where].item():.6g}, got {a[where].item():.6g})"
    )


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Tolerance:
    """How close an answer must be: |got - expected| <= max(slack, atol + rtol·|expected|)."""

    rtol: float
    atol: float
    slack: float = 0.0  # LOW_PRECISION_FACTOR x the plain same-dtype implementation's max error

    @classmethod
    def of(cls, native, exact, device: str = "cpu") -> "Tolerance":
        """The tolerance for an answer of `native`'s dtype, against the upcast reference `exact`."""
        dtype = _first_tensor(native).dtype
        table = {**TOLERANCES, **DEVICE_TOLERANCES} if device != "cpu" else TOLERANCES
        rtol, atol = table.get(dtype, TOLERANCES[torch.float32])
        slack = 0.0
        if dtype in HALF_TYPES:
            pairs = zip(native, exact) if isinstance(native, tuple) else [(native, exact)]
            errors = [(a.double() - b.double()).abs().nan_to_num(0, 0, 0).max().item() for a, b in pairs if a.numel()]
            slack = LOW_PRECISION_FACTOR * max(errors, default=0.0)
        return cls(rtol, atol, slack)

    @classmethod
    def loose(cls, value) -> "Tolerance":
        """For matching a mistake's variant: the floor of the answer's own dtype."""
        first = _first_tensor(as_tensor_tree(value))
        rtol, atol = TOLERANCES.get(getattr(first, "dtype", None), TOLERANCES[torch.float32])
        return cls(rtol, atol)

    def allowed(self, expected: torch.Tensor) -> torch.Tensor:
        """The error allowed at each entry: an infinite or NaN entry allows none (it must be matched exactly)."""
        scale = expected.abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        return (self.atol + self.rtol * scale).clamp_min(self.slack)


def upcast(value):
    """Tensors in float64 (float32 for the half types), inside tuples, lists and dicts too."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float32 if value.dtype in HALF_TYPES else torch.float64)
    if isinstance(value, (tuple, list)):
        return type(value)(upcast(v) for v in value)
    if isinstance(value, dict):
        return {k: upcast(v) for k, v in value.items()}
    return value


def as_tensor_tree(value):
    """ndarrays as tensors, inside tuples and lists too."""
    if isinstance(value, np.ndarray):
        return as_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(as_tensor_tree(v) for v in value)
    return value


def expect_form(value, native, backend: str = "torch", device: str = "cpu", outputs: tuple = ()) -> None:
    """The answer has the reference's type, shape and dtype, on `device`; tuples part by part."""
    if isinstance(native, tuple):
        parts = _parts(value, len(native), outputs)
        for name, part, expected in zip(_names(outputs, len(native)), parts, native):
            _prefixed(name, expect_form, part, expected, backend, device)
        return
    if backend == "numpy":
        expect_array(value, tuple(native.shape), as_array(native[:0] if native.dim() else native).dtype)
        return
    expect_tensor(value, device=device)
    if tuple(value.shape) != tuple(native.shape):
        raise CheckFailed(f"expected shape {tuple(native.shape)}, got {tuple(value.shape)}",
                          details={"expected_shape": list(native.shape), "got_shape": list(value.shape)})
    if value.dtype != native.dtype:
        what = "a bool mask (True = may attend)" if native.dtype == torch.bool else f"dtype {_name(native.dtype)}"
        raise CheckFailed(f"expected {what}, got dtype {_name(value.dtype)}",
                          details={"expected_dtype": _name(native.dtype), "got_dtype": _name(value.dtype)})


def expect_close(value, expected, call=None, tolerance: Tolerance | None = None, outputs: tuple = ()) -> None:
    """The answer equals the reference within `tolerance` (bool answers exactly); tuples part by part."""
    if isinstance(expected, tuple):
        parts = _parts(value, len(expected), outputs)
        for name, part, want in zip(_names(outputs, len(expected)), parts, expected):
            _prefixed(name, expect_close, part, want, call, tolerance, ())
        return
    got = as_tensor_tree(value)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(expected.shape):
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"expected shape {tuple(expected.shape)}, got {shape}")
    if expected.dtype == torch.bool or not expected.is_floating_point():
        if got.dtype != expected.dtype or not torch.equal(got, expected):
            wrong = got.to(expected.dtype) != expected
            where = tuple(int(i) for i in wrong.nonzero()[0]) if wrong.any() else ()
            raise CheckFailed(
                f"{int(wrong.sum())} of {wrong.numel()} entries differ from the reference"
                + (f": expected {_item(expected[where])} at {where}, got {_item(got[where])}" if where else ""),
                details={"wrong_entries": int(wrong.sum()), "where": list(where), **grid(got, expected)},
            )
        return
    tolerance = tolerance or Tolerance(*TOLERANCES.get(got.dtype, TOLERANCES[torch.float32]))
    a, b = got.to(torch.float64), expected.to(torch.float64)
    error = (a - b).abs()
    error[a == b] = 0  # equal infinities are not an error
    error = error.nan_to_num(nan=float("inf"))
    error[torch.isnan(a) & torch.isnan(b)] = 0
    if bool((error <= tolerance.allowed(b)).all()):
        return
    raise CheckFailed(_difference(got, expected), details=_error_details(a, b, error))


GRID_SIZE = 12  # rows and columns of a pattern a report shows


def _json_number(value) -> float | str:
    """A float for a JSON report: NaN and ±inf as the strings "nan", "inf", "-inf" (JSON has no such numbers)."""
    value = float(value)
    return round(value, 3) if math.isfinite(value) else str(value)


def grid(got, expected) -> dict:
    """The first matrix of a mask or of attention weights, returned and expected, for a report to draw.

    {"grid": {"expected": rows, "got": rows}}: bools (may attend), or weights as floats; {} when
    the two are no matrices of one shape.
    """
    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)) or got.shape != expected.shape:
        return {}
    if got.dim() < 2 or got.is_meta:
        return {}
    first = (0,) * (got.dim() - 2)
    rows = lambda x: [[bool(v) if x.dtype == torch.bool else _json_number(v) for v in row]  # noqa: E731
                      for row in x[first][:GRID_SIZE, :GRID_SIZE].tolist()]
    return {"grid": {"expected": rows(expected), "got": rows(got), "shape": list(got.shape[-2:])}}


def _error_details(a: torch.Tensor, b: torch.Tensor, error: torch.Tensor) -> dict:
    flat = int(error.argmax())
    where = tuple(int(i) for i in np.unravel_index(flat, a.shape))  # torch.unravel_index imports sympy (0.2 s)
    relative = (error / b.abs().clamp_min(1e-12)).nan_to_num(nan=float("inf"))
    return {
        "max_abs_error": _finite(error.max().item()),
        "max_rel_error": _finite(relative.max().item()),
        "where": list(where),
        "expected": _finite(b[where].item()),
        "got": _finite(a[where].item()),
    }


def _finite(x: float):
    """JSON has no inf or nan: say them as strings."""
    return x if x == x and abs(x) != float("inf") else str(x)


def _item(x: torch.Tensor):
    return bool(x) if x.dtype == torch.bool else x.item()


def _parts(value, n: int, outputs: tuple):
    if isinstance(value, (tuple, list)) and len(value) == n:
        return value
    what = "(" + ", ".join(_names(outputs, n)) + ")"
    if isinstance(value, (tuple, list)):
        got = f"a {type(value).__name__} of {len(value)}"
    else:
        got = value.type_name if isinstance(value, Opaque) else f"a {type(value).__name__}"
    raise CheckFailed(f"expected a tuple {what}, got {got}")


def _names(outputs: tuple, n: int) -> tuple:
    return outputs if len(outputs) == n else tuple(f"output {i}" for i in range(n))


def _prefixed(name: str, expectation, *args) -> None:
    try:
        expectation(*args)
    except CheckFailed as failure:
        details = failure.details
        if name == "weights" and "grid" not in details:  # attention weights: the pattern is worth a look
            details = {**details, **grid(as_tensor_tree(args[0]), args[1])}
        raise CheckFailed(f"{name}: {failure.message}", failure.mistake, details) from None


def _first_tensor(value):
    while isinstance(value, (tuple, list)) and value:
        value = value[0]
    return value


def check_rules(called, forbidden: tuple[str, ...], source: str, step_source: str = "") -> None:
    """The call used none of the step's forbidden torch functions, under any alias: a breach costs the step.

    A name matches when it contains a forbidden one, so `_safe_softmax`, `special_softmax`
    and `_softmax.default` (reached through torch.ops) all count as `softmax`.
    """
    tampering = [t for t in TAMPERING if forbidden and t in source]
    if tampering:  # hiding a forbidden call in the step costs what making it costs; elsewhere, the rules checks
        from grader.engine.diagnose import FORBIDDEN_CALL

        raise CheckFailed(f"the file uses {tampering[0]}, which hides torch calls from the rules check", FORBIDDEN_CALL,
                          details={"tampering": tampering[0]}, breach=tampering[0] in _with_helpers(source, step_source))
    wanted = {f.lstrip("_") for f in forbidden}
    used = sorted(n for n in called if any(f in n.split(".")[0] for f in wanted))
    if used:
        from grader.engine.diagnose import FORBIDDEN_CALL

        raise CheckFailed(f"called {', '.join(used)}, which this step must not use: write it with basic tensor ops",
                          FORBIDDEN_CALL, details={"forbidden_calls": used}, breach=True)


def _with_helpers(source: str, step_source: str) -> str:
    """The step's source and that of every top-level definition it names, and those name, and so on."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return step_source
    defined = {node.name: ast.get_source_segment(source, node) or "" for node in tree.body if hasattr(node, "name")}
    texts, frontier, seen = [step_source], [step_source], set()
    while frontier:
        text = frontier.pop()
        for name in sorted(defined.keys() - seen):
            if re.search(rf"\b{re.escape(name)}\b", text):
                seen.add(name)
                texts.append(defined[name])
                frontier.append(defined[name])
    return "\n".join(texts)


def numpy_only(answer, source: str, step: str, steps: tuple[str, ...]) -> None:
    """The rules of a NumPy exercise: the call runs no torch (a breach), the file imports none (a small cost).

    The import is charged to the steps whose code names what it bound (a step that used torch
    costs itself, not its neighbours); an import no step's code names, the habit of a first
    line, costs every step a little, as a rule of the whole file.
    """
    if answer.called:
        used = sorted(answer.called)
        more = f" and {len(used) - 5} more" if len(used) > 5 else ""
        from grader.engine.diagnose import FORBIDDEN_CALL

        raise CheckFailed(f"called torch ({', '.join(used[:5])}{more}): this exercise is NumPy only",
                          FORBIDDEN_CALL, details={"forbidden_calls": used}, breach=True)
    try:
        expect_no_import(source, "torch")
    except CheckFailed:
        tree = ast.parse(source)  # it parsed in expect_no_import
        users = [s for s in steps if _names_any(tree, s, _bound_by_imports_of(tree, "torch"), steps)]
        if not users or step in users:
            raise


def _bound_by_imports_of(tree: ast.AST, module: str) -> set[str]:
    """The names that the file's imports of `module` (anywhere in it) bind."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == module}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == module and not node.level:
            bound |= {a.asname or a.name for a in node.names}
    return bound


def _names_any(tree: ast.Module, step: str, names: set[str], steps: tuple[str, ...]) -> bool:
    """Whether the step's definition, or a helper it names (and so on), names any of `names`.

    Other steps are not followed: what they name is theirs (a module that calls `project` is
    not charged for `project`'s code).
    """
    defined = {node.name: node for node in tree.body if hasattr(node, "name") and (node.name == step or node.name not in steps)}
    reached, frontier = set(), {step} & defined.keys()
    while frontier:
        reached |= frontier
        named = {n.id for name in frontier for n in ast.walk(defined[name]) if isinstance(n, ast.Name)}
        if named & names:
            return True
        frontier = (named & defined.keys()) - reached
    return False
