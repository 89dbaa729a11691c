"""The script op: a list of plain-data actions run in order on objects a child builds and keeps.

For a stateful class (an object that keeps what it was given, a module that fills one), the grader
sends the whole sequence at once: build objects (the candidate's classes, or the grader's stand-ins),
call their methods, read their attributes, fill part of a tensor attribute with a marker value. Each
action's result is encoded as plain data the moment it returns. The vocabulary is fixed and every
field is checked here: nothing in a script can name a private attribute or run anything else.

Loaded by path by worker.py (never as part of the grader package), as are the siblings it uses.
"""

import functools
import json
import math
import re
import types

import _attn_grade_sandbox_serve as serve  # this folder's modules, loaded by path by worker.py

MAX_SCRIPT_ACTIONS = 256  # actions in one script
MAX_RESULT_HEADER = 64 * 1024  # bytes of JSON one action's result may take
MAX_SCRIPT_BYTES = 64 * 1024 * 1024  # tensor bytes all of a script's results may take together
SCRIPT_ATTRIBUTE = re.compile(r"[A-Za-z][A-Za-z0-9_]*|__call__")  # what an action may call or read
MAX_FILL_ATTRIBUTES = 16  # attributes one fill action names
MAX_FILL_AXIS = 16
FILL_VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def run(torch, wire, record, module, stand_ins, request, blobs, blobs_out, oracle, lifted):
    """Run the grader's actions in order on objects built here; each action's result is plain data.

    Actions (every one a dict; objects are numbered in the order they are built):
      {"do": "build", "class": "Name", "init": [...], "init_kwargs": {...}, "state": {...} or None,
       "stand_in": false}   the candidate's class; with stand_in, the class of that name among the grader's
                            stand-ins (the spawn request's "stand_ins" file), whose torch calls, in its
                            __init__ and every method, are not recorded as the candidate's. With a state, a
                            module: weights loaded, moved to the device, in eval mode
      {"do": "call", "object": 0, "method": "name" | "__call__", "args": [...], "kwargs": {...},
       "refs": {"parameter": 1}, "may_raise": false}   tensors in args and kwargs go to the device; refs pass objects
      {"do": "get", "object": 0, "attribute": "name"}
      {"do": "storage", "object": 0, "attributes": ["a", "b"]}
                            for each attribute, where the tensor the object keeps under that name itself (an
                            attribute of its own, a slot, an nn.Module's buffer) lies (`_where`: its storage's
                            address, offset, sizes and strides), or None where no plain tensor is kept there, its
                            class decides what a read gets (`_kept`), or the tensor kept is not the very one a read
                            of the name gets now and the last `get` of it got; every tensor read stays alive to the
                            script's end, so no new tensor takes a freed one's address
      {"do": "fill", "object": 0, "attributes": ["a", "b"], "axis": 2, "start": "size" | 3, "value": "nan"}
                            each attribute, a torch.Tensor of more than `axis` dimensions, gets `value`
                            ("nan", "inf", "-inf" or a number) from index `start` on along `axis`, if it
                            is floating point; `start` is an int, or the name of the object's attribute
                            that holds one. The attributes are read as the candidate's code keeps them;
                            the filling is the grader's (not recorded)

    The reply's value: {"results": [one per action run], "raised": {"index": error}, "stopped": index or None}.
    An action marked may_raise that raises records its error in "raised" and the script goes on
    (the result is None); any other exception ends the script there ("stopped"). Every result is
    encoded as soon as its action returns (a view of a buffer the next action writes is sent as
    it was), and is bounded.
    """
    actions = wire.decode(request.get("actions"), blobs)
    device = request.get("device", "cpu")
    if not isinstance(actions, list) or len(actions) > MAX_SCRIPT_ACTIONS:
        raise ValueError(f"a script is a list of at most {MAX_SCRIPT_ACTIONS} actions")
    objects, encoded, raised, stopped = [], [], {}, None
    objects_kept = []  # the tensors `storage` actions read: alive until the script ends
    got = {}  # (object, attribute) -> the tensor its last `get` returned
    path = getattr(module, "__file__", "")
    with torch.no_grad(), record, oracle:
        for index, action in enumerate(actions):
            mark = len(blobs_out)
            try:
                value = _act(torch, wire, record, module, stand_ins, objects, action, device, objects_kept, got)
                item = wire.encode(value, blobs_out)
                _bounded(item, blobs_out)
                encoded.append(item)
            except BaseException as exc:  # the candidate's exception, even SystemExit, is an answer
                del blobs_out[mark:]  # a result that could not be sent leaves no bytes behind
                raised[str(index)] = serve.describe(exc, path, lifted, record)
                encoded.append(None)
                if not (isinstance(action, dict) and action.get("may_raise") is True):
                    stopped = index
                    break
    return {"kind": "dict", "items": {
        "results": {"kind": "list", "items": encoded},
        "raised": wire.encode(raised, blobs_out),
        "stopped": stopped,
    }}


