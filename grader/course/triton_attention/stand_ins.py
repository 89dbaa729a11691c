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


    def unread(self, launcher, *args, **kwargs):
        """The launcher's answer where no Python of the candidate's reads a tensor's memory: a storage or a data
        pointer asked for is one of as many NaN, except while Triton itself copies a launch's arguments (the
        interpreter) or launches a compiled kernel. A launcher that computes its answer in Python from the bytes of
        its inputs answers NaN here, wherever that Python runs: before the launch, in a grid function, in a launch
        hook, or (the interpreter running a kernel's body as Python) in a function the kernel calls.

        The readers are answered by a torch-function mode of this probe's, not by replacing torch.Tensor's methods:
        torch dispatches every way to them to the mode (torch._C.TensorBase's own methods, a `.data` view's, a
        subclass's), where a replaced method is only one of those ways."""
        import torch

        jit = sys.modules.get("triton.runtime.jit")
        if jit is None:
            return getattr(_candidate(), launcher)(*args, **kwargs)
        interpreter = sys.modules.get("triton.runtime.interpreter")
        executor = getattr(interpreter, "GridExecutor", None)
        interpreted = getattr(interpreter, "InterpretedFunction", None)
        inside = [0]
        kept = []  # the NaN stand-ins, alive until the launcher is done
        base = torch._C.TensorBase
        store, pointer = base.untyped_storage, base.data_ptr

        def nan_like(t):
            elements = max(1, store(t).nbytes() // t.element_size())
            kept.append(torch.full((elements,), float("nan") if t.is_floating_point() else 0, dtype=t.dtype,
                                   device=t.device))
            return kept[-1]

        poisoned = {
            "untyped_storage": lambda t, *a, **k: store(nan_like(t)),
            "data_ptr": lambda t, *a, **k: pointer(nan_like(t)) + t.storage_offset() * t.element_size(),
        }

        class Unread(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                reader = poisoned.get(getattr(func, "__name__", ""))
                if reader is not None and not inside[0] and args and isinstance(args[0], torch.Tensor):
                    return reader(*args, **kwargs)
                return func(*args, **kwargs)

        numbers = (int, float, bool, str, type(None))

        def plain(value, depth=0) -> bool:
            """A launch's argument that runs no code of the candidate's when Triton reads it: a tensor of torch's own
            class, a number, or a tuple, list or dict of those, each type compared by identity (an object of any
            other class, a Triton dtype among them, may answer Triton's `hasattr(arg, "data_ptr")` with its code)."""
            kind = type(value)
            if kind is torch.Tensor or any(kind is n for n in numbers):
                return True
            if kind is tuple or kind is list:
                return depth < 4 and all(plain(v, depth + 1) for v in value)
            if kind is dict:
                return depth < 4 and all(plain(v, depth + 1) for v in dict.values(value))
            return False

        def with_memory(function, depth: int, arguments: bool = False):
            """`function` run where the readers answer truly (depth 1) or NaN (depth 0); with `arguments`, truly
            only if every argument is plain (an object of the candidate's own would run its code there)."""
            def run(*a, **k):
                own = depth if not arguments or plain((a[1:] if a and type(a[0]) is executor else a, k)) else 0
                kept_depth, inside[0] = inside[0], own
                try:
                    return function(*a, **k)
                finally:
                    inside[0] = kept_depth
            return run

        original = jit.KernelInterface.__getitem__
        hooked = []  # (kernel, its own pre-run hooks), put back when the launcher is done

        def interpreted_kernel(kernel) -> bool:
            """Does this launch run in the interpreter (an autotuner's or heuristics' kernel looked through)?"""
            for _ in range(8):
                if interpreted is None or isinstance(kernel, interpreted) or not hasattr(kernel, "fn"):
                    break
                kernel = kernel.fn
            return interpreted is not None and isinstance(kernel, interpreted)

        def launching(kernel, grid):
            hooks = getattr(kernel, "pre_run_hooks", None)
            if isinstance(hooks, list):
                hooked.append((kernel, hooks))
                kernel.pre_run_hooks = [with_memory(h, 0) for h in hooks]
            launch = original(kernel, with_memory(grid, 0) if callable(grid) else grid)
            if interpreted_kernel(kernel):
                return launch  # its argument copies read memory, nothing else of the launch
            return with_memory(launch, 1)  # compiled: the launch reads the arguments in C

        # What Triton runs of the candidate's inside a launch reads NaN: a grid function, the kernel's hooks, the
        # launch hooks; and in the interpreter only Triton's own copies of the arguments read memory (the kernel's
        # body, run as Python, is the candidate's too)
        patches = [(jit.KernelInterface, "__getitem__", launching)]
        runtime = getattr(sys.modules.get("triton.knobs"), "runtime", None)
        for hook in ("launch_enter_hook", "launch_exit_hook"):
            if callable(getattr(runtime, hook, None)):
                patches.append((runtime, hook, with_memory(getattr(runtime, hook), 0)))
        if executor is not None and interpreted is not None and hasattr(interpreter, "_implicit_cvt"):
            patches += [(executor, "_init_args_hst", with_memory(executor._init_args_hst, 1, arguments=True)),
                        (executor, "_restore_args_dev", with_memory(executor._restore_args_dev, 1, arguments=True)),
                        (interpreter, "_implicit_cvt", with_memory(interpreter._implicit_cvt, 1, arguments=True))]
        saved = [(owner, name, vars(owner).get(name)) for owner, name, _ in patches]
        try:
            for owner, name, value in patches:
                setattr(owner, name, value)
            with Unread():
                return getattr(_candidate(), launcher)(*args, **kwargs)
        finally:
            for owner, name, value in saved:
                if value is None:
                    delattr(owner, name)
                else:
                    setattr(owner, name, value)
            for kernel, hooks in reversed(hooked):
                kernel.pre_run_hooks = hooks


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
