"""The record of the candidate's torch calls: which functions it called, and the shapes of what they made.

A TorchFunctionMode sees every torch function called while it is active, however it is reached (an
alias, getattr, a method), and writes down its name; the grader decides which names were forbidden.
While the grader's own code runs in a child (a question to the grader, a stand-in's method, the
grader's filling of an object), the record is paused: those calls are not the candidate's.

Loaded by path by worker.py (never as part of the grader package); torch is handed in, so loading
this file costs nothing before the zygote imports torch.
"""

import contextlib
import functools
import os

MAX_SHAPES = 256  # distinct shapes one request records
# Tensor methods that run a Python callable of the caller's inside the call, where the record is stashed
CALLBACKS = ("apply_", "map_", "map2_")
# Autograd's entry points: they run the caller's code inside themselves (a hook, a Function's backward), where
# the record would be stashed; the worker runs autograd's engine itself, with the record on the stack
REENTERED = ("backward", "grad")
# Their parameters and defaults (torch 2.x), bound here by hand: the record's own code calls nothing the file could
# have replaced (inspect.signature is Python, and the record is stashed while it runs)
AUTOGRAD_PARAMETERS = {
    "Tensor": (("self", None), ("gradient", None), ("retain_graph", None), ("create_graph", False), ("inputs", None)),
    "backward": (("tensors", None), ("grad_tensors", None), ("retain_graph", None), ("create_graph", False),
                 ("grad_variables", None), ("inputs", None)),
    "grad": (("outputs", None), ("inputs", None), ("grad_outputs", None), ("retain_graph", None),
             ("create_graph", False), ("only_inputs", True), ("allow_unused", None), ("is_grads_batched", False),
             ("materialize_grads", False)),
}
PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), range)  # arguments that run no code


