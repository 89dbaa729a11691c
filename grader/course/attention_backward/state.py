"""FlashAttentionFunction's rule on state: what its forward keeps outside ctx for its backward, read from the file.

The grader runs the stub's runner, one apply and then its backward, so a Function that keeps a call's causal or
block sizes on its class (or in a global, a holder object, a mutable default) is right there and wrong for two
layers applied before one backward pass (blind set 61's b07). A run of that kind needs the worker to build a graph
across two calls; this rule follows, in the file's text, what forward and the functions of the file it calls write
outside ctx to what backward and what it calls read (reviews 79 to 82 widened it; docs/sandbox.md lists the
spellings it does not follow).
"""

import ast
import functools

from grader.engine import parse

MUTATORS = {"update", "append", "extend", "insert", "setdefault", "__setitem__", "add", "put", "put_nowait",
            "appendleft", "copy_", "fill_", "set_"}
KEYED = {"setdefault", "__setitem__"}  # their first argument is a key: one that varies makes a cache, not a state
MUTABLE = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp, ast.Call)


class Scope:
    """What a rule on the file's functions needs to know of it: the Function's class by every name it is bound to,
    the names imports bind (a module is no state), and the functions by name."""

    def __init__(self, tree: ast.Module, cls: str):
        aliases = {n.targets[0].id: n.value.id for n in tree.body if isinstance(n, ast.Assign)
                   and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Name)}
        self.classes = {cls, aliases.get(cls, cls)}  # `FlashAttentionFunction = _Flash` (review 80's F2)
        self.names = self.classes | {"cls"}
        self.modules = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                        if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        self.functions: dict[str, list] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        # the file's own classes, and its module-level objects of them (`_STASH = _Stash()`): a method of theirs that
        # sets its self's or cls's attributes keeps state on that object (review 81's F1)
        self.file_classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and n.name not in self.classes}
        self.objects = {t.id: n.value.func.id for n in tree.body if isinstance(n, ast.Assign)
                        and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                        and n.value.func.id in self.file_classes for t in n.targets if isinstance(t, ast.Name)}

    def method_keeps(self, owner: str, method: str) -> bool:
        """Whether `owner` (a class of the file's, or an object of one) has a method `method` that sets an attribute
        of its first argument (self or cls), or writes through one."""
        cls = self.file_classes.get(self.objects.get(owner, owner))
        for function in (m for m in (cls.body if cls else ()) if isinstance(m, ast.FunctionDef) and m.name == method):
            first = (function.args.posonlyargs + function.args.args)[:1]
            me = first[0].arg if first else None
            for n in ast.walk(function) if me else ():
                targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
                if any(isinstance(t, (ast.Attribute, ast.Subscript)) and _base_name(t) == me
                       for top in targets for t in ast.walk(top)):
                    return True
                # self.state.update(flags), setattr(self, name, value): review 82's F1
                if isinstance(n, ast.Call) and (
                        isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS and _base_name(n.func.value) == me
                        or isinstance(n.func, ast.Name) and n.func.id == "setattr" and n.args
                        and _base_name(n.args[0]) == me):
                    return True
        return False

    def class_like(self, node) -> bool:
        """Whether `node` names the Function's class: a name of it, cls, type(...) or ....__class__."""
        return (isinstance(node, ast.Name) and node.id in self.names
                or isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type"
                or isinstance(node, ast.Attribute) and node.attr == "__class__")


def _mentions_ctx(node) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "ctx" for n in ast.walk(node))


def _base_name(node):
    """The name a chain of subscripts and attributes starts from (_STATE in _STATE['a'][0]), or None."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _fixed_key(node) -> bool:
    """Whether a subscript's key is the same at every call: a constant, a slice, or a tuple of them."""
    if isinstance(node, ast.Tuple):
        return all(map(_fixed_key, node.elts))
    return isinstance(node, (ast.Constant, ast.Slice))


def _names_of(function: ast.FunctionDef) -> tuple[set[str], set[str]]:
    """Its own names (parameters and what it binds, but globals) and its parameters whose default is a mutable object
    made once (`_kept=[]`: shared by every call, review 80's F2)."""
    arguments = function.args
    shared = {name for n in ast.walk(function) if isinstance(n, ast.Global) for name in n.names}
    positional = [*arguments.posonlyargs, *arguments.args]
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(arguments.defaults):], arguments.defaults,
                        strict=True))
    defaults.update({a.arg: d for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d})
    kept = {name for name, default in defaults.items() if isinstance(default, MUTABLE)}
    own = {a.arg for a in (*positional, *arguments.kwonlyargs)} | {a.arg for a in (arguments.vararg, arguments.kwarg)
                                                                    if a}
    own |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return own - shared - kept, kept


def _reached(roots, scope: Scope) -> list:
    """`roots` and every function of the file they call, by its name or as a method of the class, transitively."""
    seen, todo = [], list(roots)
    while todo:
        function = todo.pop()
        if any(function is f for f in seen):
            continue
        seen.append(function)
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            f = call.func
            name = (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute)
                    and scope.class_like(f.value) else None)
            todo.extend(scope.functions.get(name, ()))
    return seen


