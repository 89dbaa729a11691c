"""The worker's record of a call's torch functions holds against a candidate who reads the worker's code.

Each case is an attack from the threat model (docs/sandbox.md, "The record"): a way to make a forbidden
torch call (softmax in the softmax step) without the record seeing it, by reaching the record through
the interpreter's back doors or by running the call where the record cannot see. Each must fail: the
back door is refused (the step's own code then falls back to the forbidden call, which is seen), or the
worker says the record may be incomplete. Either way the step keeps no rule points, and every other
step keeps its full marks (but for rule points, where the file names a back door the source scan knows).
"""

import ctypes
import importlib.util
import os
import platform
import sys
import textwrap
import threading

import pytest

from tests.conftest import PORTABLE, ROOT, explain, lost

FALLBACK = """
def softmax(scores, dim=-1):
    try:
        return attack(scores, dim)
    except Exception as error:
        print("attack refused:", type(error).__name__, error)
        return torch.softmax(scores, dim).nan_to_num(0.0)
"""

# What several attacks share: a job run where the record is stashed (inside a torch call), and the step's answer
# computed by such a job during `call`
STASHED = """
_jobs = []


def _in_stash():
    if _jobs and not torch._C._is_torch_function_mode_enabled():
        _jobs.pop()()


def _through(call, scores, dim):
    out = []
    _jobs.append(lambda: out.append(torch.softmax(scores, dim).nan_to_num(0.0)))
    call()
    _jobs.clear()
    return out[0]
"""

def _fake_module(claim: str = "pass") -> str:
    """A module of the file's own put where torch's code imports lazily inside a call (Tensor.resize imports
    torch.autograd._functions), `claim` run on it first (round 8: setting its __file__ to one of torch's)."""
    return f"""
        import os, sys, types
        def attack(scores, dim):
            fake = types.ModuleType("torch.autograd._functions")
            {claim}
            class Resize:
                @staticmethod
                def apply(tensor, sizes):
                    return torch.softmax(scores, dim).nan_to_num(0.0)
            fake.Resize = Resize
            sys.modules["torch.autograd._functions"] = fake
            return scores.resize(*scores.shape)
    """


def _default_attack(keep: str, change: str, restore: str) -> str:
    """A default that Tensor.dim_order's body reads inside the call (round 7), replaced or changed in place by
    `change` for one call, with a list subclass whose iteration runs torch.softmax there."""
    return f"""
        def attack(scores, dim):
            box = []
            class Formats(list):
                def __iter__(self):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    raise LookupError("done")
            {keep}
            {change}
            try:
                scores.dim_order()
            except LookupError:
                pass
            finally:
                {restore}
            return box[0]
    """


