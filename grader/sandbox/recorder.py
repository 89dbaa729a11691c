"""The record of the candidate's torch calls: which functions it called, and the shapes of what they made.

A TorchFunctionMode sees every torch function called while it is active, however it is reached (an
alias, getattr, a method), and writes down its name; the grader decides which names were forbidden.
While the grader's own code runs in a child (a question to the grader, a stand-in's method, the
grader's filling of an object), the record is paused: those calls are not the candidate's.

Loaded by path by worker.py (never as part of the grader package); torch is handed in, so loading
this file costs nothing before the zygote imports torch.
"""

import contextlib

MAX_SHAPES = 256  # distinct shapes one request records


def make_recorder(torch):
    """The recorder for a child: one TorchFunctionMode, entered (`with recorder:`) around the candidate's code."""
    from torch.overrides import TorchFunctionMode

    class Recorder(TorchFunctionMode):
        """Records the name of every torch function called while it is active.

        On the meta device it also lets a 0-dim CPU tensor meet a meta one, as CUDA lets it
        meet a CUDA tensor (torch.tensor(d).sqrt() is fine on a GPU; the meta device alone
        would refuse it).
        """

        seen: set = set()
        device: str = "cpu"
        shapes = None  # a Shapes while a request asks for the shapes of what the call creates (`"shapes": true`)
        changed: list = []  # the arguments a call changed in place

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(getattr(func, "__name__", "?")))
            kwargs = kwargs or {}
            if self.device == "meta":
                args, kwargs = _scalars_to_meta(torch, args, kwargs)
            value = func(*args, **kwargs)
            if self.shapes is not None:
                self.shapes.add(torch, value)
            return value

        @contextlib.contextmanager
        def paused(self):
            """While the grader's own code runs: its torch calls, and the tensors they create, go unrecorded."""
            seen, self.seen = self.seen, set()
            shapes, self.shapes = self.shapes, None
            try:
                yield
            finally:
                self.seen = seen
                self.shapes = shapes

    return Recorder()


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
        for t in value if isinstance(value, (tuple, list)) else (value,):
            if not isinstance(t, torch.Tensor):
                continue
            base = t._base if t._base is not None and t._base.numel() < t.numel() else t  # an expand: its memory
            key = tuple(int(n) for n in base.shape)
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
