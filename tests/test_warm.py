"""The zygote's warm-up of the meta device (grader/sandbox/warm.py): paid without sympy, and exact.

Each test runs in a fresh interpreter: the stand-ins go into sys.modules, which this process shares with the rest
of the suite.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOAD = f"""
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("warm", {str(ROOT / "grader" / "sandbox" / "warm.py")!r})
warm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(warm)
"""


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOAD + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_meta_device_warms_and_runs_attention_without_sympy():
    """What the device checks do on the meta device asks symbolic_shapes only what a plain value answers: neither
    it nor sympy is loaded, and every result has the shape torch gives it."""
    out = run("""
        warm.warm_meta(torch)
        m = dict(device="meta")
        q, k = torch.randn(2, 3, 5, 8, **m), torch.randn(2, 3, 7, 8, **m)
        s = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~torch.ones(5, 7, dtype=torch.bool, **m).tril(), -1e9)
        o = torch.softmax(s, -1) @ k
        o = torch.nn.Linear(24, 24, **m)(o.transpose(1, 2).reshape(2, 5, 24))
        c = torch.stack([torch.cat([o, o], -1)] * 2).unsqueeze(0).expand(3, -1, -1, -1, -1)
        e = torch.einsum("bhqd,bhkd->bhqk", q, k) + torch.where(torch.ones(5, 7, dtype=torch.bool, **m), 0.0, s)
        f = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
        g = torch.gather(s, -1, torch.zeros(2, 3, 5, 1, dtype=torch.long, **m)) + torch.logsumexp(s, -1, keepdim=True)
        x = torch.zeros(4, 8, **m)
        x[1:3] = 1.0
        x.index_copy_(0, torch.tensor([0], **m), torch.ones(1, 8, **m))
        loaded = [sys.modules[n].__dict__["_loaded"] for n in ("sympy", "torch.fx.experimental.symbolic_shapes")]
        print(loaded, tuple(o.shape), tuple(c.shape), tuple(e.shape), tuple(f.shape), tuple(g.shape))
    """)
    assert out.split() == "[False, False] (2, 5, 24) (3, 2, 2, 5, 48) (2, 3, 5, 7) (2, 3, 5, 8) (2, 3, 5, 1)".split()


def test_asked_more_than_it_knows_a_stand_in_becomes_the_real_module_in_place():
    """Before the seal (the zygote's own start), a question the stand-ins cannot answer loads the real module into
    the same object, where sys.modules had it: the record's view of torch's namespaces sees no module replaced."""
    out = run("""
        warm.warm_meta(torch)
        before = sys.modules["sympy"], sys.modules["torch.fx.experimental.symbolic_shapes"]
        import sympy
        from torch.fx.experimental.symbolic_shapes import ShapeEnv, expect_true
        after = sys.modules["sympy"], sys.modules["torch.fx.experimental.symbolic_shapes"]
        print(before[0] is after[0], before[1] is after[1], sympy.Symbol("x") + 1,
              isinstance(sympy.Symbol("y"), sympy.Basic), ShapeEnv.__name__, expect_true(True))
    """)
    assert out.split() == "True True x + 1 True ShapeEnv True".split()


def test_once_sealed_a_stand_in_refuses_in_words_the_device_checks_read():
    """In a child (after the seal) the real module cannot load: a question past the stand-ins raises an error that
    says the meta device cannot run the code (a device check skips it, as it skips what has no meta kernel)."""
    out = run("""
        warm.warm_meta(torch)
        warm.seal()
        try:
            import sympy
            sympy.Symbol("x")
        except ImportError as error:
            print(type(error).__name__, "|", error)
        print(sys.modules["sympy"].__dict__["_loaded"])
    """)
    said, loaded = out.strip().splitlines()
    assert said.startswith("ImportError | sympy is not loaded in the grader's sandbox") and "Meta device" in said
    assert loaded == "False"