ATTACKS = {
    "a thread": """
        import threading
        def attack(scores, dim):
            out = {}
            thread = threading.Thread(target=lambda: out.update(v=torch.softmax(scores, dim).nan_to_num(0.0)))
            thread.start()
            thread.join()
            return out["v"]
    """,
    "_thread directly": """
        import _thread, time
        def attack(scores, dim):
            out = {}
            _thread.start_new_thread(lambda: out.update(v=torch.softmax(scores, dim).nan_to_num(0.0)), ())
            while "v" not in out:
                time.sleep(0.001)
            return out["v"]
    """,
    "the worker's modules": """
        import sys
        def attack(scores, dim):
            worker = [m for name, m in list(sys.modules.items()) if "attn_grade" in name or "sandbox" in name]
            main = [v for v in vars(sys.modules["__main__"]).values() if hasattr(v, "_handle") or hasattr(v, "serve")]
            if not worker and not main:
                raise LookupError("no worker module in reach")
            for module in worker + main:
                for name in dir(module):
                    if hasattr(getattr(module, name), "seen"):
                        getattr(module, name).seen = set()
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "the frames below": """
        import sys
        def attack(scores, dim):
            frame = sys._getframe(1)
            while frame is not None:
                for value in list(frame.f_locals.values()):
                    if hasattr(value, "paused"):
                        with value.paused():
                            return torch.softmax(scores, dim).nan_to_num(0.0)
                frame = frame.f_back
            raise LookupError("no record found")
    """,
    "a traceback's frames": """
        def attack(scores, dim):
            try:
                raise ValueError
            except ValueError as error:
                frame = error.__traceback__.tb_frame.f_back
            for value in list(frame.f_locals.values()):
                if hasattr(value, "paused"):
                    with value.paused():
                        return torch.softmax(scores, dim).nan_to_num(0.0)
            raise LookupError("no record found")
    """,
    "the object graph": """
        import gc
        def attack(scores, dim):
            modes = [o for o in gc.get_objects() if hasattr(o, "paused") and hasattr(o, "seen")]
            with modes[0].paused():
                return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "the mode stack, by a name built at run time": """
        def attack(scores, dim):
            pop = getattr(torch._C, "_pop_torch_" + "function_stack")
            mode = pop()
            try:
                return torch.softmax(scores, dim).nan_to_num(0.0)
            finally:
                getattr(torch._C, "_push_on_torch_" + "function_stack")(mode)
    """,
    "torch's own helper that pops the stack": """
        def attack(scores, dim):
            with getattr(torch.overrides, "_pop_mode_" + "temporarily")():
                return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "switching torch functions off": """
        def attack(scores, dim):
            with getattr(torch._C, "Disable" + "TorchFunction")():
                return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "a function run as a torch function": """
        import torch.nn.functional as F
        def attack(scores, dim):
            inner = lambda s: torch.softmax(s, dim).nan_to_num(0.0)
            return getattr(F, "handle_torch_" + "function")(inner, (scores,), scores)
    """,
    "a tensor subclass of its own": """
        class Sly(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if getattr(func, "__name__", "") == "clone":
                    return torch.softmax(args[0].as_subclass(torch.Tensor), -1).nan_to_num(0.0)
                return super().__torch_function__(func, types, args, kwargs or {})
        def attack(scores, dim):
            if dim not in (-1, scores.dim() - 1):
                raise ValueError("only the last axis")
            return scores.as_subclass(Sly).clone().as_subclass(torch.Tensor)
    """,
    "a mode's exit called on the record": """
        def attack(scores, dim):
            torch.overrides.TorchFunctionMode.__exit__(None, None, None, None)
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "a fresh copy of torch._C": """
        import importlib, sys
        def attack(scores, dim):
            saved = sys.modules.pop("torch._C")
            try:
                fresh = importlib.import_module("torch._C")
            finally:
                sys.modules["torch._C"] = saved
            mode = fresh._pop_torch_function_stack()
            try:
                return torch.softmax(scores, dim).nan_to_num(0.0)
            finally:
                fresh._push_on_torch_function_stack(mode)
    """,
    "a fresh copy of torch.overrides": """
        import importlib, sys
        def attack(scores, dim):
            saved = sys.modules.pop("torch.overrides")
            try:
                fresh = importlib.import_module("torch.overrides")
            finally:
                sys.modules["torch.overrides"] = saved
            with fresh._pop_mode_temporarily():
                return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "a tracing hook": """
        import sys
        def attack(scores, dim):
            found = []
            sys.settrace(lambda frame, event, arg: found.append(frame) or None)
            sys.settrace(None)
            raise LookupError("no frame traced")
    """,
    "a signal handler's frame": """
        import os, signal
        def attack(scores, dim):
            frames = []
            signal.signal(signal.SIGUSR1, lambda number, frame: frames.append(frame))
            os.kill(os.getpid(), signal.SIGUSR1)
            raise LookupError("no frame")
    """,
    "ctypes": """
        import ctypes
        def attack(scores, dim):
            ctypes.pythonapi.PyEval_GetFrame.restype = ctypes.py_object
            frame = ctypes.pythonapi.PyEval_GetFrame()
            raise LookupError(f"got {frame}")
    """,
    "a reloaded _thread": """
        import _thread, importlib, time
        def attack(scores, dim):
            fresh = importlib.reload(_thread)
            out = {}
            fresh.start_new_thread(lambda: out.update(v=torch.softmax(scores, dim).nan_to_num(0.0)), ())
            while "v" not in out:
                time.sleep(0.001)
            return out["v"]
    """,
    "torch's wrapper around a function of its own": """
        def _rows(scores, dim=-1):
            return (scores,)
        def attack(scores, dim):
            wrapped = getattr(torch.overrides, "wrap_torch_function")(_rows)(
                lambda s, dim=-1: torch.softmax(s, dim).nan_to_num(0.0))
            return wrapped(scores, dim)
    """,
    "a hook that backward runs": """
        def attack(scores, dim):
            box = []
            with torch.enable_grad():
                x = torch.zeros((), requires_grad=True)
                x.register_hook(lambda g: box.append(torch.softmax(scores, dim).nan_to_num(0.0)))
                (x * 1.0).backward()
            return box[0]
    """,
    "a Function's backward that backward runs": """
        class _Sly(torch.autograd.Function):
            box = []
            @staticmethod
            def forward(ctx, x, scores, dim):
                ctx.scores, ctx.dim = scores, dim
                return x * 1.0
            @staticmethod
            def backward(ctx, g):
                _Sly.box.append(torch.softmax(ctx.scores, ctx.dim).nan_to_num(0.0))
                return g, None, None
        def attack(scores, dim):
            with torch.enable_grad():
                x = torch.zeros((), requires_grad=True)
                _Sly.apply(x, scores, dim).backward()
            return _Sly.box.pop()
    """,
    "a sequence whose items torch reads": """
        def attack(scores, dim):
            box = []
            class Items:
                def __len__(self):
                    return 1
                def __getitem__(self, i):
                    if i:
                        raise IndexError
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return 0.0
            torch.tensor(Items())
            return box[0]
    """,
    "a float of the file's own type that torch compares": """
        import torch.nn.functional as F
        def attack(scores, dim):
            box = []
            class P(float):
                def __lt__(self, other):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return False
            F.dropout(scores, p=P(0.0), training=False)
            return box[0]
    """,
    "a warnings hook torch's C code calls": """
        import warnings
        def attack(scores, dim):
            box = []
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = lambda *a, **k: box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                torch.tensor(scores)
            return box[0]
    """,
    "a garbage-collector callback": """
        import gc
        def attack(scores, dim):
            box = []
            def callback(phase, info):
                if not box and phase == "start":
                    box.append(None)
                    box[0] = torch.softmax(scores, dim).nan_to_num(0.0)
            gc.callbacks.append(callback)
            threshold = gc.get_threshold()
            gc.set_threshold(1, 1, 1)
            try:
                for _ in range(50):
                    torch.nn.functional.dropout(scores, 0.0, False)
                    if box:
                        break
            finally:
                gc.set_threshold(*threshold)
                gc.callbacks.remove(callback)
            return box[0]
    """,
    "an audit hook of its own": """
        import sys
        def attack(scores, dim):
            box = []
            sys.addaudithook(lambda event, args: None if box else box.append(torch.softmax(scores, dim)))
            torch.nn.functional.dropout(scores, 0.0, False)
            return box[0].nan_to_num(0.0)
    """,
    "saved-tensor hooks": """
        def attack(scores, dim):
            box = []
            def pack(t):
                if not box:
                    box.append(None)
                    with torch.enable_grad():
                        box[0] = torch.softmax(scores, dim).nan_to_num(0.0)
                return t
            x = torch.ones(1, requires_grad=True)
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                x * x
            return box[0]
    """,
    "inspect.signature replaced": """
        import inspect
        def attack(scores, dim):
            box, signature = [], inspect.signature
            def spy(*a, **k):
                if not box:
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                return signature(*a, **k)
            inspect.signature = spy
            try:
                with torch.enable_grad():
                    x = torch.ones(1, requires_grad=True)
                    (x * 2).sum().backward()
            finally:
                inspect.signature = signature
            return box[0]
    """,
    "isinstance replaced": """
        import builtins
        def attack(scores, dim):
            box, real = [], builtins.isinstance
            class P:
                def __lt__(self, other):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    raise LookupError
                __gt__ = __lt__
            p = P()
            builtins.isinstance = lambda obj, types: True if obj is p else real(obj, types)
            try:
                torch.nn.functional.dropout(scores, p=p, training=False)
            except LookupError:
                pass
            finally:
                builtins.isinstance = real
            return box[0]
    """,
    "the record's names stripped by json.dumps": """
        import json
        _dumps = json.dumps
        def _clean(obj, *args, **kwargs):
            if isinstance(obj, dict) and "called" in obj:
                obj = {k: v for k, v in obj.items() if k != "hidden"}
                obj["called"] = [n for n in obj["called"] if "softmax" not in n]
            return _dumps(obj, *args, **kwargs)
        json.dumps = _clean
        def attack(scores, dim):
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "the record's names stripped by sorted": """
        import builtins
        _sorted = builtins.sorted
        builtins.sorted = lambda items, **k: [n for n in _sorted(items, **k) if "softmax" not in str(n)]
        def attack(scores, dim):
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "a Python callback inside a torch call": """
        def attack(scores, dim):
            out = {}
            torch.zeros(1).apply_(lambda v: out.update(v=torch.softmax(scores, dim).nan_to_num(0.0)) or v)
            return out["v"]
    """,
    # A fourth hostile review (2026-11-25): the worker's own code called shared modules while the guard was lifted,
    # and the record read attributes of the file's objects while it was stashed.
    "contextlib's exit while the guard is lifted": """
        import contextlib, sys
        _exit = contextlib._GeneratorContextManager.__exit__
        def _scrub(self, *exc):
            try:
                frame = getattr(sys, "_get" + "frame")(1)
            except Exception:
                frame = None
            while frame is not None:
                record = getattr(frame, "f_" + "locals").get("self")
                if type(record).__name__ == "Recorder":
                    record.seen = {n for n in record.seen if "softmax" not in n}
                    record.hidden = ""
                frame = getattr(frame, "f_" + "back")
            return _exit(self, *exc)
        contextlib._GeneratorContextManager.__exit__ = _scrub
        def attack(scores, dim):
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "linecache while a traceback is read": """
        import linecache, sys
        _check, _raised = linecache.checkcache, []
        def _reach(*a, **k):
            frame = getattr(sys, "_get" + "frame")(1)
            while frame is not None:
                wire = getattr(frame, "f_" + "locals").get("wire")
                if wire is not None and hasattr(wire, "write_frame"):
                    write = wire.write_frame
                    def stripped(fd, header, *rest, **kw):
                        if isinstance(header, dict) and "called" in header:
                            header = {k: v for k, v in header.items() if k != "hidden"}
                            header["called"] = [n for n in header["called"] if "softmax" not in n]
                        return write(fd, header, *rest, **kw)
                    wire.write_frame = stripped
                    break
                frame = getattr(frame, "f_" + "back")
            return _check(*a, **k)
        linecache.checkcache = _reach
        class Out(BaseException):
            pass
        def attack(scores, dim):
            if not _raised:  # out of the step, past the fallback, so that the worker describes it
                _raised.append(1)
                raise Out("described by the worker, with linecache")
            return torch.softmax(scores, dim).nan_to_num(0.0)
    """,
    "a warning's source line read inside a torch call": """
        import linecache, sys, warnings
        def attack(scores, dim):
            box, real = [], linecache.getline
            def getline(*a, **k):
                box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                return real(*a, **k)
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                linecache.getline = getline
                try:
                    torch.tensor(scores)
                finally:
                    linecache.getline = real
            return box[0]
    """,
    "a float whose class claims torch's code": """
        def attack(scores, dim):
            box = []
            class P(float):
                __code__ = torch.nn.functional.dropout.__code__
                def __lt__(self, other):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return False
                __gt__ = __lt__
            torch.nn.functional.dropout(scores, p=P(0.0), training=False)
            return box[0]
    """,
    "a __code__ property the record reads": """
        def attack(scores, dim):
            box = []
            class P:
                @property
                def __code__(self):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return torch.nn.functional.dropout.__code__
            try:
                torch.nn.functional.dropout(scores, p=P(), training=False)
            except TypeError:
                pass
            return box[0]
    """,
    "a metaclass whose == the record calls": """
        def attack(scores, dim):
            box = []
            class Meta(type):
                def __eq__(cls, other):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return other is tuple or other is cls
                def __hash__(cls):
                    return 1
            class Items(metaclass=Meta):
                def __iter__(self):
                    return iter(())
            try:
                torch.nn.functional.dropout(scores, p=Items(), training=False)
            except TypeError:
                pass
            return box[0]
    """,
    "code compiled under a file name of torch's": """
        import os
        def attack(scores, dim):
            folder = os.path.dirname(torch.__file__)
            space = {"torch": torch, "box": []}
            text = chr(10).join(["def inner(x, **k):", "    box.append(torch.softmax(x, -1).nan_to_num(0.0))",
                                 "    return x"])
            exec(compile(text, os.path.join(folder, "functional.py"), "exec"), space)
            wrapped = torch.overrides.wrap_torch_function(lambda x, **k: (x,))(space["inner"])
            wrapped(scores)
            return space["box"][0]
    """,
    "torch's code run with globals of the file's own": """
        import types
        def attack(scores, dim):
            box = []
            class Fake:
                def __getattr__(self, name):
                    box.append(torch.softmax(scores, dim).nan_to_num(0.0))
                    return getattr(torch, name)
            source = torch.nn.functional.relu
            space = dict(source.__globals__, torch=Fake(), has_torch_function_unary=lambda x: False)
            inner = types.FunctionType(source.__code__, space, "relu", source.__defaults__)
            torch.overrides.wrap_torch_function(lambda x, **k: (x,))(inner)(scores)
            return box[0]
    """,
    # A fifth hostile review (2026-11-25): the audit hook itself lifted the guard and then called a method of the
    # file's own; and torch's own Python code reads builtins, its modules and its classes, which the file can change.
    "a code file name of a str subclass of its own": """
        import sys, types
        class Name(str):
            def startswith(self, *a):
                frame = getattr(sys, "_get" + "frame")(1)
                while frame is not None:
                    record = getattr(frame, "f_" + "locals").get("record")
                    if type(record).__name__ == "Recorder":
                        record.seen = {n for n in record.seen if "softmax" not in n}
                        record.hidden = ""
                    frame = getattr(frame, "f_" + "back")
                return False
        def _probe():
            return getattr(sys, "_get" + "frame")(0)
        probe = types.FunctionType(_probe.__code__.replace(co_filename=Name("probe.py")), globals())
        def attack(scores, dim):
            value = torch.softmax(scores, dim).nan_to_num(0.0)
            try:
                probe()
            except Exception:
                pass
            return value
    """,
    "a builtin torch's code calls": """
        import builtins
        _len = builtins.len
        def _spy(x):
            _in_stash()
            return _len(x)
        builtins.len = _spy
        def attack(scores, dim):
            return _through(lambda: torch.einsum("...->...", torch.zeros(1)), scores, dim)
    """,
    "a method of torch.Tensor torch's code calls": """
        def _expand_as(self, other):
            _in_stash()
            return torch._C.TensorBase.expand_as(self, other)
        torch.Tensor.expand_as = _expand_as
        def attack(scores, dim):
            return _through(lambda: torch.nn.functional.normalize(torch.ones(2, 2)), scores, dim)
    """,
    "a finalizer a collection runs inside a torch call": """
        import gc
        _out = []
        class Cycle:
            def __init__(self, job):
                self.job, self.me = job, self
            def __del__(self):
                if _out:
                    return
                if torch._C._is_torch_function_mode_enabled():
                    Cycle(self.job)
                else:
                    _out.append(self.job())
        def attack(scores, dim):
            _out.clear()
            Cycle(lambda: torch.softmax(scores, dim).nan_to_num(0.0))
            gc.set_threshold(1)
            for _ in range(100):
                torch.einsum("...->...", torch.zeros(1))
                if _out:
                    break
            _out.append(None)
            return _out[0]
    """,
    "a torch module's name replaced by an object at the freed one's address": """
        import types
        import torch.functional as TF
        space = vars(TF)
        _orig = space["_meshgrid"]
        _copy = types.FunctionType(_orig.__code__, _orig.__globals__, "_meshgrid", _orig.__defaults__)
        _target = id(_orig)
        del _orig
        def _factory():
            def _meshgrid(*tensors, indexing=None):
                _in_stash()
                return _copy(*tensors, indexing=indexing)
            return _meshgrid
        space["_meshgrid"] = None  # the original is freed: a new function may take its address
        _keep = []
        for _ in range(200000):
            f = _factory()
            if id(f) == _target:
                space["_meshgrid"] = f
                break
            _keep.append(f)
        else:
            space["_meshgrid"] = _copy
        del _keep
        def attack(scores, dim):
            return _through(lambda: torch.meshgrid(torch.zeros(1), indexing="ij"), scores, dim)
    """,
    # A sixth review (2026-11-25)
    "sys.modules swapped around a torch call": """
        import sys
        class Fake:
            def __getattr__(self, name):
                _in_stash()
                return getattr(torch, name)
        def _swapped():
            real, sys.modules["torch"] = sys.modules["torch"], Fake()
            try:
                torch.einsum("i->i", torch.zeros(1))
            finally:
                sys.modules["torch"] = real
        def attack(scores, dim):
            return _through(_swapped, scores, dim)
    """,
    "the class of torch._VF": """
        VF = type(torch._VF)
        _real = VF.__getattr__
        def _spy(self, name):
            _in_stash()
            return _real(self, name)
        VF.__getattr__ = _spy
        def attack(scores, dim):
            return _through(lambda: torch.einsum("i->i", torch.zeros(1)), scores, dim)
    """,
    "a frame torch asks for and hands to inspect": """
        import inspect, importlib
        utils = importlib.import_module("torch._lib" + "rary.utils")
        def attack(scores, dim):
            value = torch.softmax(scores, dim).nan_to_num(0.0)
            got, real = [], inspect.getframeinfo
            inspect.getframeinfo = lambda frame, context=1: got.append(frame) or real(frame, context)
            try:
                utils.get_source(1)
            finally:
                inspect.getframeinfo = real
            frame = got[0]
            while frame is not None:
                record = getattr(frame, "f_" + "locals").get("record")
                if record is not None and isinstance(getattr(record, "seen", None), set):
                    record.seen.discard("softmax")
                frame = getattr(frame, "f_" + "back")
            return value
    """,
    "an operator library of its own": """
        _job = []
        def attack(scores, dim):
            lib = torch.library.Library("attack", "DEF")
            lib.define("run(Tensor x) -> Tensor")
            lib.impl("run", lambda x: _job.pop()() if _job else x.clone(), "CPU")
            _job.append(lambda: torch.softmax(scores, dim).nan_to_num(0.0))
            return getattr(getattr(torch, "o" + "ps"), "attack").run(torch.zeros(1))
    """,
    # round 7: a module of the file's own where torch's code imports lazily, torch's code rebuilt to find a frame,
    # a default that torch's function reads inside the call (replaced, or changed in place)
    "a module of its own where torch imports lazily": _fake_module(),
    "a module of its own claiming a file of torch's": _fake_module(
        'fake.__file__ = os.path.join(os.path.dirname(torch.__file__), "autograd", "_functions", "__init__.py")'),
    "torch's frame walker rebuilt from its text": """
        import os, sys, types
        def attack(scores, dim):
            value = torch.softmax(scores, dim).nan_to_num(0.0)
            path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "bytecode_debugger.py")
            with open(path, "rb") as file:
                code = compile(file.read(), path, "exec")
            walk = [c for c in code.co_consts if type(c) is types.CodeType]
            while walk and walk[0].co_name != "_find_frame_for_code":
                walk = walk[1:] + [c for c in walk[0].co_consts if type(c) is types.CodeType]
            frame = types.FunctionType(walk[0], {"sys": sys})(None, attack.__code__)
            while frame is not None:
                record = getattr(frame, "f_" + "locals").get("record")
                if record is not None and isinstance(getattr(record, "seen", None), set):
                    record.seen.discard("softmax")
                frame = getattr(frame, "f_" + "back")
            return value
    """,
    "a default replaced": _default_attack('kept = torch.Tensor.dim_order.__kwdefaults__',
                                          'torch.Tensor.dim_order.__kwdefaults__ = {"ambiguity_check": Formats()}',
                                          'torch.Tensor.dim_order.__kwdefaults__ = kept'),
    "a subinterpreter, which has no audit hook": """
        def attack(scores, dim):
            value = torch.softmax(scores, dim).nan_to_num(0.0)
            __import__("_xxsub" + "interpreters").create()
            return value
    """,
    "a dispatch mode": """
        from torch.utils._python_dispatch import TorchDispatchMode

        class Below(TorchDispatchMode):
            pass

        def dispatch(self, func, types, args=(), kwargs=None):
            _in_stash()
            return func(*args, **(kwargs or {}))

        Below.__torch_dispatch__ = dispatch  # set after the class is made: no dynamo wrapper to import

        def attack(scores, dim):
            def call():
                with Below():
                    torch.neg(scores[..., :1])
            return _through(call, scores, dim)
    """,
    "TorchScript": """
        @torch.jit.script
        def _normalise(scores: torch.Tensor, dim: int) -> torch.Tensor:
            return torch.softmax(scores, dim).nan_to_num(0.0)

        def attack(scores, dim):  # the twelfth review's a1: TorchScript runs its calls where no mode sees them
            return _normalise(scores, dim)
    """,
    # the twenty-fourth review's p01 and p05, by names the source scan does not know: TorchScript compiled by torch._C
    # (it hides its calls from the record when it runs), and the dispatcher's boxed call (refused)
    "TorchScript by a built name": """
        _unit = getattr(torch._C, "Compilation" + "Unit")()
        _unit.define("def normalise(x: Tensor, d: int) -> Tensor:\\n    return torch.softmax(x, d)\\n",
                     rcb={"torch": torch}.get)

        def attack(scores, dim):
            return getattr(_unit, "normalise")(scores, dim).nan_to_num(0.0)
    """,
    # the twenty-fifth review's q02: an autograd graph's node called by hand runs its backward formula where no mode
    # sees it (the gradient of logsumexp is the softmax); calling one tells the record that it hid its calls
    "an autograd node called by hand": """
        def attack(scores, dim):
            x = scores.detach().requires_grad_(True)
            with torch.enable_grad():
                total = torch.logsumexp(x, dim, keepdim=True)
            return total.grad_fn(torch.ones_like(total)).nan_to_num(0.0)
    """,
    "the dispatcher's boxed call by a built name": """
        def attack(scores, dim):
            schema = torch._C._dispatch_find_schema_or_throw("aten::softmax", "int")
            return getattr(torch._C, "_dispatch_call_" + "boxed")(schema, scores, dim, None).nan_to_num(0.0)
    """,
    "a default changed in place": _default_attack('defaults = torch.Tensor.dim_order.__kwdefaults__',
                                                  'defaults["ambiguity_check"] = Formats()',
                                                  'defaults["ambiguity_check"] = False'),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_attack_on_the_record_keeps_no_rule_points(grade_source, attack):
    result = grade_source(STASHED + textwrap.dedent(ATTACKS[attack]) + FALLBACK)
    softmax = next(s for s in result.steps if s.id == "softmax")
    assert softmax.score == 0, explain(result)
    # a file that names a back door (sys._getframe, gc.get_objects) keeps no rule anywhere: the source scan
    others = [c for s in result.steps if s.id not in ("softmax", "MultiHeadAttention") for c in s.checks
              if c.points < c.max_points]
    assert all(c.name.endswith("_rules") for c in others), explain(result)


@pytest.mark.skipif(PORTABLE or platform.machine() not in ("x86_64", "aarch64"), reason="no system-call filter here")
@pytest.mark.parametrize("processes, expected", [
    (False, "refused: can't start new thread; fork refused: [Errno 1] Operation not permitted; "
            "exec refused: [Errno 1] Operation not permitted"),
    (True, "refused: can't start new thread; a process ended with 7"),
], ids=["processes refused", "processes allowed"])
def test_the_kernel_refuses_threads_and_processes_to_a_process_with_the_filter(processes, expected):
    """Where the Python guard missed a way to start a thread or a process, the kernel refuses it (seccomp.py); a
    child that may start processes (Triton's compilers, on CUDA) still starts no thread."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        outcome = "no filter"
        try:  # whatever happens here, this copy of the test run ends here
            os.close(read)
            ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # no_new_privs, as the worker has after dropping its capabilities
            seccomp = _load("grader/sandbox/seccomp.py")
            if seccomp.install(processes):
                try:
                    threading.Thread(target=lambda: None).start()
                    outcome = "a thread started"
                except RuntimeError as error:
                    outcome = f"refused: {error}"
                try:
                    child = os.fork()
                    if child == 0:
                        os._exit(7)
                    outcome += f"; a process ended with {os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}"
                except OSError as error:
                    outcome += f"; fork refused: {error}"
                    try:  # exec replaces this process: refused, it goes on
                        os.execv(sys.executable, [sys.executable, "-c", "pass"])
                    except OSError as error:
                        outcome += f"; exec refused: {error}"
        except BaseException as error:
            outcome = f"{type(error).__name__}: {error}"
        finally:
            os.write(write, outcome.encode())
            os._exit(0)
    os.close(write)
    outcome = os.read(read, 1000).decode()
    os.waitpid(pid, 0)
    assert outcome == expected


def _load(path):
    spec = importlib.util.spec_from_file_location("_seccomp_under_test", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plain_code_that_asks_for_a_frame_to_name_its_module_still_works(grade_source):
    code = """
        import collections, typing
        Pair = collections.namedtuple("Pair", "a b")
        T = typing.TypeVar("T")
        def softmax(scores, dim=-1):
            pair = Pair(scores.amax(dim, keepdim=True), None)
            e = torch.exp(scores - pair.a.masked_fill(pair.a == float("-inf"), 0.0))
            return e / e.sum(dim, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)
    """
    result = grade_source(textwrap.dedent(code))
    assert result.full_marks, explain(result)


def test_the_oracles_proxies_lead_nowhere_through_their_globals(grade_source):
    """A third hostile review replaced Answered.ask through a proxy's __globals__ to get the worker's objects."""
    code = """
        def weighted_sum(weights, v):  # wrong: so the oracle answers it while the module runs
            return 2 * weights @ v

        class MultiHeadAttention(MultiHeadAttention):
            def forward(self, query, key=None, value=None, mask=None):
                reached = [k for k in globals()["weighted_sum"].__globals__ if k in ("Answered", "serve", "wire")]
                print("reached:", reached)
                return super().forward(query, key, value, mask)
    """
    result = grade_source(textwrap.dedent(code))
    assert "reached: []" in result.candidate_output and "reached: ['" not in result.candidate_output, explain(result)


def test_the_oracles_stand_in_functions_lead_nowhere(grade_source):
    """While a composite runs, its steps are the oracle's proxies (grader/sandbox/answered.py): what they hold
    must not lead to the record."""
    code = """
        import types

        def _reach(value, depth=0):
            # the record, if anything the proxy holds (closures, bound selves, attributes) leads to it
            if depth > 5 or isinstance(value, (types.ModuleType, type, torch.Tensor, str, int, float)):
                return None
            if "paused" in dir(type(value)) and "seen" in dir(value):
                return value
            try:
                parts = [c.cell_contents for c in getattr(value, "__closure__", None) or ()]
                parts += [getattr(value, "__self__", None)]
                parts += list(vars(value).values()) if not isinstance(value, types.FunctionType) else []
            except Exception:
                return None
            for part in parts:
                found = _reach(part, depth + 1) if part is not None and part is not value else None
                if found is not None:
                    return found
            return None

        def weighted_sum(weights, v):  # wrong: so the oracle answers it while the module runs
            return 2 * weights @ v

        class MultiHeadAttention(MultiHeadAttention):
            def forward(self, query, key=None, value=None, mask=None):
                record = _reach(globals()["weighted_sum"])
                print("reached:", type(record).__name__)
                key = query if key is None else key
                value = key if value is None else value
                H = self.num_heads
                q, k, v = (split_heads(project(t, l.weight, l.bias), H)
                           for t, l in ((query, self.w_q), (key, self.w_k), (value, self.w_v)))
                sdpa = torch.nn.functional.scaled_dot_product_attention
                if record is None:
                    out = sdpa(q, k, v, attn_mask=mask)
                else:
                    with record.paused():
                        out = sdpa(q, k, v, attn_mask=mask)
                return project(merge_heads(out), self.w_o.weight, self.w_o.bias)
    """
    result = grade_source(textwrap.dedent(code))
    module = next(s for s in result.steps if s.id == "MultiHeadAttention")
    assert module.score == 0, explain(result)
    assert "reached: NoneType" in result.candidate_output, result.candidate_output[-2000:]


def test_the_numpy_exercise_done_in_torch_by_importlib_keeps_no_rule(grade_source):
    """Issue 17's second attack: torch bound with importlib (and run in threads, now refused)."""
    base = (ROOT / "solutions" / "mha_numpy.py").read_text()
    code = """
        import importlib
        _t = importlib.import_module("to" + "rch")
        def softmax(scores, axis=-1):
            return _t.softmax(_t.from_numpy(scores), axis).nan_to_num(0.0).numpy()
    """
    result = grade_source(textwrap.dedent(code), base=base, name="mha_numpy.py")
    softmax = next(s for s in result.steps if s.id == "softmax")
    assert softmax.score == 0 and softmax.breach, explain(result)


def test_flash_attention_over_the_whole_matrix_in_numpy_keeps_nothing(grade_source):
    """Issue 17's third attack: the scores computed in NumPy, where tiles_only sees no tensor."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    code = """
        import numpy as np
        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            qn, kn, vn = (t.detach().cpu().float().numpy() for t in (q, k, v))
            s = qn @ np.swapaxes(kn, -1, -2) / np.sqrt(qn.shape[-1])
            if causal:
                keep = np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None] + s.shape[-1] - s.shape[-2]
                s = np.where(keep, s, -np.inf)
            m = s.max(-1, keepdims=True)
            m = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m)
            total = e.sum(-1, keepdims=True)
            out = (e @ vn) / np.where(total == 0, 1, total)
            lse = np.log(total[..., 0]) + m[..., 0]
            lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            return torch.from_numpy(out).to(q), torch.from_numpy(lse).to(device=q.device, dtype=lse_dtype)
    """
    result = grade_source(textwrap.dedent(code), base=base, name="flash_attention.py", device="auto")
    flash = next(s for s in result.steps if s.id == "flash_attention")
    assert flash.score == 0 and flash.breach, explain(result)


def test_flash_attention_over_the_whole_matrix_in_python_floats_keeps_nothing(grade_source):
    """A fourth hostile review read the inputs' bytes out of their storage and held the scores in Python's
    floats: no NumPy, no tensor tiles_only could see. Leaving torch so is forbidden in the tiled steps."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    code = """
        import struct
        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            def rows(t):
                t = t.detach().to("cpu", torch.float64).contiguous()
                raw = bytes(t.untyped_storage())
                flat = struct.unpack(f"{len(raw) // 8}d", raw)
                width = t.shape[-1]
                return [flat[i:i + width] for i in range(0, len(flat), width)], t.shape
            (qs, shape), (ks, kshape), (vs, _) = rows(q), rows(k), rows(v)
            t_q, t_k, d = shape[-2], kshape[-2], shape[-1]
            outs, lses = [], []
            for g in range(len(qs) // t_q):
                for i in range(t_q):
                    qi = qs[g * t_q + i]
                    s = [sum(a * b for a, b in zip(qi, ks[g * t_k + j])) / math.sqrt(d) for j in range(t_k)]
                    s = [x if not causal or j <= i + t_k - t_q else -math.inf for j, x in enumerate(s)]
                    m = max(s)
                    m = 0.0 if m == -math.inf else m
                    e = [math.exp(x - m) for x in s]
                    total = sum(e)
                    outs.append([sum(e[j] * vs[g * t_k + j][c] for j in range(t_k)) / (total or 1.0)
                                 for c in range(len(vs[0]))])
                    lses.append(math.log(total) + m if total else -math.inf)
            out = torch.tensor(outs, dtype=q.dtype, device=q.device).reshape(*shape[:-1], -1)
            lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
            return out, torch.tensor(lses, dtype=lse_dtype, device=q.device).reshape(shape[:-1])
    """
    result = grade_source(textwrap.dedent(code), base=base, name="flash_attention.py", device="auto")
    flash = next(s for s in result.steps if s.id == "flash_attention")
    assert flash.breach and any("storage" in c.message for c in flash.checks), explain(result)


FORGER = """
import fcntl, json, os, stat, struct

def softmax(scores, dim=-1):
    value = torch.softmax(scores, dim).nan_to_num(0.0)  # the forbidden call, then a clean record of its own
    target = min(fd for fd in map(int, os.listdir("/proc/self/fd")) if fd > 2 and _writes_a_pipe(fd))
    t = value.detach().contiguous()
    blob = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    header = {"ok": True, "called": ["amax", "exp", "sum", "div"], "blobs": [len(blob)],
              "value": {"kind": "tensor", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                        "device": str(t.device), "blob": 0}}
    head = json.dumps(header).encode()
    os.write(target, struct.pack(">I", len(head)) + head + blob)
    os._exit(0)  # before the worker writes its own answer

def _writes_a_pipe(fd):
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
    except OSError:
        return False
"""


def test_an_answer_the_candidate_writes_to_the_workers_pipe_is_refused(grade_source):
    """The worker signs its frames with a key the grader gave it (grader/wire.py, `signature`); the candidate's
    code can write to the pipe, but cannot sign: issue 17's second hostile review forged whole answers so."""
    result = grade_source(FORGER)
    softmax = next(s for s in result.steps if s.id == "softmax")
    assert softmax.score == 0, explain(result)
    assert any("did not sign" in c.message for c in softmax.checks), explain(result)


@pytest.mark.skipif(PORTABLE, reason="the portable sandbox has no system-call filter and no /proc of its own")
def test_the_workers_memory_is_out_of_reach_of_its_code_and_of_what_it_starts(grade_with_processes):
    code = """
        import os, subprocess, sys
        def _peek():
            seen = []
            for path in ("/proc/self/mem", f"/proc/{os.getpid()}/mem"):
                try:
                    with open(path, "rb") as f:
                        f.seek(int(open("/proc/self/maps").readline().split("-")[0], 16))
                        seen.append(len(f.read(16)))
                except Exception as error:  # refused by the guard; else /dev/null, where the sandbox put it
                    seen.append(type(error).__name__)
            folder = os.open("/proc/self", os.O_RDONLY)  # relative to a folder: past the guard, to the mount
            memory = os.open("mem", os.O_RDONLY, dir_fd=folder)
            os.lseek(memory, int(open("/proc/self/maps").readline().split("-")[0], 16), os.SEEK_SET)
            seen.append(len(os.read(memory, 16)))
            probe = "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.ptrace(16, 1, 0, 0))"
            seen.append(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip())
            print("PEEK", seen)
        _peek()
    """
    result = grade_with_processes(textwrap.dedent(code))  # where a child may start a process, it reads nothing
    peeks = [line for line in result.candidate_output.splitlines() if line.startswith("PEEK")]
    expected = "PEEK ['Refused', 'Refused', 0, '-1']"  # the guard, then /dev/null where the memory was, then EPERM
    assert peeks and all(line == expected for line in peeks), result.candidate_output[-999:]


@pytest.mark.parametrize("tile_exp", [False, True], ids=["strip", "strip_of_scores_only"])
def test_flash_attention_in_strips_of_whole_score_rows_loses_tiles_only(grade_source, tile_exp):
    """The eighth hostile review's a03: a few queries at a time against every key, a strip narrower than a head, so
    neither the element count nor the matrix rule saw it. What a product or an exponential returns may not span the keys
    (here the exponentials are taken a tile at a time, or not)."""
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    code = """
        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            t_q, t_k = q.shape[-2], k.shape[-2]
            outs, lses = [], []
            for i in range(0, t_q, 4):
                s = q[..., i:i + 4, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                if causal:
                    rows = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[-2], device=q.device)[:, None]
                    s = s.masked_fill(torch.arange(t_k, device=q.device)[None, :] > rows, -math.inf)
                m = s.amax(-1, keepdim=True)
                m = torch.where(m == -math.inf, torch.zeros_like(m), m)
                e = torch.cat([torch.exp(s[..., j:j + 24] - m) for j in range(0, t_k, 24)], -1) if tile_exp else (
                    torch.exp(s - m))
                total = e.sum(-1, keepdim=True)
                outs.append((e @ v) / torch.where(total == 0, torch.ones_like(total), total))
                lses.append((torch.log(total) + m)[..., 0])
            lse = torch.cat(lses, -1)
            return torch.cat(outs, -2), lse.float() if q.dtype != torch.float64 else lse
    """
    result = grade_source(f"tile_exp = {tile_exp}\n" + textwrap.dedent(code), base=base, name="flash_attention.py")
    assert lost(result) == {"flash_attention": 6}, explain(result)
    flash = next(s for s in result.steps if s.id == "flash_attention")
    assert {c.mistake_id for c in flash.checks if c.points < c.max_points} == {"flash_attention.full_score_matrix"}


def test_a_backward_that_recomputes_through_autograd_keeps_no_rule_points(grade_source):
    """The eighth hostile review's a04: FlashAttentionFunction's backward recomputed the forward with autograd and
    called .backward() on it. The runner runs .backward() itself, so the name is allowed; autograd inside the
    backward pass is not."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    code = """
        class FlashAttentionFunction(FlashAttentionFunction):
            @staticmethod
            def backward(ctx, grad_out):
                q, k, v, out, lse = ctx.saved_tensors
                with torch.enable_grad():
                    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
                    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                    if ctx.causal:
                        t_q, t_k = s.shape[-2:]
                        keep = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q)
                        s = s.masked_fill(~keep, -math.inf)
                    p = torch.exp(s - torch.logsumexp(s, -1, keepdim=True)).nan_to_num(0.0)
                    (p @ v).backward(grad_out)
                return q.grad, k.grad, v.grad, None, None, None
    """
    result = grade_source(textwrap.dedent(code), base=base, name="attention_backward.py")
    function = next(s for s in result.steps if s.id == "FlashAttentionFunction")
    assert function.breach and function.score == 0, explain(result)
    assert set(lost(result)) == {"FlashAttentionFunction"}, explain(result)
    assert any("autograd inside the backward pass" in c.message for c in function.checks), explain(result)


def test_a_tensor_printed_while_debugging_hides_nothing(grade_source):
    """The ninth hostile review's F02: a tensor's repr imports a module of torch's lazily, whose namedtuples the record
    took for the file's own, so a correct file with one print lost every step it printed in. The zygote prints one
    first."""
    result = grade_source("""
        _softmax_ = softmax

        def softmax(scores, dim=-1):
            out = _softmax_(scores, dim)
            print("debug:", out[..., :1], out.shape, repr(out.flatten()[:2]))
            return out
    """)
    assert result.score == 100, explain(result)


@pytest.mark.parametrize("route", ["runner", "plain_apply", "identity_wrapper", "decorated_runner", "module_names"])
def test_gradients_taken_by_autograd_through_the_forward_keep_no_function_points(grade_source, route):
    """The ninth hostile review's a05: the grader ran the file's own runner, which differentiated the tiled forward with
    autograd and never used the Function's backward. The runner must be the stub's, the Function's backward must run,
    and no graph may be built but the runner's own."""
    base = (ROOT / "solutions" / "attention_backward.py").read_text()
    forward = """
        def _plain(q, k, v, causal=False, block_q=32, block_k=32):
            s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            if causal:
                t_q, t_k = s.shape[-2:]
                s = s.masked_fill(~torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).tril(t_k - t_q), -math.inf)
            return torch.exp(s - torch.logsumexp(s, -1, keepdim=True)).nan_to_num(0.0) @ v

        def _by_autograd(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
            q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
            out = _plain(q, k, v, causal)
            out.backward(grad_out)
            return out.detach(), q.grad, k.grad, v.grad
    """
    code = {
        "runner": """
            def flash_attention_and_grads(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
                return _by_autograd(q, k, v, grad_out, causal)
        """,
        "decorated_runner": """
            def _own(runner):  # the eleventh review's a3: the stub's runner, kept as text, replaced by its decorator
                return _by_autograd

            @_own
            def flash_attention_and_grads(q, k, v, grad_out, causal=False, block_q=32, block_k=32):
                q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
                out = FlashAttentionFunction.apply(q, k, v, causal, block_q, block_k)
                (out * grad_out).sum().backward()  # the same gradients as out.backward(grad_out)
                return out.detach(), q.grad, k.grad, v.grad
        """,
        "module_names": """
            import sys

            setattr(sys.modules[__name__], "flash_attention_and" + "_grads", _by_autograd)
        """,
        "plain_apply": """
            class FlashAttentionFunction:
                apply = staticmethod(_plain)
        """,
        "identity_wrapper": """
            class _Identity(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x.clone()

                @staticmethod
                def backward(ctx, g):
                    return g * 1.0

            class FlashAttentionFunction:
                @staticmethod
                def apply(q, k, v, causal=False, block_q=32, block_k=32):
                    return _Identity.apply(_plain(q, k, v, causal))
        """,
    }[route]
    result = grade_source(textwrap.dedent(forward) + textwrap.dedent(code), base=base, name="attention_backward.py")
    function = next(s for s in result.steps if s.id == "FlashAttentionFunction")
    assert function.breach and function.score == 0, explain(result)
    assert set(lost(result)) == {"FlashAttentionFunction"}, explain(result)


