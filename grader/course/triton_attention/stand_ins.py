"""Probes the worker builds for triton_attention's checks: grader code that runs inside the sandbox.

Not stand-ins for a candidate's class (this exercise has none) but the same mechanism: a script builds
one by name (`build(..., stand_in=True)`), its own torch calls are not recorded as the candidate's,
and what it returns is plain data. It imports only the standard library at load (the zygote loads
this file before any child sets TRITON_INTERPRET), torch inside its methods, and triton from the modules
the candidate's file loaded. It reads
the candidate's module where the worker keeps it (sys.modules["candidate"]). Like every record made
in the candidate's process, what it says is best effort: code that patches triton or torch.cuda can
fool it.
"""

import statistics
import sys


def _candidate():
    return sys.modules["candidate"]


class Launches:
    """Runs one launcher of the candidate's module and lists the Triton kernels it launched as kernel[grid](...)."""

    def run(self, launcher, *args, **kwargs):
        jit = sys.modules.get("triton.runtime.jit")  # loaded by the candidate's file, if it uses Triton at all
        if jit is None:
            getattr(_candidate(), launcher)(*args, **kwargs)
            return []
        KernelInterface = jit.KernelInterface
        launched = []
        original = KernelInterface.__getitem__

        def getitem(kernel, grid):
            fn = getattr(kernel, "fn", None)
            launched.append(f"{type(kernel).__name__}:{getattr(fn, '__name__', '?')}")
            return original(kernel, grid)

        KernelInterface.__getitem__ = getitem
        try:
            getattr(_candidate(), launcher)(*args, **kwargs)
        finally:
            KernelInterface.__getitem__ = original
        return launched


    def without_kernels(self, launcher, *args, **kwargs):
        """The launcher's answer with every Triton launch doing nothing and every tensor torch leaves uninitialised
        filled with NaN: what the launcher computes itself, which must not be the answer."""
        import torch

        jit = sys.modules.get("triton.runtime.jit")
        if jit is None:
            return getattr(_candidate(), launcher)(*args, **kwargs)
        KernelInterface = jit.KernelInterface
        original = KernelInterface.__getitem__
        # each maker, and whether its owner holds it itself (torch.Tensor inherits new_empty: put back, it must
        # be inherited again, or the record would see torch's tensor class changed)
        makers = {(owner, name): (getattr(owner, name), name in vars(owner))
                  for owner, name in ((torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"),
                                      (torch.Tensor, "new_empty"))}

        def poisoned(make):
            def wrapper(*a, **k):
                made = make(*a, **k)
                if made.is_floating_point() and made.device.type != "meta":
                    made.fill_(float("nan"))
                return made
            return wrapper

        KernelInterface.__getitem__ = lambda kernel, grid: (lambda *a, **k: None)
        for (owner, name), (make, _) in makers.items():
            setattr(owner, name, poisoned(make))
        try:
            return getattr(_candidate(), launcher)(*args, **kwargs)
        finally:
            KernelInterface.__getitem__ = original
            for (owner, name), (make, own) in makers.items():
                if own:
                    setattr(owner, name, make)
                else:
                    delattr(owner, name)


class Timer:
    """Times a launcher against F.scaled_dot_product_attention on CUDA, on inputs made here (none cross the wire)."""

    def flash(self, launcher, batch, heads, t, d, block_m, block_n, repeats=20):
        import torch
        import torch.nn.functional as F

        generator = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(batch, heads, t, d, device="cuda", dtype=torch.float16, generator=generator)
                   for _ in range(3))
        function = getattr(_candidate(), launcher)
        kernel = self._median_ms(torch, lambda: function(q, k, v, causal=True, block_m=block_m, block_n=block_n),
                                 repeats)
        sdpa = self._median_ms(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)
        return {"kernel_ms": kernel, "sdpa_ms": sdpa}

    @staticmethod
    def _median_ms(torch, work, repeats):
        work()  # compile and warm up
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
