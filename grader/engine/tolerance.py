"""What an answer is held to: its form (type, shape, dtype, device) and its values under the
tolerance policy.

Every comparison runs here, in the grader's process, on plain tensors decoded from the
worker's bytes, so nothing the candidate patches in its own process can change a verdict.
A failed expectation raises CheckFailed with a message that says what was expected and
what came back: for values, how many entries differ and the largest difference with what was
allowed there, and the numbers as data (max abs and relative error, where, expected, got).

The tolerance policy, stated once: the reference is computed in float64 (float32 for the
half types, upcast); float32 and float64 answers are held to TOLERANCES; an answer in a
half type is accepted within max(LOW_PRECISION_FACTOR x the error of the plain same-dtype
implementation, the dtype's floor in TOLERANCES), the rule of the FlashAttention tests,
so correct low-precision code never fails by luck and wrong code never passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from grader.arrays import as_array, as_tensor_tree
from grader.engine.failure import CheckFailed
from grader.wire import Opaque, device_of

# (rtol, atol) per dtype: loose enough for einsum, loops over heads and fused matmuls, and float64's for an exponent's
# constant written to 9 digits (exp2 by log2(e) = 1.44269504, off 6e-10, times an exponent of 36: review 69's F1),
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
            pairs = zip(native, exact, strict=True) if isinstance(native, tuple) else [(native, exact)]
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


def expect_form(value, native, backend: str = "torch", device: str = "cpu", outputs: tuple = ()) -> None:
    """The answer has the reference's type, shape and dtype, on `device`; tuples part by part."""
    if isinstance(native, tuple):
        parts = _parts(value, len(native), outputs)
        for name, part, expected in zip(_names(outputs, len(native)), parts, native, strict=True):
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
        for name, part, want in zip(_names(outputs, len(expected)), parts, expected, strict=True):
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
                _how_many(wrong)
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
    allowed = tolerance.allowed(b)
    wrong = error > allowed
    if not wrong.any():
        return
    details = {**_error_details(a, b, error), "wrong_entries": int(wrong.sum())}
    raise CheckFailed(_difference(a, b, error, allowed, wrong), details=details)


def _how_many(wrong: torch.Tensor) -> str:
    """How many entries differ, as torch.testing counts them: "7 / 60 entries differ from the reference (11.7%)"."""
    count, total = int(wrong.sum()), wrong.numel()
    share = 100 * count / max(total, 1)
    return f"{count} / {total} entries differ from the reference ({f'{share:.1f}' if share >= 0.1 else '<0.1'}%)"


def _difference(a: torch.Tensor, b: torch.Tensor, error: torch.Tensor, allowed: torch.Tensor,
                wrong: torch.Tensor) -> str:
    """How many entries are out of tolerance, then a NaN the reference does not have, or else the largest
    difference among them and what was allowed there (a, b: the answer and the reference, in float64)."""
    bad_nan = torch.isnan(a) & ~torch.isnan(b)
    if bad_nan.any():
        where = tuple(int(i) for i in bad_nan.nonzero()[0])
        return (f"{_how_many(wrong)}: got NaN at {where} where the reference is {b[where].item():.6g} "
                f"({int(bad_nan.sum())} NaN in all)")
    flat = int(torch.where(wrong, error, -1.0).argmax())
    where = tuple(int(i) for i in np.unravel_index(flat, a.shape))  # torch.unravel_index imports sympy (0.2 s)
    return (f"{_how_many(wrong)}; the largest by {error[where].item():.3g} at {where} where "
            f"{allowed[where].item():.3g} was allowed (expected {b[where].item():.6g}, got {a[where].item():.6g})")


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


EXACT_FLOAT64 = Tolerance(1e-9, 1e-10)  # a step of products and sums alone, no exponent: float64's own precision
