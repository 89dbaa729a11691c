"""A check's inputs: drawn from a generator seeded by the grader's seed and the check's name, so every
grade of a file asks the same questions, as tensors (torch exercises) or arrays (NumPy exercises)."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def generator(seed: int, name: str) -> torch.Generator:
    """A generator seeded from the grader's seed and the check's name: the same inputs on every run."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def random_mask(rng: torch.Generator, *shape: int, keep_first: bool = True) -> torch.Tensor:
    """A random bool mask (True = may attend); with keep_first no row is blocked entirely."""
    mask = torch.rand(shape, generator=rng) < 0.6
    if keep_first:
        mask[..., 0] = True
    return mask


def torch_dtype(dtype) -> torch.dtype:
    """A torch dtype, or the one a NumPy dtype stands for."""
    return dtype if isinstance(dtype, torch.dtype) else torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class Gen:
    """The check's own seeded inputs, as tensors (torch exercises) or arrays (NumPy exercises). `unknown` draws from
    a generator seeded by the file's text under the grading account's draw key as well (runner.Context.digest): sizes
    no file can know before it is written, for checks that a table of answers learned from earlier grades would pass
    (a table changes the file, and so the sizes), and that its author cannot work out beforehand."""

    def __init__(self, rng: torch.Generator, backend: str, unknown: torch.Generator | None = None):
        self.rng, self.backend = rng, backend
        self.unknown = unknown if unknown is not None else rng

    def randn(self, *shape: int, dtype=torch.float32, scale: float = 1.0):
        x = torch.randn(shape, generator=self.rng, dtype=torch.float64) * scale
        return self.native(x.to(torch_dtype(dtype)))

    def mask(self, *shape: int, keep_first: bool = True):
        return self.native(random_mask(self.rng, *shape, keep_first=keep_first))

    def native(self, x):
        """A tensor as the exercise's functions take it."""
        return x.numpy() if self.backend == "numpy" and isinstance(x, torch.Tensor) else x

    def seed(self) -> int:
        return int(torch.randint(2**31 - 1, (1,), generator=self.rng))