def _shared_writes(function: ast.FunctionDef, scope: Scope) -> dict:
    """What `function` writes outside ctx and its own names, each with its line: ("attr", name) on the class, and
    ("name", name) of a name of the file's (assigned, or an attribute of it set, or written through a subscript of a
    fixed key, or changed by a method) or of a mutable default of its own. A key that varies (a cache of masks by
    position) or mentions ctx (a dict of calls by id(ctx)) keeps one call's own; an import is no state."""
    own, kept = _names_of(function)
    found = {}
    # a write under a test of the same name is a cache filled once (`if _ARANGE is None: _ARANGE = ...`), a count
    # of calls no state (`CALLS["forward"] += 1`): review 81's F2
    guarded = {(id(n), name.id) for test in ast.walk(function) if isinstance(test, (ast.If, ast.IfExp))
               for name in ast.walk(test.test) if isinstance(name, ast.Name)
               for branch in (test.body if isinstance(test.body, list) else [test.body]) for n in ast.walk(branch)}

    def shared(name) -> tuple | None:
        if name in kept:
            return ("name", f"{function.name}.{name}")
        return None if not name or name in own or name in scope.modules or name == "ctx" else ("name", name)

    for node in ast.walk(function):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        if isinstance(node, ast.AugAssign) and isinstance(node.value, ast.Constant):
            targets = []  # a count
        for target in (t for top in targets for t in ast.walk(top)
                       if isinstance(t, (ast.Attribute, ast.Subscript, ast.Name))):
            if (id(node), _base_name(target)) in guarded:
                continue
            key = None
            if isinstance(target, ast.Attribute):
                key = ("attr", target.attr) if scope.class_like(target.value) else shared(_base_name(target.value))
            elif isinstance(target, ast.Subscript) and _fixed_key(target.slice) and not _mentions_ctx(target.slice):
                key = shared(_base_name(target.value))
            elif isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                key = shared(target.id) if target.id not in own else None
            if key:
                found[key] = node.lineno
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATORS and not any(map(_mentions_ctx, node.args[:1])) \
                and not (func.attr in KEYED and node.args and not _fixed_key(node.args[0])):
            key = shared(_base_name(func.value))
            if key:
                found[key] = node.lineno
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id not in own \
                and scope.method_keeps(func.value.id, func.attr):  # _STASH.keep(...), _Flags.remember(...)
            found[("name", func.value.id)] = node.lineno
        if isinstance(func, ast.Name) and func.id == "setattr" and node.args:
            attribute = node.args[1] if len(node.args) > 1 else None
            named = attribute.value if isinstance(attribute, ast.Constant) and isinstance(attribute.value, str) else "*"
            key = ("attr", named) if scope.class_like(node.args[0]) else shared(_base_name(node.args[0]))
            if key:
                found[key] = node.lineno
    return found


def _shared_reads(function: ast.FunctionDef, scope: Scope) -> set:
    own, kept = _names_of(function)
    reads = set()
    # the dict a plain assignment writes into (`_TIMINGS["backward"] = t`) is not read there: review 82's F3
    written = {id(t.value) for n in ast.walk(function) if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)}
    for node in ast.walk(function):
        if id(node) in written:
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and scope.class_like(node.value):
            reads.add(("attr", node.attr))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            reads.add(("name", f"{function.name}.{node.id}") if node.id in kept else ("name", node.id)
                      if node.id not in own else None)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and node.args and scope.class_like(node.args[0])):  # getattr(FlashAttentionFunction, "causal")
            attribute = node.args[1] if len(node.args) > 1 else None
            reads.add(("attr", attribute.value if isinstance(attribute, ast.Constant) else "*"))
    return reads - {None}


@functools.lru_cache(maxsize=4)
def kept_outside_ctx(source: str, cls: str = "FlashAttentionFunction") -> str:
    """Where the Function's forward keeps what its backward reads outside ctx ('' if nowhere): on its class
    (FlashAttentionFunction.causal = causal, cls.x, setattr), or in an object of the file's (a global, a dict or a
    list written or changed, a namespace's or a thread-local's attribute, a mutable default), in forward or any
    function of the file it calls, read back by backward or what it calls. Right while each apply is followed by its
    own backward, as the given runner does; wrong where two layers apply it before one backward pass: every node then
    reads the last forward's (blind set 61's b07). A call counter backward never reads, a cache keyed by what it holds
    or by ctx, is no such state (reviews 79 and 80)."""
    tree = parse(source)
    if tree is None:
        return ""
    scope = Scope(tree, cls)
    body = [m for c in tree.body if isinstance(c, ast.ClassDef) and c.name in scope.classes for m in c.body]
    methods = {m.name: [m] for m in body if isinstance(m, ast.FunctionDef)}
    for bound in (m for m in body if isinstance(m, ast.Assign) and len(m.targets) == 1
                  and isinstance(m.targets[0], ast.Name)):  # forward = staticmethod(_forward): review 82's F2
        value = bound.value.args[0] if isinstance(bound.value, ast.Call) and bound.value.args else bound.value
        if isinstance(value, ast.Name):
            methods[bound.targets[0].id] = scope.functions.get(value.id, [])
    forward = _reached([f for name in ("forward", "setup_context") for f in methods.get(name, [])], scope)
    backward = _reached(methods.get("backward", []), scope)
    reads = set().union(*(_shared_reads(f, scope) for f in backward)) if backward else set()
    attributes = {name for kind, name in reads if kind == "attr"}
    for function in forward:
        for (kind, name), line in _shared_writes(function, scope).items():
            if (kind, name) in reads or kind == "attr" and attributes and ("*" in attributes or name == "*"):
                where = f"{cls}.{name}" if kind == "attr" else name
                return f"{function.name} writes {where} (line {line}), which backward reads"
    return ""
