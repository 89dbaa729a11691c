"""NumPy arrays and torch tensors on the grader's side: one as the other, found inside nested arguments,
and said as a person reads them.

Both the check engine (grader/engine/) and the oracle (grader/oracle.py) use these; the oracle is
imported by the engine's runner, so what they share lives here, below both.
"""

from __future__ import annotations

import numpy as np
import torch

from grader.candidate import Strided


def as_tensor(value) -> torch.Tensor:
    """An ndarray as a tensor (sharing its memory where it can); a tensor as it is."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value).reshape(value.shape))  # a 0-dim array stays 0-dim
    raise TypeError(f"not an array: {type(value).__qualname__}")


def as_array(value) -> np.ndarray:
    """A CPU tensor as an ndarray; an ndarray as it is."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    raise TypeError(f"not an array: {type(value).__qualname__}")


def as_tensor_tree(value):
    """ndarrays as tensors, inside tuples and lists too."""
    if isinstance(value, np.ndarray):
        return as_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(as_tensor_tree(v) for v in value)
    return value


def leaves(args: tuple, kwargs: dict, kind=torch.Tensor) -> list:
    """Every `kind` in the arguments, however deep in tuples, lists and dicts (a bool is no int)."""
    found = []

    def visit(x):
        if isinstance(x, kind) and not isinstance(x, bool):
            found.append(x)
        elif isinstance(x, (tuple, list, dict)):
            for y in x.values() if isinstance(x, dict) else x:
                visit(y)

    visit((*args, *kwargs.values()))
    return found


def describe(args: tuple, kwargs: dict, names: tuple = ()) -> str:
    """The inputs of a call, as a person reads them: names, shapes and dtypes."""
    names = names or tuple(f"arg{i}" for i in range(len(args)))
    parts = [f"{n} {_describe_value(a)}" for n, a in zip(names, args, strict=False)]
    parts += [f"{k}={_describe_value(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def _describe_value(value) -> str:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{tuple(value.shape)} {dtype}"
    if isinstance(value, Strided):
        return _describe_value(value.tensor) + " non-contiguous"
    return repr(value)