def make_recorder(torch, lifted):
    """The recorder for a child: one TorchFunctionMode, entered (`with recorder:`) around the candidate's code.

    `lifted` (guard.py) lets it read the mode stack, which the candidate's code may not.
    """
    import numpy
    from torch.overrides import TorchFunctionMode

    own_types = _subclasses(torch.Tensor)  # torch's own tensor types, all loaded before any candidate code
    torch_folder = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    # exact types (a subclass of float of the file's own runs its code when torch compares it), numpy's scalars
    plain = frozenset((*PLAIN, torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Generator,
                       *_subclasses(numpy.generic)))
    hooks = _Hooks(torch)

    class Recorder(TorchFunctionMode):
        """Records the name of every torch function called while it is active.

        On the meta device it also lets a 0-dim CPU tensor meet a meta one, as CUDA lets it
        meet a CUDA tensor (torch.tensor(d).sqrt() is fine on a GPU; the meta device alone
        would refuse it).
        """

        seen: set = set()
        hidden: str = ""  # why the record may lack calls (they ran where it could not see them), once known
        device: str = "cpu"
        shapes = None  # a Shapes while a request asks for the shapes of what the call creates (`"shapes": true`)
        changed: list = []  # the arguments a call changed in place

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = str(getattr(func, "__name__", "?"))
            self.seen.add(name)
            kwargs = kwargs or {}
            if not self.hidden:
                self.hidden = (_hiding(func, name, types, own_types, torch_folder) or hooks.set()
                               or _foreign_argument(torch, numpy, name, (args, kwargs), own_types, plain, torch_folder))
            if self.device == "meta":
                args, kwargs = _scalars_to_meta(torch, args, kwargs)
            if name in REENTERED and func in (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad):
                value = self._autograd(func, args, kwargs)
            else:
                value = func(*args, **kwargs)
            if self.shapes is not None:
                self.shapes.add(torch, value)
            return value

        def __exit__(self, *exc):
            """Leave the mode stack as it was entered; a call that popped this mode, or left another above it,
            hid what it did after that from the record."""
            with lifted():
                depth = torch._C._len_torch_function_stack()
                stack = [torch._C._get_function_stack_at(i) for i in range(depth)]
                if not stack or stack[-1] is not self:
                    self.hidden = self.hidden or "the torch-function mode stack was changed"
                while stack and stack[-1] is not self:
                    torch._C._pop_torch_function_stack()
                    stack.pop()
                if stack:
                    torch._C._pop_torch_function_stack()

        def _autograd(self, func, args, kwargs):
            """What torch.autograd.backward or grad does past its dispatch, with this mode on the stack."""
            from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
            from torch.autograd.graph import _engine_run_backward

            given = _bound(AUTOGRAD_PARAMETERS[func.__name__ if func is not torch.Tensor.backward else "Tensor"],
                           args, kwargs)
            if given is None:
                self.hidden = self.hidden or f"torch.autograd.{func.__name__} with arguments the worker does not follow"
                return func(*args, **kwargs)
            if func is torch.Tensor.backward:
                outputs, grads, inputs = (given["self"],), given["gradient"], given["inputs"]
            else:
                outputs = given["tensors"] if func is torch.autograd.backward else given["outputs"]
                outputs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
                grads = given["grad_tensors"] if func is torch.autograd.backward else given["grad_outputs"]
                inputs = given["inputs"]
            if given.get("is_grads_batched") or given.get("grad_variables") is not None or isinstance(inputs, dict):
                self.hidden = self.hidden or f"torch.autograd.{func.__name__} with arguments the worker does not follow"
                return func(*args, **kwargs)
            inputs = () if inputs is None else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
            create = given["create_graph"]
            retain = create if given["retain_graph"] is None else given["retain_graph"]
            with self._reentered():
                grads = _make_grads(outputs, _tensor_or_tensors_to_tuple(grads, len(outputs)), is_grads_batched=False)
                if func is not torch.autograd.grad:
                    _engine_run_backward(outputs, grads, retain, create, inputs, allow_unreachable=True,
                                         accumulate_grad=True)
                    return None
                unused = given["materialize_grads"] if given["allow_unused"] is None else given["allow_unused"]
                result = _engine_run_backward(outputs, grads, retain, create, inputs, unused, accumulate_grad=False)
                if given.get("materialize_grads"):
                    result = tuple(torch.zeros_like(i) if r is None else r for r, i in zip(result, inputs, strict=True))
                return result

        @contextlib.contextmanager
        def _reentered(self):
            """This mode on the stack again while a call runs that torch made with it stashed."""
            with lifted():
                torch._C._push_on_torch_function_stack(self)
            try:
                yield
            finally:
                with lifted():
                    if torch._C._len_torch_function_stack() and torch._C._get_function_stack_at(
                            torch._C._len_torch_function_stack() - 1) is self:
                        torch._C._pop_torch_function_stack()
                    else:
                        self.hidden = self.hidden or "the torch-function mode stack was changed"

        @contextlib.contextmanager
        def paused(self):
            """While the grader's own code runs: its torch calls, and the tensors they create, go unrecorded."""
            seen, self.seen = self.seen, set()
            shapes, self.shapes = self.shapes, None
            hidden = self.hidden
            try:
                yield
            finally:
                self.seen = seen
                self.shapes = shapes
                self.hidden = hidden

    return Recorder()


def _subclasses(cls) -> frozenset:
    found, frontier = {cls}, [cls]
    while frontier:
        for sub in frontier.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                frontier.append(sub)
    return frozenset(found)


def _hiding(func, name: str, types, own_types, torch_folder: str) -> str:
    """Why this call lets code of the candidate's run where the record cannot see it, or "".

    While the mode handles a call, the mode is stashed: whatever the call runs goes unrecorded.
    That is torch's own code, unless the call hands control back to the candidate's: a tensor
    subclass of its own (its __torch_function__ runs), a function of its own passed off as a
    torch function (torch.overrides.handle_torch_function), or a Python callback (Tensor.apply_).
    """
    foreign = [t.__name__ for t in types if t not in own_types]
    if foreign:
        return f"a tensor subclass of the file's own ({foreign[0]})"
    if name in CALLBACKS:
        return f"Tensor.{name}, which runs a Python callable inside the call"
    layer = func
    for _ in range(8):  # a torch wrapper (torch.overrides.wrap_torch_function) around a function of the file's
        code = getattr(layer, "__code__", None)
        if code is not None and not code.co_filename.startswith(torch_folder):
            return f"{name}, a function of the file's own, run as a torch function"
        layer = getattr(layer, "__wrapped__", None)
        if layer is None:
            break
    if isinstance(func, functools.partial):
        return f"{name}, a partial function of the file's own, run as a torch function"
    return ""


def _bound(parameters, args, kwargs) -> dict | None:
    """The arguments by name, defaults filled in; None for a call these parameters cannot take."""
    names = [name for name, _ in parameters]
    if len(args) > len(names) or any(k not in names for k in kwargs) or any(n in kwargs for n in names[:len(args)]):
        return None
    return {**dict(parameters), **dict(zip(names[: len(args)], args, strict=True)), **kwargs}


