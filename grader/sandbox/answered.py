"""The oracle's side in a child: the candidate's step functions a composite calls, answered by the grader.

While a composite runs, each step function the request names ("answered") is replaced in the
candidate's module by a proxy that asks the grader over the child's pipe for the reference's result
of its own inputs, and hands that back; gradients flow through these answers too (backward asks for
the reference's vector-Jacobian product). Only plain data crosses: no reference code is ever in the
child.

Loaded by path by worker.py (never as part of the grader package); torch and the wire module are
handed in.
"""

import builtins
import inspect

QUESTIONS = ("answer", "answer_grad")
QUESTION_FIELDS = ("op", "name", "args", "kwargs", "grad", "index", "grads")


class Answered:
    """While active, the candidate's step functions named in `names` are answered by the grader.

    A composite that calls one of its steps gets the reference's result of its own inputs,
    asked for over the pipe: the grader computes it and sends the result back as plain data.
    """

    def __init__(self, torch, wire, record, module, names, fds):
        self.torch, self.wire, self.record, self.module, self.names = torch, wire, record, module, list(names)
        self.read_fd, self.write_fd, self.key = fds
        self.saved = {}

    def __enter__(self):
        for name in self.names:
            if hasattr(self.module, name):
                self.saved[name] = getattr(self.module, name)
                setattr(self.module, name, self._proxy(name))
        return self

    def __exit__(self, *exc):
        for name, function in self.saved.items():
            setattr(self.module, name, function)
        self.saved = {}

    def ask(self, header):
        """One question to the grader, and its answer; the torch calls made here are the grader's, not the candidate's
        (nor the tensors they create). The question is made plain data first, while the record still runs: nothing
        of the file's (a property, a metaclass, an __iter__) may run where the record is paused."""
        if type(header) is not dict:
            raise RuntimeError("the grader answers only questions about the steps a composite calls")
        header = {k: self.wire.plain(v) for k, v in dict.items(header) if type(k) is str and k in QUESTION_FIELDS}
        if header.get("op") not in QUESTIONS:  # a question, never what could pass for an answer
            raise RuntimeError("the grader answers only questions about the steps a composite calls")
        shapes = self.record.shapes  # read before the pause, which stashes it
        with self.record.paused():
            blobs = []
            header = {k: self.wire.encode(v, blobs) if k in ("args", "kwargs", "grads") else v
                      for k, v in header.items()}
            self.wire.write_frame(self.write_fd, header, blobs, key=self.key)
            reply, reply_blobs = self.wire.read_frame(self.read_fd)
            if reply.get("ok") is not True:
                raise RuntimeError(f"{header.get('name', 'a step')} (answered by the grader): {reply.get('error')}")
            value = self.wire.decode(reply.get("value"), reply_blobs)
            # An answer is made for the composite, as its own call of the step would have made it: where the record
            # keeps shapes, it holds the answer's too (review 67's N1 had the grader compute strips of scores)
            if shapes is not None:
                shapes.add(self.torch, value)
            return value, reply.get("index")

    def _channel(self):
        """The questions' way to `ask`: a generator, whose frame (the only thing that holds this object) the
        candidate's code may not read (guard.py refuses gi_frame). `ask` is bound here, before any candidate code
        runs, so replacing Answered.ask later changes nothing."""
        ask, reply = self.ask, None
        while True:
            header = yield reply
            try:
                reply = (True, ask(header))
            except Exception as error:  # handed to the proxy to raise: a generator that raised would be done
                reply = (False, error)

    def _proxy(self, name):
        """The proxy for the step `name`, made in a namespace of its own (PROXIES): what the candidate's code can
        reach from it (its globals, its closure) holds only the channel's `send`, never this module or the worker."""
        channel = self._channel()
        next(channel)
        return PROXIES["make_proxy"](self.torch, channel.send, name, inspect.signature(self.saved[name]))


# The proxies' own namespace: functions defined here have it as their globals, with a copy of the builtins, so
# a proxy's __globals__ leads to this and nothing else (the answering, the record and the key stay out of reach).
PROXY_SOURCE = """
def make_proxy(torch, send, name, signature):
    def ask(header):
        ok, value = send(header)
        if not ok:
            raise value
        return value

    class Answer(torch.autograd.Function):
        @staticmethod
        def forward(ctx, args, kwargs, *tensors):
            value, ctx.index = ask({"op": "answer", "name": name, "args": args, "kwargs": kwargs, "grad": True})
            return placed(torch, value, target(torch, tensors, {}))

        @staticmethod
        def backward(ctx, *grads):
            value, _ = ask({"op": "answer_grad", "index": ctx.index, "grads": grads})
            return (None, None, *placed(torch, tuple(value), target(torch, grads, {})))

    def proxy(*args, **kwargs):
        # Bound by the candidate's own parameter names, sent by position: the grader binds them to the contract's.
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        args, kwargs = tuple(bound.args), dict(bound.kwargs)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not any(t.requires_grad for t in tensors):  # nothing to differentiate (NumPy, or no grad wanted)
            question = {"op": "answer", "name": name, "args": args, "kwargs": kwargs, "grad": False}
            return placed(torch, ask(question)[0], target(torch, tensors, bound.arguments))
        return Answer.apply(args, kwargs, *tensors)

    proxy.__name__ = name
    return proxy


def target(torch, tensors, arguments):
    # Where an answer belongs: the device a `device` argument asks for, else the inputs' device.
    asked = arguments.get("device")
    if isinstance(asked, (str, torch.device)):
        return torch.device(asked)
    return next((t.device for t in tensors if isinstance(t, torch.Tensor)), None)


def placed(torch, value, device):
    # Tensors of an answer moved to `device` (the grader answers on the CPU; a meta answer comes as meta).
    if device is None or device.type == "cpu":
        return value
    if isinstance(value, tuple):
        return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in value)
    return value.to(device) if isinstance(value, torch.Tensor) else value
"""
PROXIES = {"__builtins__": dict(builtins.__dict__), "__name__": "answered_proxies"}
exec(compile(PROXY_SOURCE, "<the oracle's proxies>", "exec"), PROXIES)