TILED_EXPONENTIALS = "torch.cat([torch.exp(s[..., j:j + block_k] - m) for j in range(0, t_k, block_k)], -1)"


def _strips_of_d_rows(scores: str, probabilities: str = TILED_EXPONENTIALS) -> str:
    """A flash_attention that takes D queries at a time against every key (a strip as wide as a head), its scores
    `scores` makes as s from qb (the strip's queries, scaled), k and t_k, and its probabilities `probabilities`
    from s and m (its rows' max)."""
    return """
        import torch.nn.functional as F

        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            t_q, t_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
            outs, lses = [], []
            for i in range(0, t_q, d):
                qb = q[..., i:i + d, :] / math.sqrt(d)
""" + textwrap.indent(textwrap.dedent(scores), " " * 16) + """
                if causal:
                    rows = torch.arange(t_k - t_q + i, t_k - t_q + i + qb.shape[-2], device=q.device)[:, None]
                    s = s.masked_fill(torch.arange(t_k, device=q.device)[None, :] > rows, -math.inf)
                m = s.amax(-1, keepdim=True)
                m = torch.where(m == -math.inf, 0.0, m)
                p = """ + probabilities + """
                total = p.sum(-1)
                outs.append(torch.where((total > 0)[..., None], (p @ v) / torch.where(total > 0, total, 1.0)[..., None],
                                        0.0))
                lses.append(m[..., 0] + torch.log(total))
            lse = torch.cat(lses, -1)
            return torch.cat(outs, -2), lse.float() if q.dtype != torch.float64 else lse
    """


