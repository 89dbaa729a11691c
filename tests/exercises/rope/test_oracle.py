"""Check the rope reference (solutions/rope.py) against oracles outside it.

- The two layouts are related by a fixed permutation of the features: with P the order
  (0, 2, 4, ..., 1, 3, 5, ...), the half layout applied to x[..., P] is the interleaved
  layout's answer, permuted by P. So each layout is the other's oracle.
- The interleaved layout is complex multiplication: torch.view_as_complex(x) · e^(i·m·θ),
  in float64, with θ from the formula (not from rope_frequencies).
- The rotation's defining property: q(m)·k(n) depends only on m − n.
If the reference disagrees with them, the reference is wrong.
"""

import math

import pytest
import torch

from solutions import rope as ref

B, H, T, DH = 2, 3, 7, 16


def permutation(dh: int) -> torch.Tensor:
    return torch.cat((torch.arange(0, dh, 2), torch.arange(1, dh, 2)))  # even features first, then the odd ones


@pytest.mark.parametrize("dh", [2, 8, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_the_layouts_are_one_permutation_apart(dh, dtype, base):
    g = torch.Generator().manual_seed(dh)
    x = torch.randn(B, H, T, dh, generator=g, dtype=dtype)
    positions = torch.tensor([0, 1, 5, 6, 40, 1000, 4097])
    perm = permutation(dh)
    inverse = torch.argsort(perm)
    half = ref.apply_rope(x[..., perm], *ref.rope_cos_sin(positions, dh, base))[..., inverse]
    interleaved = ref.apply_rope_interleaved(x, positions, base)
    # rope_cos_sin's tables are float32 even for a float64 x: an error that grows with the position
    torch.testing.assert_close(half, interleaved, atol=4e-7 * 4097 * float(x.abs().max()), rtol=1e-5)
    halves = ref.apply_rope(x, *ref.rope_cos_sin(positions, dh, base))
    assert dh == 2 or not torch.allclose(halves, interleaved, atol=1e-3)


def test_interleaved_is_complex_multiplication():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, H, T, DH, generator=g, dtype=torch.float64)
    positions = torch.tensor([0, 2, 3, 9, 100, 2048, 8192])
    theta = torch.tensor([10000.0 ** (-2 * i / DH) for i in range(DH // 2)], dtype=torch.float64)
    z = torch.polar(torch.ones(T, DH // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(B, H, T, DH // 2, 2)) * z).flatten(-2)
    torch.testing.assert_close(ref.apply_rope_interleaved(x, positions), expected, atol=1e-12, rtol=1e-12)


def test_frequencies_and_tables_match_the_formula():
    theta = ref.rope_frequencies(8)
    assert theta.dtype == torch.float32 and theta.tolist() == pytest.approx([1.0, 0.1, 0.01, 0.001], rel=1e-6)
    positions = torch.tensor([0, 3, 8192])
    cos, sin = ref.rope_cos_sin(positions, 8)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (3, 8)
    angles = positions.double()[:, None] * torch.tensor([10000.0 ** (-i / 4) for i in range(4)], dtype=torch.float64)
    angles = torch.cat((angles, angles), -1)
    torch.testing.assert_close(cos.double(), angles.cos(), atol=8192 * 4e-7, rtol=0)
    torch.testing.assert_close(sin.double(), angles.sin(), atol=8192 * 4e-7, rtol=0)


def test_scores_depend_only_on_the_distance():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, DH, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, DH, generator=g, dtype=torch.float64)

    def score(m, n):
        qm = ref.apply_rope(q, *ref.rope_cos_sin(torch.tensor([m]), DH))
        kn = ref.apply_rope(k, *ref.rope_cos_sin(torch.tensor([n]), DH))
        return float((qm * kn).sum())

    assert score(7, 3) == pytest.approx(score(1007, 1003), abs=1e-3)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)
    assert math.isclose(score(0, 0), float((q * k).sum()), abs_tol=1e-12)  # position 0 is the identity


def test_module_is_invariant_to_a_shift_and_validates_its_width():
    torch.manual_seed(0)
    mod = ref.RotarySelfAttention(32, 4, bias=True).double()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    positions = torch.tensor([0, 2, 3, 10, 11])
    torch.testing.assert_close(mod(x, positions + 500), mod(x, positions), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(mod(x, positions), mod(x), atol=1e-3)  # the positions are used
    with pytest.raises(ValueError):
        ref.RotarySelfAttention(30, 4)
