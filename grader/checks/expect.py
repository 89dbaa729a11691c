"""What the hidden checks are written with: inputs, expectations, named mistakes.

Every comparison runs here, in the grader's process, on plain tensors decoded from the
worker's bytes, so nothing the candidate patches in its own process can change a verdict.
A failed expectation raises CheckFailed with a message that says what was expected and
what came back; when values are wrong, the known wrong variants are tried on the same
inputs and a match names the mistake.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from grader.candidate import CandidateError
from grader.wire import Opaque, device_of

step = pytest.mark.step  # @step("softmax", points=3): the check belongs to that step and is worth that much

# (rtol, atol) per dtype: loose enough for einsum, loops over heads and fused matmuls,
# tight enough that every named mistake is far outside.
TOLERANCES = {
    torch.float64: (1e-7, 1e-9),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
DEVICE_TOLERANCES = {torch.float32: (1e-3, 1e-4)}  # another device sums in another order

# Error messages of ops that simply have no meta kernel, or need data a meta tensor lacks.
META_UNSUPPORTED = ("'Meta' backend", "meta tensors", "Cannot copy out of meta tensor", "data-dependent", "register_meta")


class CheckFailed(AssertionError):
    """The candidate's answer is wrong; `mistake` names a known mistake that explains it."""

    def __init__(self, message: str, mistake: Mistake | None = None):
        super().__init__(message)
        self.message = message
        self.mistake = mistake


@dataclass(frozen=True)
class Mistake:
    """A known wrong answer: `variant` computes it from the check's inputs; or `test` spots it in the output."""

    id: str
    message: str
    variant: Callable | None = None
    test: Callable | None = None

    def explains(self, value, args: tuple) -> bool:
        if not isinstance(value, torch.Tensor) or value.is_meta:
            return False
        try:
            if self.test is not None:
                return bool(self.test(value, *args))
            wrong = self.variant(*args)
        except Exception:  # a variant that cannot be formed for these inputs (shapes) explains nothing
            return False
        return _close(value, wrong)


def generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded from the grader's seed and the check's name: the same inputs on every run."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def randn(rng: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=rng, dtype=torch.float64) * scale).to(dtype)


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


def expect_close(value, expected: torch.Tensor, mistakes=(), args: tuple = (), tolerances=TOLERANCES, device="cpu"):
    """The value matches the reference; if not, name the first mistake in `mistakes` that explains it."""
    try:
        expect_tensor(value, expected.shape, expected.dtype, device)
        if not _close(value, expected, tolerances):
            raise CheckFailed(_difference(value, expected))
    except CheckFailed as failure:
        for mistake in mistakes:
            if isinstance(value, torch.Tensor) and mistake.explains(value, args):
                raise CheckFailed(failure.message, mistake) from None
        raise


# Ways to switch off the worker's record of torch calls; a file that names one keeps no rule.
TAMPERING = ("DisableTorchFunction", "_disable_torch_function", "_pop_mode", "_set_torch_function_mode", "torch.ops.")


class Rules(tuple):
    """A step's forbidden torch function names, with the candidate's source to check for tampering."""

    source: str = ""


def expect_allowed(answer, forbidden: tuple[str, ...]) -> None:
    """The candidate's code called none of the step's forbidden torch functions, under any alias.

    A name matches when it contains a forbidden one, so `_safe_softmax`, `special_softmax`
    and `_softmax.default` (reached through torch.ops) all count as `softmax`.
    """
    source = getattr(forbidden, "source", "")
    tampering = [t for t in TAMPERING if forbidden and t in source]
    if tampering:
        raise CheckFailed(f"the file uses {tampering[0]}, which hides torch calls from the rules check")
    wanted = {f.lstrip("_") for f in forbidden}
    used = sorted(n for n in answer.called if any(f in n.split(".")[0] for f in wanted))
    if used:
        raise CheckFailed(f"called {', '.join(used)}, which this step must not use: write it with basic tensor ops")


def expect_no_import(source: str, module: str) -> None:
    """The candidate file does not import `module` (read, never run: the grader parses it)."""
    import ast

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


def call_on_device(candidate, device: str, name: str, *args, **kwargs):
    """Run a candidate function on the device under test; skip what the meta device cannot run."""
    try:
        return candidate.call(name, *args, device=device, **kwargs).value
    except CandidateError as error:
        skip_if_meta_unsupported(device, error)
        raise


def skip_if_meta_unsupported(device: str, error: CandidateError) -> None:
    if device == "meta" and error.kind == "raised" and any(s in error.message for s in META_UNSUPPORTED):
        pytest.skip(f"the meta device cannot run this code, so it was not checked there: {error.message}")


def expect_on_device(value, expected: torch.Tensor, device: str, args: tuple = (), mistakes=()) -> None:
    """The result stayed on `device`; on a real device its values match the CPU reference too."""
    if device == "meta":
        expect_tensor(value, expected.shape, expected.dtype, "meta")
    else:
        expect_close(value, expected, mistakes, args, tolerances={**TOLERANCES, **DEVICE_TOLERANCES}, device=device)