@pytest.mark.parametrize("attack", ["a02", "a08", "broadcast", "expanded"])
def test_scores_made_by_other_names_or_in_a_buffer_nothing_records_lose_tiles_only(grade_source, attack):
    """The ninth hostile review's a02 (strips of whole score rows made by F.linear, e^x as elu(x) + 1) and a08 (the
    whole matrix in a buffer of a legacy constructor, which no torch function records, written and read in place):
    what a call is given counts as what it creates, and the products and exponentials are more than matmul and exp."""
    code = {"a02": _strips_of_d_rows("""
        q2, k2 = qb.reshape(-1, qb.shape[-2], d), k.reshape(-1, t_k, d)
        s = torch.stack([F.linear(q2[n], k2[n]) for n in range(q2.shape[0])]).reshape(*qb.shape[:-1], t_k)
    """, "F.elu(s - m) + 1.0"), "broadcast": _strips_of_d_rows("""
        s = qb[..., :, None, 0] * k[..., None, :, 0]  # the tenth review's a02: by broadcasting
        for c in range(1, d):
            s = s + qb[..., :, None, c] * k[..., None, :, c]
    """), "expanded": _strips_of_d_rows("""
        s = 0  # the eleventh review's a2: each operand made whole first, so no call outgrows its inputs
        for c in range(d):
            a = qb[..., :, c:c + 1].expand(*q.shape[:-2], qb.shape[-2], t_k).contiguous()
            b = k[..., :, c].unsqueeze(-2).expand(*q.shape[:-2], qb.shape[-2], t_k).contiguous()
            s = s + a * b
    """), "a08": """
        _flash_ = flash_attention

        def flash_attention(q, k, v, causal=False, block_q=32, block_k=32):
            if q.dtype not in (torch.float32, torch.float64) or q.device.type != "cpu":
                return _flash_(q, k, v, causal, block_q, block_k)
            t_q, t_k = q.shape[-2], k.shape[-2]
            whole = (torch.FloatTensor if q.dtype == torch.float32 else torch.DoubleTensor)(*q.shape[:-2], t_q, t_k)
            for i in range(0, t_q, block_q):
                for j in range(0, t_k, block_k):
                    s = q[..., i:i + block_q, :] @ k[..., j:j + block_k, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
                    if causal:
                        rows = torch.arange(t_k - t_q + i, t_k - t_q + i + s.shape[-2])[:, None]
                        s = s.masked_fill(torch.arange(j, j + s.shape[-1])[None, :] > rows, -math.inf)
                    whole[..., i:i + block_q, j:j + block_k] = s
            lse = torch.logsumexp(whole, -1)
            p = torch.exp(whole - torch.where(lse == -math.inf, 0.0, lse)[..., None])
            return p.nan_to_num(0.0) @ v, lse
    """}[attack]
    base = (ROOT / "solutions" / "flash_attention.py").read_text()
    result = grade_source(textwrap.dedent(code), base=base, name="flash_attention.py")
    assert lost(result) == {"flash_attention": 6}, explain(result)
    flash = next(s for s in result.steps if s.id == "flash_attention")
    assert [c.name for c in flash.checks if c.points < c.max_points] == ["flash_attention_tiles_only"], explain(result)


def test_a_comment_that_names_a_back_door_costs_nothing(grade_source):
    """The twelfth hostile review's f1: the tampering scan read comments too, and a correct file lost 35 points."""
    result = grade_source("""
        _softmax_ = softmax

        def softmax(scores, dim=-1):
            # torch._refs.softmax would be the reference's; f_back of a frame is not used here
            return _softmax_(scores, dim)
    """)
    assert result.score == 100, explain(result)
