"""The CUDA-only parts of triton_attention's checks, as far as a machine without a GPU can run them.

The speed check's decision (points within SPEED_FACTOR of SDPA's time, a message with both times and the ratio
beyond it, a skip without CUDA) is run on a stand-in for the worker's answer; the probe that lists the kernels
a launcher launched runs in this process on the reference under Triton's interpreter. What a GPU alone can
show (the timing itself, compiled kernels, Triton's compiler in the sandbox) is left to bench/gpu.py.
"""

import importlib.util
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from grader.course.triton_attention import spec
from grader.course.triton_attention.stand_ins import Launches
from grader.engine import CheckFailed


class FakeRun:
    """What the speed check asks of a Run: the device under test, and a script's results."""

    def __init__(self, device, kernel_ms=1.0, sdpa_ms=1.0):
        self.ctx = SimpleNamespace(device=device)
        self.step = SimpleNamespace(id="flash_attention")
        self.times = {"kernel_ms": kernel_ms, "sdpa_ms": sdpa_ms}
        self.scripts = []

    def inputs(self, **params):
        return params

    def answer(self, call, device="cpu"):
        self.answered = (call, device)

    def script(self, script, device="cpu", rules=True):
        self.scripts.append((script.actions, device, rules))
        return SimpleNamespace(value=[None, self.times])


def test_the_speed_check_skips_without_cuda_and_says_the_interpreter_ran():
    for device in ("meta", "cpu"):
        with pytest.raises(CheckFailed, match=r"Triton ran in its interpreter \(no CUDA\)") as skipped:
            spec.speed(FakeRun(device))
        assert skipped.value.outcome == "skipped"


def test_the_speed_check_passes_within_the_factor_and_says_the_ratio_beyond_it():
    run = FakeRun("cuda", kernel_ms=2.0, sdpa_ms=1.0)
    spec.speed(run)
    (actions, device, rules), = run.scripts
    assert rules is False  # the Timer is the grader's own stand-in; the candidate's rules are kept in its answers
    assert device == "cuda" and actions[0]["class"] == "Timer" and actions[0]["stand_in"] is True
    assert actions[1]["kwargs"]["block_m"] == spec.SPEED["block_m"]
    with pytest.raises(CheckFailed, match=r"took 5\.000 ms, F\.scaled_dot_product_attention 1\.000 ms, 5\.0×"):
        spec.speed(FakeRun("cuda", kernel_ms=5.0, sdpa_ms=1.0))


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="the triton extra is not installed")
def test_the_probe_lists_the_kernels_a_launcher_launched(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton.language

    if not torch.cuda.is_available() and type(triton.language.standard.max).__name__ == "JITFunction":
        pytest.skip("triton was imported in this process before TRITON_INTERPRET=1 was set")
    path = spec.__file__.replace("grader/course/triton_attention/spec.py", "solutions/triton_attention.py")
    module_spec = importlib.util.spec_from_file_location("candidate", path)
    candidate = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(candidate)
    monkeypatch.setitem(sys.modules, "candidate", candidate)
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    launched = Launches().run("softmax", torch.randn(3, 5, device=device))
    assert launched == [f"{type(candidate.softmax_kernel).__name__}:softmax_kernel"]
    monkeypatch.setattr(candidate, "softmax", lambda x: torch.softmax(x, -1))  # no kernel at all
    assert Launches().run("softmax", torch.randn(3, 5, device=device)) == []