class _Hooks:
    """The process-wide hooks through which Python of the file's own could run inside a torch call, where the record
    is stashed: warnings' display, unraisable exceptions, the garbage collector's callbacks, autograd's saved-tensor
    hooks. As the worker found them when armed; `set()` says which one the file has set since, or ""."""

    def __init__(self, torch):
        import gc
        import sys
        import warnings

        self.sys, self.warnings = sys, warnings
        self.callbacks = gc.callbacks  # the list the collector itself holds
        self.top_hooks = torch._C._autograd._top_saved_tensors_default_hooks  # bound now: no file can replace it
        self.kept = self._now()

    def _now(self):
        return (self.warnings.showwarning, self.warnings._showwarnmsg, self.warnings.formatwarning,
                self.sys.unraisablehook, self.sys.excepthook)

    def set(self) -> str:
        if self.callbacks:
            return "a garbage-collector callback of the file's own, which may run inside a torch call"
        if any(a is not b for a, b in zip(self._now(), self.kept, strict=True)):
            return "a warnings or exception hook of the file's own, which torch may call inside a call"
        if self.top_hooks(True) is not None:
            return "saved-tensor hooks of the file's own, which autograd runs inside a torch call"
        return ""


def _foreign_argument(torch, numpy, name: str, arguments, own_types, plain, torch_folder: str) -> str:
    """Why an argument of this call could run the file's own code inside it, or "": an object of a type of the
    file's own (torch reads a sequence's items, calls a hook), or a function of the file's own."""
    stack, seen = [arguments], 0
    while stack:
        value = stack.pop()
        seen += 1
        kind = type(value)
        if kind in (tuple, list, torch.Size):
            stack.extend(value)
        elif kind is dict:
            stack.extend(value.values())
        elif kind is slice:
            stack.extend((value.start, value.stop, value.step))
        elif kind in own_types or kind in plain:
            continue
        elif kind is numpy.ndarray:
            if value.dtype == object:
                return f"an array of Python objects passed to {name}"
        else:
            code = getattr(value, "__code__", None)
            if code is not None and code.co_filename.startswith(torch_folder):
                continue
            return f"an object of the file's own ({kind.__name__}) passed to {name}, which may run its code"
    return ""


class Shapes:
    """The shapes of the tensors a call's torch functions create, for checks of what a step materialises
    (tiles, say, where the whole matrix must never exist). A view counts as itself (a transpose or reshape
    holds as many elements as the memory it views, einsum's answer among them; a slice fewer), but a view
    larger than that memory (an expand of a small tensor) counts as the tensor it views: no more is held.
    Plain data, bounded: each distinct shape once, in the order first seen, at most MAX_SHAPES of them;
    `more` counts the distinct shapes left out:
    {"created": [[2, 2, 16, 24], [2, 2, 16], ...], "more": 0}.
    """

    def __init__(self):
        self.seen = {}
        self.more = 0

    def add(self, torch, value) -> None:
        BASE_OF, NUMEL, SHAPE_OF = (torch._C.TensorBase._base.__get__, torch._C.TensorBase.numel,  # noqa: N806
                                    torch._C.TensorBase.shape.__get__)
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if not isinstance(t, torch.Tensor):
                continue
            # through torch's C type, whose attributes no file can replace (torch.Tensor's it can)
            view_of = BASE_OF(t)
            base = view_of if view_of is not None and NUMEL(view_of) < NUMEL(t) else t  # an expand: its memory
            key = tuple(int(n) for n in SHAPE_OF(base))
            if key in self.seen:
                continue
            if len(self.seen) >= MAX_SHAPES:
                self.more += 1
                continue
            self.seen[key] = True

    def data(self) -> dict:
        return {"created": [list(s) for s in self.seen], "more": self.more}


def _scalars_to_meta(torch, args, kwargs):
    values = [*args, *kwargs.values()]
    if not any(type(v) is torch.Tensor and v.is_meta for v in values):
        return args, kwargs

    def moved(v):
        return v.to("meta") if type(v) is torch.Tensor and v.dim() == 0 and v.device.type == "cpu" else v

    return tuple(moved(a) for a in args), {k: moved(v) for k, v in kwargs.items()}