def _bounded(item, blobs_out) -> None:
    """One action's encoded result is small enough to send: JSON-able, short, and the script's bytes in bounds."""
    try:
        size = len(json.dumps(item, allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        raise TypeError("the result is not plain data that can be sent (an integer too large?)") from None
    if size > MAX_RESULT_HEADER:
        raise ValueError(f"the result takes {size} bytes to describe: more than the grader reads")
    if sum(len(b) for b in blobs_out) > MAX_SCRIPT_BYTES:
        raise ValueError(f"the results hold more than {MAX_SCRIPT_BYTES >> 20} MB of tensors: "
                         "more than the grader reads")


def _act(torch, wire, record, module, stand_ins, objects, action, device, kept, got):
    """One action of a script; its result (None for build and fill)."""
    if not isinstance(action, dict):
        raise ValueError("an action is a dict")
    do = action.get("do")
    if do == "build":
        objects.append(_build(torch, record, module, stand_ins, action, device))
        return None
    index = action.get("object")
    if type(index) is not int or not 0 <= index < len(objects):
        raise ValueError("an action names an object that was not built")
    target = objects[index]
    if do == "call":
        args = [serve.to_device(torch, a, device, None) for a in action.get("args") or ()]
        kwargs = {k: serve.to_device(torch, v, device, None) for k, v in (action.get("kwargs") or {}).items()}
        kwargs.update({k: objects[i] for k, i in (action.get("refs") or {}).items()})
        method = _name(action.get("method"))
        return target(*args, **kwargs) if method == "__call__" else getattr(target, method)(*args, **kwargs)
    if do == "get":
        name = _name(action.get("attribute"))
        value = getattr(target, name)
        got[index, name] = value
        return value
    if do == "fill":
        _fill(torch, wire, record, target, action)
        return None
    if do == "storage":
        names = action.get("attributes")
        if not isinstance(names, list) or not 0 < len(names) <= MAX_FILL_ATTRIBUTES:
            raise ValueError(f"a storage action names a list of 1 to {MAX_FILL_ATTRIBUTES} attributes")
        found = []
        for name in map(_name, names):  # recorded, as any reads of the objects are
            tensor, read = _kept(torch, target, name), getattr(target, name)
            # the tensor kept is the one the checks read: a read now and the last `get` find it (the forty-third
            # review: a buffer shown to this look only, swapped in by a call between the reads and this action, or
            # kept in _buffers while _parameters answers every read)
            same = tensor is read and tensor is got.get((index, name), read)
            found.append(tensor if same else None)
            kept.extend((tensor, read))
        with record.paused():  # the grader's own look at where each plain tensor lives
            return [_where(t) if t is not None else None for t in found]
    raise ValueError(f"unknown action {str(do)[:40]!r}")


def _build(torch, record, module, stand_ins, action, device):
    """A new object: the candidate's class, or the grader's stand-in; with a state, a module holding the
    grader's weights."""
    name = _name(action.get("class"))
    if action.get("stand_in") is True:
        if stand_ins is None:
            raise LookupError(f"the grader has no stand-in {name} for this exercise (its spawn named no stand-ins)")
        cls = _unrecorded(torch, getattr(stand_ins, name), record)
    else:
        cls = getattr(module, name)
    instance = cls(*(action.get("init") or ()), **(action.get("init_kwargs") or {}))
    state = action.get("state")
    if isinstance(state, dict) and state:
        unloaded = serve.load_weights(instance, state)
        if unloaded:
            raise LookupError(f"the grader's weights did not fill {', '.join(unloaded)}")
    if isinstance(instance, torch.nn.Module):
        instance.to(device)
        instance.eval()
    return instance


def _unrecorded(torch, cls, record):
    """A subclass of the grader's stand-in class `cls` whose every method (its __init__, properties, class and
    static methods among them) runs with the record paused: the stand-in's torch calls are not the candidate's.

    What the candidate's code does with the object (reading a tensor it holds, then calling torch on it) is
    still recorded: only the stand-in's own code is the grader's. So no code of the file's may run in the pause
    (a `shape` property of an argument, the twenty-ninth review's f04; a property set on the stand-in's class, the
    thirtieth's f05): a method pauses only where `_graders_own` finds nothing of the file's in reach.
    """
    if not isinstance(cls, type):
        raise TypeError(f"the grader's stand-in {getattr(cls, '__name__', '?')} is not a class")
    made, members = [], {}
    plain = (type(None), bool, int, float, str, torch.Tensor, torch.dtype, torch.device)
    for klass in reversed(cls.__mro__[:-1]):  # object's own methods are no stand-in's; a subclass's win
        for attribute, value in vars(klass).items():
            paused = _paused_member(value, record, made, plain)
            if paused is not None:
                members[attribute] = paused
    members.update(__module__=cls.__module__, __qualname__=cls.__qualname__, __doc__=cls.__doc__)
    made.append(type(cls.__name__, (cls,), members))
    # its classes' namespaces as made: the file reaches them (type(cache)), and a property set there would run in
    # the pause (the thirtieth review's f05)
    made.append([(vars(klass), tuple(vars(klass).items())) for klass in made[0].__mro__[:-1]])
    return made[0]


def _paused_member(value, record, made, plain):
    """`value` (a member of a class) running with the record paused, or None if it runs no code of its own."""
    if isinstance(value, types.FunctionType):
        return _paused(value, record, made, plain, "self")
    if isinstance(value, property):
        accessors = (value.fget, value.fset, value.fdel)
        return property(*(f and _paused(f, record, made, plain, "self") for f in accessors), value.__doc__)
    if isinstance(value, staticmethod):
        return staticmethod(_paused(value.__func__, record, made, plain, "nothing"))
    if isinstance(value, classmethod):
        return classmethod(_paused(value.__func__, record, made, plain, "class"))
    return None


def _paused(function, record, made, plain, bound):
    @functools.wraps(function)
    def paused(*args, **kwargs):
        if not _graders_own(args, kwargs, made, plain, bound):  # the file's code may run in it: recorded
            return function(*args, **kwargs)
        with record.paused():
            return function(*args, **kwargs)

    return paused


def _graders_own(args, kwargs, made, plain, bound) -> bool:
    """Can a stand-in's method run with nothing of the file's in it? Its class as the grader made it, its object of
    exactly that class, holding and given only `_grader_data`.
    Where not, the method runs recorded, the file's code it reaches with it: the stand-in's own calls count as the
    candidate's then, which only a file that changed or fed it something else pays for."""
    if type(made[0]) is not type or not all(_same(space, kept) for space, kept in made[1]):
        return False
    given = args
    if bound != "nothing":
        owner = args[0] if args else None
        if (owner is not made[0]) if bound == "class" else (type(owner) is not made[0]):
            return False
        if bound == "self" and not _grader_data(vars(owner), plain, 0):
            return False
        given = args[1:]
    return all(_grader_data(a, plain, 0) for a in (*given, *dict.values(kwargs)))


def _same(space, kept: tuple) -> bool:
    """Does a class's namespace hold what it held, each name the same object?"""
    now = tuple(space.items())
    return len(now) == len(kept) and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(now, kept, strict=True))


def _grader_data(value, plain: tuple, depth: int) -> bool:
    """Is `value` data whose reading runs nothing of the file's? Exact types only: those `plain` names (None,
    numbers, strings, tensors, dtypes, devices), and tuples, lists, and dicts keyed by ints or strings, of them."""
    kind = type(value)
    if kind in plain:
        return True
    if depth > 8:
        return False
    if kind is tuple or kind is list:
        return all(_grader_data(v, plain, depth + 1) for v in value)
    if kind is dict:
        return all((type(k) is int or type(k) is str) and _grader_data(v, plain, depth + 1)
                   for k, v in dict.items(value))
    return False


def _fill(torch, wire, record, target, action) -> None:
    """The fill action: each named tensor attribute gets a marker value from `start` on along `axis`.

    The start (when named) and the tensors are read as the candidate's code keeps them (a property of
    theirs runs recorded); the checks and the filling are the grader's, with the record paused. Only a
    plain torch.Tensor is filled: a subclass could run the candidate's code in the grader's place.
    """
    names = action.get("attributes")
    if not isinstance(names, list) or not 0 < len(names) <= MAX_FILL_ATTRIBUTES:
        raise ValueError(f"a fill names a list of 1 to {MAX_FILL_ATTRIBUTES} attributes")
    names = [_name(n) for n in names]
    axis = action.get("axis")
    if type(axis) is not int or not 0 <= axis < MAX_FILL_AXIS:
        raise ValueError(f"a fill's axis is an int from 0 to {MAX_FILL_AXIS - 1}, not {str(axis)[:40]!r}")
    value = _fill_value(action.get("value"))
    start = action.get("start")
    if type(start) is str:
        attribute = _name(start)
        start = getattr(target, attribute)
        if type(start) is not int:
            raise TypeError(f"the object's {attribute} is {wire.type_name(start)}, not an int")
    elif type(start) is not int or start < 0:
        raise ValueError(f"a fill's start is a non-negative int or an attribute's name, not {str(start)[:40]!r}")
    tensors = [(name, getattr(target, name)) for name in names]
    with record.paused():
        for name, tensor in tensors:
            if type(tensor) is not torch.Tensor or tensor.dim() <= axis:
                raise TypeError(f"the object's {name} is not a torch.Tensor of more than {axis} dimensions")
        for _, tensor in tensors:
            if tensor.is_floating_point():
                tensor[(slice(None),) * axis + (slice(start, None),)] = value


def _kept(torch, obj, name: str):
    """The plain tensor `obj` keeps under `name` itself, where a read of the name finds it, through CPython's own
    descriptors: a slot, its instance dict's entry, or an nn.Module's buffer; never one a property, __getattr__ or
    __getattribute__ makes on the way (a grown tensor copied into one fixed buffer would look kept in place). None
    where none is kept, or where its class decides what a read gets: a __getattribute__, __dict__ or __class__ of its
    own, or a property under the name (the fortieth review's f03, the forty-first's f01 and the forty-second's f01:
    decoy buffers shown to a look that read elsewhere than the reads do)."""
    kind = type(obj)
    mro = TYPE_MRO(kind)
    for base in mro:  # torch's __getattr__ answers for a module's buffers, read here from _buffers
        space = TYPE_DICT(base)
        if (base is not object and base is not torch.nn.Module
                and any(n in space for n in ("__getattribute__", "__class__", "__getattr__"))):
            return None
        if not _plain_keys(space):
            return None
        if "__dict__" in space and type(space["__dict__"]) is not types.GetSetDescriptorType:
            return None
    # CPython's order for a plain read: a data descriptor on the class (a slot, or a property that decides what the
    # read gets), then the instance's dict, then a class attribute, and only then nn.Module's __getattr__ (_buffers):
    # the tensor found here is the one every `get` of the name reads (the forty-second review's f01, f02)
    descriptor = next((TYPE_DICT(base)[name] for base in mro if name in TYPE_DICT(base)), None)
    if descriptor is not None and _data_descriptor(descriptor):
        found = descriptor.__get__(obj, kind) if type(descriptor) is types.MemberDescriptorType else None
        return found if type(found) is torch.Tensor else None
    has_dict = any(type(TYPE_DICT(b).get("__dict__")) is types.GetSetDescriptorType for b in mro)
    own = OBJECT_GET(obj, "__dict__") if has_dict else None
    if type(own) is not dict or not _plain_keys(own) or not _plain_keys(own.get("_buffers", {})):
        return None
    if name in own:
        found = own[name]
    elif descriptor is None and issubclass(kind, torch.nn.Module) and type(own.get("_buffers")) is dict:
        found = own["_buffers"].get(name)
    else:
        return None
    return found if type(found) is torch.Tensor else None


def _where(tensor) -> list:
    """Where a tensor lies: its storage's address, its offset there, its sizes and strides. A slice taken further along
    one large storage at each append, a copy in it, has the storage's address but not the offset (the forty-fourth
    review's f03 to f05)."""
    return [tensor.untyped_storage().data_ptr(), tensor.storage_offset(), list(tensor.shape), list(tensor.stride())]


def _plain_keys(space) -> bool:
    """Whether every key of a namespace is a str of str's own class: a lookup there runs no code of the candidate's
    (a key of a str subclass hashed as the name has its __eq__ called by every lookup of it, which can count them and
    show this look another tensor than the reads got: the forty-third review's f02, f03)."""
    return type(space) in (dict, types.MappingProxyType) and all(type(key) is str for key in space)


def _data_descriptor(attribute) -> bool:
    """Whether a class attribute takes a read before the instance's dict does (its type sets or deletes)."""
    return any("__set__" in TYPE_DICT(base) or "__delete__" in TYPE_DICT(base) for base in TYPE_MRO(type(attribute)))


TYPE_MRO, TYPE_DICT = type.__dict__["__mro__"].__get__, type.__dict__["__dict__"].__get__
OBJECT_GET = object.__getattribute__  # "__dict__" through CPython's own descriptor, checked above: the instance's dict


def _fill_value(value) -> float:
    if type(value) is str and value in FILL_VALUES:
        return FILL_VALUES[value]
    if type(value) in (int, float):
        try:
            return float(value)
        except OverflowError:
            pass
    raise ValueError(f"a fill's value is one of {', '.join(FILL_VALUES)} or a number, not {str(value)[:40]!r}")


def _name(value) -> str:
    if type(value) is not str or not SCRIPT_ATTRIBUTE.fullmatch(value):
        raise ValueError(f"{str(value)[:40]!r} is not a name an action may use")
    return value