def _close(value: torch.Tensor, expected: torch.Tensor, tolerances=TOLERANCES) -> bool:
    if not isinstance(value, torch.Tensor) or value.shape != expected.shape or value.is_meta:
        return False
    rtol, atol = tolerances.get(expected.dtype, TOLERANCES[torch.float32])
    a, b = value.to(torch.float64), expected.to(torch.float64)
    return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())


def _difference(value: torch.Tensor, expected: torch.Tensor) -> str:
    a, b = value.to(torch.float64), expected.to(torch.float64)
    bad_nan = torch.isnan(a) & ~torch.isnan(b)
    if bad_nan.any():
        where = tuple(int(i) for i in bad_nan.nonzero()[0])
        return f"got NaN at {where} where the reference is {b[where].item():.6g} ({int(bad_nan.sum())} NaN in all)"
    error = (a - b).abs().nan_to_num(nan=float("inf"))
    error[(a == b)] = 0  # equal infinities are not an error
    flat = int(error.argmax())
    where = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    return (
        f"values differ from the reference: max abs error {error.max().item():.3g} at {where} "
        f"(expected {b[where].item():.6g}, got {a[where].item():.6g})"
    )


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- NumPy exercises ----------------------------------------------------------------------
# The same expectations for exercises whose functions take and return np.ndarray. Arrays are
# compared as tensors (torch.from_numpy), with expect_close's tolerances, difference message
# and named-mistake matching. A mistake's `variant` gets the check's NumPy inputs and may
# return an ndarray or a tensor; its `test` gets the candidate's ndarray and those inputs.

import warnings  # noqa: E402  (this section is appended; the torch-only helpers above need neither)

import numpy as np  # noqa: E402

KEPT_FLOAT64 = Mistake(
    "kept_float64",
    "kept float64: a float32 input came back float64. NumPy upcasts float32 when it meets a float64 array "
    "or NumPy scalar (np.sqrt(d), np.zeros(shape), np.full(shape, -np.inf)): use Python floats, "
    "or give dtype=x.dtype",
    test=lambda value, *args: isinstance(value, np.ndarray) and value.dtype == np.float64,
)


def expect_array(value, shape=None, dtype=None) -> np.ndarray:
    """The value is a plain np.ndarray with this shape and dtype; float32 upcast to float64 is named."""
    if isinstance(value, Opaque):
        raise CheckFailed(f"expected a numpy.ndarray, got {value.type_name}")
    if not isinstance(value, np.ndarray):
        raise CheckFailed(f"expected a numpy.ndarray, got {type(value).__module__}.{type(value).__qualname__}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise CheckFailed(f"expected shape {tuple(shape)}, got {tuple(value.shape)}")
    if dtype is not None and value.dtype != np.dtype(dtype):
        upcast = np.dtype(dtype) == np.float32 and value.dtype == np.float64
        raise CheckFailed(
            f"expected dtype {np.dtype(dtype).name} (the input's), got {value.dtype.name}", KEPT_FLOAT64 if upcast else None
        )
    return value


def expect_array_close(value, expected, mistakes=(), args: tuple = (), tolerances=TOLERANCES) -> None:
    """The array matches the reference (an ndarray or a tensor); if not, name the first mistake that explains it."""
    want = as_array(expected)
    try:
        expect_array(value, want.shape, want.dtype)
        got, want_t = as_tensor(value), as_tensor(want)
        if not _close(got, want_t, tolerances):
            raise CheckFailed(_difference(got, want_t))
    except CheckFailed as failure:
        if failure.mistake is None and isinstance(value, np.ndarray):
            for mistake in mistakes:
                if explains_array(mistake, value, args):
                    raise CheckFailed(failure.message, mistake) from None
        raise


def explains_array(mistake: Mistake, value: np.ndarray, args: tuple) -> bool:
    """Mistake.explains for NumPy answers: a variant's result is compared as a tensor, like expect_close does."""
    with np.errstate(all="ignore"), warnings.catch_warnings():  # a variant's overflow is not the grader's output
        warnings.simplefilter("ignore")
        if mistake.test is not None:
            return bool(mistake.test(value, *args))
        try:
            wrong = as_tensor(mistake.variant(*args))
        except Exception:  # a variant that cannot be formed for these inputs (shapes) explains nothing
            return False
    return _close(as_tensor(value), wrong)


def expect_numpy_only(answer, source: str) -> None:
    """The rules of a NumPy exercise: the file imports no torch, and the call ran no torch function."""
    expect_no_import(source, "torch")
    if answer.called:
        used = sorted(answer.called)
        more = f" and {len(used) - 5} more" if len(used) > 5 else ""
        raise CheckFailed(f"called torch ({', '.join(used[:5])}{more}): this exercise is NumPy only")


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
