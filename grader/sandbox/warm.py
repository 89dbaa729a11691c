"""The meta device's first use, paid once in the zygote, and kept small.

The device checks run on the meta device where there is no GPU. Its first use imports what torch's Python meta
kernels import lazily: torch._dynamo (over a second, only to mark functions that torch.compile should not trace)
and torch.fx.experimental.symbolic_shapes with sympy (0.2 s, only to ask questions of plain bools and ints that
symbolic sizes would need sympy for). The grader waits for it, so both are avoided:

- `skip_lazy_dynamo_import` hands each of torch's wrapped meta kernels its function as is (nothing is compiled);
- `defer` puts a stand-in module in sys.modules for sympy and for symbolic_shapes, which answers the questions
  torch's meta kernels ask of plain values (`torch._check` asks `expect_true(cond)` of a bool; the elementwise
  type promotion asks `isinstance(x, sympy.Basic)`, false for anything while sympy is not loaded). Asked anything
  else, or given anything but a plain value, the stand-in loads the real module's code into itself (the same
  module object, at the same place in sys.modules) while the zygote warms up, and is refused once it has
  (`seal`): in a child, under the guard and the allowlist root, the import could not run, and a module half
  loaded would be worse. The refusal says the meta device cannot run the code, so a device check skips it, as
  it skips what has no meta kernel; and sympy, imported by a candidate's own code, is not there.
"""

import importlib.machinery
import importlib.util
import operator
import sys
import types

PLAIN = (int, float, bool)
PLAIN_INT = (int, bool)
SEALED = []  # once it holds True, no stand-in loads its module (`seal`)


class Deferred(types.ModuleType):
    """A module whose real code runs only when something asks it more than its `answers` know."""

    def __getattr__(self, attr: str):
        # Python probes a module's __path__ for `from module import name`: a module that is no package has none.
        if attr.startswith("__") and (attr != "__path__" or not self.__dict__["_package"]):
            raise AttributeError(attr)
        if self.__dict__["_loaded"]:  # asked while its code runs: as a module partly loaded answers
            raise AttributeError(f"partially initialized module '{self.__name__}' has no attribute '{attr}'")
        return getattr(self._load(), attr)

    def _load(self) -> "Deferred":
        if self.__dict__["_loaded"]:
            return self
        if SEALED:
            raise ImportError(f"{self.__name__} is not loaded in the grader's sandbox (torch needs it for symbolic "
                              "sizes, which no check uses; code that needs it on the Meta device is not checked "
                              "there)")
        self.__dict__["_loaded"] = True
        for answer in self.__dict__.pop("_answers"):  # the stand-ins go before the real code runs
            del self.__dict__[answer]
        name = self.__name__
        parent, _, _ = name.rpartition(".")
        path = sys.modules[parent].__path__ if parent else None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        self.__spec__, self.__loader__, self.__file__ = spec, spec.loader, spec.origin
        self.__package__ = name if self.__dict__["_package"] else parent
        if spec.submodule_search_locations is not None:
            self.__path__ = spec.submodule_search_locations
        spec.loader.exec_module(self)  # its code, run in this module's namespace: the stand-ins give way
        if parent:
            setattr(sys.modules[parent], name.rpartition(".")[2], self)
        return self


def defer(name: str, package: bool = False, **answers) -> Deferred:
    module = Deferred(name)
    module.__dict__.update(answers, _package=package, _loaded=False, _answers=tuple(answers))
    sys.modules[name] = module
    return module


def _symbolic_shapes(name: str) -> Deferred:
    """symbolic_shapes' questions, for plain values: each answers as the real function does for them."""

    def real():
        return sys.modules[name]._load()

    def same(function_name, kinds):  # a plain value is its own answer (a bool its guard, an int its hint)
        def answer(a, *rest):
            return a if type(a) in kinds else getattr(real(), function_name)(a, *rest)
        answer.__name__ = function_name
        return answer

    def has_guarding_hint(a):
        return True if type(a) in PLAIN else real().has_guarding_hint(a)

    def has_free_symbols(val):
        plain = type(val) in PLAIN or type(val) in (tuple, list) and all(type(v) in PLAIN for v in val)
        return False if plain else real().has_free_symbols(val)

    def is_nested_int(s):
        return False if type(s) in PLAIN else real().is_nested_int(s)

    def sym_eq(x, y):
        if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):  # torch.Size too
            return len(x) == len(y) and all(sym_eq(a, b) for a, b in zip(x, y, strict=True))
        if type(x) in PLAIN_INT and type(y) in PLAIN_INT:
            return x == y
        return real().sym_eq(x, y)

    def joined(function_name, op):
        def answer(x, *others):
            if all(type(v) is bool for v in (x, *others)):
                for y in others:
                    x = op(x, y)
                return x
            return getattr(real(), function_name)(x, *others)
        answer.__name__ = function_name
        return answer

    answers = {n: same(n, (bool,)) for n in ("expect_true", "guard_bool", "guard_or_false", "guard_or_true",
                                             "guard_size_oblivious", "statically_known_true")}
    answers.update({n: same(n, (int,)) for n in ("guard_int", "optimization_hint")})
    answers.update(guarding_hint_or_throw=same("guarding_hint_or_throw", PLAIN_INT),
                   has_guarding_hint=has_guarding_hint, has_free_symbols=has_free_symbols,
                   is_nested_int=is_nested_int, sym_eq=sym_eq, sym_and=joined("sym_and", operator.and_),
                   sym_or=joined("sym_or", operator.or_))
    return defer(name, **answers)


def seal() -> None:
    """From now on, a stand-in asked what it cannot answer raises (the module docstring says why)."""
    SEALED.append(True)


def stand_ins() -> None:
    """The stand-ins for sympy and symbolic_shapes, which torch's Python code imports lazily: its meta kernels, and
    torch.broadcast_shapes on any device (`torch._refs._broadcast_shapes`), whose import in a child, under the
    guard, was refused (a correct file of the thirty-first blind set lost 20 points, with --device cpu)."""
    if "sympy" not in sys.modules:
        defer("sympy", package=True, Basic=type("Basic", (), {}))  # nothing is a sympy.Basic before sympy loads
    if "torch.fx.experimental.symbolic_shapes" not in sys.modules:
        _symbolic_shapes("torch.fx.experimental.symbolic_shapes")


def warm_meta(torch) -> None:
    """Pay for the meta device's first use now, while the grader is still importing torch."""
    stand_ins()
    skip_lazy_dynamo_import(torch)
    x = torch.ones(2, 2, device="meta")
    (x @ x.T).exp().amax(-1, keepdim=True).masked_fill(x[:, :1] > 0, 0.0)


def skip_lazy_dynamo_import(torch) -> None:
    """Spare the meta device's first elementwise op an import of torch._dynamo (over a second).

    torch wraps its Python meta kernels in torch._disable_dynamo, which imports
    torch._dynamo on a function's first call only to wrap it so torch.compile will not
    trace it. Nothing is compiled here, so each wrapper gets its function as is.
    """
    import gc

    inner = torch._compile._disable_dynamo(warm_meta).__code__
    slot = inner.co_freevars.index("fn")
    for obj in gc.get_objects():
        if type(obj) is type(warm_meta) and obj.__code__ is inner:
            fn = obj.__closure__[slot].cell_contents
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = fn
