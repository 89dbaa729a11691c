"""What each kind of answer from a worker must be, checked before any check reads it.

Every answer comes from a process that ran the candidate's code, so it is data to check, never to trust: each
kind is validated here, once, against what the check asked for (grader/candidate.py calls these). A value that
is not what was asked for raises Malformed, which costs the candidate that check, never the grader its run.
"""

from __future__ import annotations

from grader import errors

MAX_LAYERS = 4096  # a module's child layers, and the parameters it names (its gradients, those it left unloaded)
MAX_CLASSES = 64  # the classes one layer is (its MRO)
MAX_NAME = 200  # characters of a layer's, a parameter's or a class's name
MAX_SIZES = 16  # the largest sizes of the storages a call held at once, with how many of each (recorder.py)
HEX = frozenset("0123456789abcdef")


def shape_record(record) -> dict | None:
    """The worker's record of the shapes a call created (and of those its products and exponentials returned),
    checked to be what it says: lists of whole numbers; and of the calls it made, a digest and a count."""
    if record is None:
        return None
    lists = [record.get(k) if isinstance(record, dict) else None for k in ("created", "scores", "blocks")]
    more = record.get("more") if isinstance(record, dict) else None
    if type(more) is not int or not all(isinstance(shapes, list) and len(shapes) <= 4096 for shapes in lists):
        raise Malformed("a malformed record of shapes")
    if not all(isinstance(s, list) and len(s) <= 64 and all(type(n) is int and n >= 0 for n in s)
               for shapes in lists for s in shapes):
        raise Malformed("a malformed record of shapes")
    sequence, calls, held = record.get("sequence"), record.get("calls"), record.get("held")
    if not (type(sequence) is str and len(sequence) == 32 and all(c in HEX for c in sequence)
            and type(calls) is int and calls >= 0):
        raise Malformed("a malformed record of calls")
    if type(held) is not int or held < 0:
        raise Malformed("a malformed record of the bytes held")
    loaded, blocks_alive = record.get("loaded"), record.get("blocks_alive")
    if type(loaded) is not int or loaded < 0 or type(blocks_alive) is not int or blocks_alive < 0:
        raise Malformed("a malformed record of what a kernel's loads read and its blocks held")
    alive, largest = record.get("alive"), record.get("largest")
    if not (type(alive) is int and alive >= 0 and isinstance(largest, list) and len(largest) <= MAX_SIZES
            and all(isinstance(p, list) and len(p) == 2 and all(type(n) is int and n > 0 for n in p) for p in largest)
            and sum(size * count for size, count in largest) <= alive):
        raise Malformed("a malformed record of the bytes alive at once")
    return {"created": [tuple(s) for s in lists[0]], "more": more, "scores": [tuple(s) for s in lists[1]],
            "blocks": [tuple(s) for s in lists[2]], "loaded": loaded, "blocks_alive": blocks_alive,
            "sequence": sequence, "calls": calls, "held": held, "alive": alive, "largest": [tuple(p) for p in largest]}


class Malformed(ValueError):
    """An answer that is not what the check asked for: why, said without the candidate's text."""


def _names(value, what: str, limit: int = MAX_LAYERS) -> list[str]:
    """A list of at most `limit` strings, each made printable and capped."""
    if not isinstance(value, list) or len(value) > limit or not all(type(n) is str for n in value):
        raise Malformed(f"{what} is not a list of at most {limit} names")
    return [errors.printable(n)[:MAX_NAME] for n in value]


def module_result(value, forward: bool, repeat: bool, grads: int | None) -> dict:
    """A module's result (`Candidate.module`): "output"; "children", each layer's name to the names of its
    classes; with a forward pass "unloaded", the parameters the state did not fill; with `repeat` "again";
    with gradients (`grads`: how many arguments were asked for) "arg_grads" and "param_grads"."""
    import torch  # the grader imported it long before an answer arrives

    if not isinstance(value, dict):
        raise Malformed(f"a module's result is a {type(value).__name__}, not a dict")
    wanted = ["output", "children"] + (["unloaded"] if forward else []) + (["again"] if forward and repeat else [])
    wanted += ["arg_grads", "param_grads"] if forward and grads is not None else []
    missing = [key for key in wanted if key not in value]
    if missing:
        raise Malformed(f"a module's result has no {', '.join(missing)}")
    children = value["children"]
    if not isinstance(children, dict) or len(children) > MAX_LAYERS:
        raise Malformed("a module's layers are not a dict of layer names")
    checked = {"output": value["output"],
               "children": {errors.printable(k)[:MAX_NAME]: _names(v, f"the classes of layer {k[:40]!r}", MAX_CLASSES)
                            for k, v in children.items()}}
    if any(not v for v in checked["children"].values()):
        raise Malformed("a layer is of no class")
    if not forward:
        if value["output"] is not None:
            raise Malformed("a module that was only built has an output")
        return checked
    checked["unloaded"] = _names(value["unloaded"], "the parameters left unloaded")
    if repeat:
        checked["again"] = value["again"]
    if grads is not None:
        arg_grads, param_grads = value["arg_grads"], value["param_grads"]
        gradient = lambda g: g is None or type(g) is torch.Tensor  # noqa: E731
        if not isinstance(arg_grads, list) or len(arg_grads) != grads or not all(map(gradient, arg_grads)):
            raise Malformed(f"the arguments' gradients are not a list of {grads} tensors (or None)")
        if (not isinstance(param_grads, dict) or len(param_grads) > MAX_LAYERS
                or not all(gradient(g) for g in param_grads.values())):
            raise Malformed("the parameters' gradients are not a dict of tensors (or None)")
        checked["arg_grads"] = arg_grads
        checked["param_grads"] = {errors.printable(k)[:MAX_NAME]: g for k, g in param_grads.items()}
    return checked


def script_result(value, actions: list[dict]) -> tuple[list, dict[int, dict], int | None]:
    """A script's (results, raised, stopped) (`Candidate.script`): one result per action run, every action unless
    one raised and ended the script (`stopped`, its index); `raised`, by action index, each error an action raised:
    the stopping one, and those of actions that may raise (their result None)."""
    if not isinstance(value, dict):
        raise Malformed(f"a script's result is a {type(value).__name__}, not a dict")
    results, raised, stopped = value.get("results"), value.get("raised"), value.get("stopped")
    if stopped is not None and (type(stopped) is not int or not 0 <= stopped < len(actions)):
        raise Malformed("a script stopped at no action of its own")
    ran = len(actions) if stopped is None else stopped + 1
    if not isinstance(results, list) or len(results) != ran:
        got = f"{len(results)} results" if isinstance(results, list) else "no list of results"
        raise Malformed(f"a script that ran {ran} of its {len(actions)} actions sent {got}")
    if not isinstance(raised, dict) or len(raised) > ran:
        raise Malformed("a script's errors are not a dict of at most one per action")
    errors_at: dict[int, dict] = {}
    for key, error in raised.items():
        if not (key.isascii() and key.isdigit() and str(int(key)) == key and int(key) < ran):
            raise Malformed(f"a script's error is keyed {ascii(key[:20])}, not by the index of an action that ran")
        index = int(key)
        may_raise = isinstance(actions[index], dict) and actions[index].get("may_raise") is True
        if not isinstance(error, dict) or results[index] is not None or not (may_raise or index == stopped):
            raise Malformed(f"action {index + 1} of the script raised as no action of it can")
        errors_at[index] = error
    if stopped is not None and stopped not in errors_at:
        raise Malformed(f"a script stopped at action {stopped + 1} without its error")
    return results, errors_at, stopped
