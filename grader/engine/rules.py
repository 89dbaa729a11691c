"""The rules of a step, beside its answer: the torch functions it must not call, the tampering that would
hide a call from the worker's record, and a NumPy exercise's torch-free file.

The worker records every torch function a call reaches; the grader reads that record and the
candidate's source (parsed, never run) here. A forbidden call costs the whole step (a breach).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize

from grader.candidate import HIDDEN
from grader.engine.diagnose import FORBIDDEN_CALL
from grader.engine.failure import CheckFailed
from grader.sandbox.recorder import (
    CODE_IN_BACKWARD,
    COMPLEX,
    FOREIGN_MEMORY,
    GRAPH,
    GRAPH_IN_BACKWARD,
    READ_AS_NUMBER,
    STORAGE_BYTES,
)
from grader.source import parse

# What the names the worker's record gives to autograd's use (no torch function's names) mean, in a report
# The record's marks, which name no torch function: no allowed list names them (a forbidden one may)
MARKS = (GRAPH, GRAPH_IN_BACKWARD, CODE_IN_BACKWARD)
MEANING = {GRAPH: "autograd_graph (an autograd graph built by its torch calls)",
           GRAPH_IN_BACKWARD: "autograd inside the backward pass (a graph built, or .backward(), there)",
           READ_AS_NUMBER: "__index__ (a tensor's values read as numbers: a size, a stride, a bound, a mask's count)",
           "__repr__": "__repr__ (a tensor's values as text: printing one reads them into Python)",
           "__str__": "__str__ (a tensor's values as text)", "__format__": "__format__ (a tensor's values as text)",
           STORAGE_BYTES: "storage_bytes (a storage's bytes read in Python: its items, its file, its shared memory)",
           FOREIGN_MEMORY: "foreign_memory (a tensor on memory torch did not allocate: a NumPy array's, a buffer's)",
           COMPLEX: "complex_tensor (a complex tensor: the complex step differentiates numerically, without autograd)"}

# Names of ways to blind the worker's record of torch calls: switching the mode off, or reaching the record
# itself (the mode stack, the worker's frames, the garbage collector's list of every object). A file that
# names one keeps no rule.
# torch's own Python implementations (torch._decomp's softmax, torch._refs') record only their elementwise parts,
# autograd's engine run directly records nothing, and TorchScript runs its calls in C++, where no mode sees them: a
# scan of the file's code (its comments left out), as the rest of this list (a name built at run time passes it)
TAMPERING = ("DisableTorchFunction", "_disable_torch_function", "_pop_mode", "_set_torch_function_mode", "torch.ops.",
             "_get_current_function_mode_stack", "_getframe", "currentframe", "f_locals", "f_back", "get_objects",
             "torch._decomp", "torch._refs", "torch._prims", "_decomp.", "_refs.", "_prims.", "interpreters",
             "interpchannels", "interpqueues", "_execution_engine", "run_backward", "_ImperativeEngine", "_EngineBase",
             "torch.jit", "jit.script", "jit.trace", "jit.load", "import jit", "ScriptFunction", "ScriptModule",
             "CompilationUnit", "parse_ir", "_create_function_from_graph", "_dispatch_call_boxed",
             # a Triton kernel that makes an integer a pointer reaches memory no launch argument names (the
             # thirty-second review's f01: a score matrix made at import, out of the launcher's record)
             "pointer_type", "int_to_ptr",
             # the interpreter's own loads and stores, on any address, from Python (sandbox/kernels.py checks Triton's)
             "libtriton",
             # Python of the file's own run when torch frees an object inside a call (an old .grad replaced), where
             # the record is stashed (the thirty-fifth review's f05 and f06)
             "__del__", "weakref")
# What a Triton kernel may call besides Triton's language and other kernels: Python's, evaluated as constants
# What only the interpreter's blocks have (the NumPy array under a block: `x.handle.data`), and a dunder (a way to
# the file's Python: `tl.core.tensor.__init__.__globals__`): no compiled kernel reaches either (review 50's F3)
INTERPRETER_ONLY = frozenset({"handle"})
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "int", "float", "bool", "abs", "isinstance", "zip",
                             "enumerate", "tuple", "list", "print"})


def check_rules(called, forbidden: tuple[str, ...], source: str, step_source: str = "",
                allowed: tuple[str, ...] | None = None) -> None:
    """The call used none of the step's forbidden torch functions, under any alias, and, where the step names the
    only ones it may call (`allowed`), none but those: a breach costs the step.

    A name matches when it contains a forbidden one, so `_safe_softmax`, `special_softmax`
    and `_softmax.default` (reached through torch.ops) all count as `softmax`; a forbidden name
    written as a call, `item()`, matches that name exactly (`item` would match `__getitem__`).
    An allowed name matches exactly: an overload reached through torch.ops (`narrow.default`) is not its op.
    """
    code = _without_comments(source)
    foreign = foreign_kernel_calls(_with_helpers(code, _without_comments(step_source))) if allowed is not None else []
    if foreign:  # a launcher's step: its kernels, and the Python they name
        raise CheckFailed(f"a Triton kernel reaches {foreign[0]}, which is neither Triton's language nor another "
                          "kernel: compiled, it would not build; interpreted, it runs Python no record sees",
                          FORBIDDEN_CALL, details={"kernel_calls": foreign}, breach=True)
    tampering = [t for t in TAMPERING if (forbidden or allowed is not None) and t in code]
    if tampering:  # hiding a forbidden call in the step costs what making it costs; elsewhere, the rules checks
        step_text = _with_helpers(code, _without_comments(step_source))
        in_step = any(t in step_text for t in tampering)
        raise CheckFailed(f"the file uses {tampering[0]}, which hides torch calls from the rules check", FORBIDDEN_CALL,
                          details={"tampering": tampering[0]}, breach=in_step)
    check_calls(called, forbidden, allowed)


def expect_seen(answer, mistake, what: str = "the check") -> None:
    """A check that reads the record of what a call made (its shapes, its calls) fails where the worker says the
    record may lack some of it: Python ran inside a torch call (a tensor subclass's __torch_function__), out of the
    record's sight (review 61's F4 and F5 expanded mla's latents there)."""
    hidden = sorted(n[len(HIDDEN):] for n in answer.called if n.startswith(HIDDEN))
    if hidden:
        raise CheckFailed(f"the call hid what it created from {what}: {hidden[0]}", mistake, {"hidden": hidden[0]})


def check_calls(called, forbidden: tuple[str, ...], allowed: tuple[str, ...] | None = None) -> None:
    """The calls of one answer: none hidden from the record, none of the step's forbidden functions, none but its
    allowed ones where it names them. Asked of every call a step's checks make (a forbidden call on one edge case's
    inputs only is still a breach)."""
    hidden = sorted(n[len(HIDDEN):] for n in called if n.startswith(HIDDEN))
    if hidden and (forbidden or allowed is not None):  # the worker's record may lack calls: no rule can be kept
        raise CheckFailed(f"the call hid what it did from the rules check: {hidden[0]}", FORBIDDEN_CALL,
                          details={"hidden": hidden[0]}, breach=True)
    exact = {f[:-2] for f in forbidden if f.endswith("()")}
    wanted = {f.lstrip("_") for f in forbidden if not f.endswith("()")}
    used = sorted(n for n in called if n.split(".")[0] in exact or any(f in n.split(".")[0] for f in wanted)
                  or allowed is not None and not n.startswith(HIDDEN) and n not in (*allowed, *MARKS))
    if used:
        said = ", ".join(dict.fromkeys(MEANING.get(n.split(".")[0], n) for n in used))  # each meaning once
        fix = ("it may call only allocations, views and reads of a tensor's layout: do the work in its own code"
               if allowed is not None else "write it with basic tensor ops")
        raise CheckFailed(f"called {said}, which this step must not use: {fix}",
                          FORBIDDEN_CALL, details={"forbidden_calls": used}, breach=True)


def reads_forbidden(forbidden: tuple[str, ...], allowed: tuple[str, ...] | None) -> bool:
    """Whether reading a tensor's values into Python breaks the step's rules: it forbids `__index__()` (the tiled
    steps), or names the only calls it may make (Triton's launchers)."""
    return allowed is not None or f"{READ_AS_NUMBER}()" in forbidden


def foreign_kernel_calls(source: str) -> list[str]:
    """What the file's Triton kernels (@triton.jit functions, at any depth: one defined inside its launcher is a
    kernel too, the fifty-fourth review's F1) call that is not Triton's language, another
    kernel, a builtin evaluated as a constant or a method of one of the kernel's own values, and what they reach that
    only the interpreter has (`INTERPRETER_ONLY`, a dunder): Python of the file's
    (the thirty-fifth review's f01 and f02, score tiles kept in a dict or written by the interpreter's own stores
    from a helper the kernel called). The interpreter runs a kernel's body as Python, so anything goes there; the
    compiler takes only these."""
    tree = parse(source)
    if tree is None:
        return []
    language = {"tl"}  # names bound to triton.language, or to what it holds
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            language |= {a.asname for a in node.names if a.name.startswith("triton.language") and a.asname}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("triton"):
            language |= {a.asname or a.name for a in node.names
                         if (node.module or "").startswith("triton.language") or a.name == "language"}
    kernels = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any("jit" in ast.unparse(d) for d in node.decorator_list)]
    names = {kernel.name for kernel in kernels}
    found = {}  # each once, in the order met: a dict, so that a file of many is read in linear time (review 54's F8)
    for kernel in kernels:
        own = {a.arg for a in (*kernel.args.posonlyargs, *kernel.args.args, *kernel.args.kwonlyargs)}
        own |= {n.id for n in ast.walk(kernel) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for call in (n for n in ast.walk(kernel) if isinstance(n, ast.Call)):
            root = call.func
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):  # a method of a value the kernel made
                root = root.func if isinstance(root, ast.Call) else root.value  # is checked where the value is made
            name = root.id if isinstance(root, ast.Name) else None
            chain = ast.unparse(call.func)
            if isinstance(call.func, ast.Name):
                fine = name in names or name in KERNEL_BUILTINS or name in language
            else:
                fine = (name is None or name in language or name in own or name in KERNEL_BUILTINS
                        or chain.startswith("triton.language."))
            if not fine:
                found.setdefault(chain)
        for attribute in (n for n in ast.walk(kernel) if isinstance(n, ast.Attribute)):
            if attribute.attr in INTERPRETER_ONLY or attribute.attr.startswith("__"):
                found.setdefault(ast.unparse(attribute))
    return list(found)


@functools.lru_cache(maxsize=16)  # every rules check of one file asks for the same text
def _without_comments(source: str) -> str:
    """The file's text with its comments blanked (a comment that names torch._refs runs nothing); as it is where it
    does not tokenize."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, ValueError):
        return source
    lines = source.splitlines(keepends=True)
    for token in reversed([t for t in tokens if t.type == tokenize.COMMENT]):
        (row, start), (_, end) = token.start, token.end
        lines[row - 1] = lines[row - 1][:start] + " " * (end - start) + lines[row - 1][end:]
    return "".join(lines)


@functools.lru_cache(maxsize=16)
def _with_helpers(source: str, step_source: str) -> str:
    """The step's source and that of every top-level definition it names, and those name, and so on."""
    tree = parse(source)
    if tree is None:
        return step_source
    lines = source.splitlines()
    defined = {node.name: "\n".join(lines[min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1:
                                          node.end_lineno])  # its decorators too: @torch.jit.script is one
               for node in tree.body if hasattr(node, "name") and hasattr(node, "decorator_list")}
    texts, frontier, seen = [step_source], [step_source], set()
    while frontier:  # each text's words read once: a search per name and text grew with their product (review 53's F6)
        for name in sorted((set(re.findall(r"\w+", frontier.pop())) & defined.keys()) - seen):
            seen.add(name)
            texts.append(defined[name])
            frontier.append(defined[name])
    return "\n".join(texts)


def expect_no_import(source: str, module: str) -> None:
    """The candidate file does not import `module` (read, never run: the grader parses it)."""
    tree = parse(source)
    if tree is None:
        raise CheckFailed("the file does not parse")
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        if _dynamic_import(node):  # importlib.import_module("torch"), __import__("torch") and the like
            names = [node.args[0].value]
        if any(n == module or n.startswith(module + ".") for n in names):
            raise CheckFailed(f"imports {module} at line {node.lineno}: this exercise must not use it")


IMPORTERS = ("import_module", "__import__", "find_spec", "spec_from_file_location")


def _dynamic_import(node) -> bool:
    """A call of an import function by name with a literal module name: it imports as an import statement does."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    function = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    return function in IMPORTERS and isinstance(node.args[0].value, str)


def no_torch(answer, step: str = "") -> None:
    """A NumPy exercise's call ran no torch (a breach), whichever check made it."""
    if answer.called:
        used = sorted(answer.called)
        more = f" and {len(used) - 5} more" if len(used) > 5 else ""
        raise CheckFailed(f"called torch ({', '.join(used[:5])}{more}): this exercise is NumPy only",
                          FORBIDDEN_CALL, details={"forbidden_calls": used}, breach=True)


def numpy_only(answer, source: str, step: str, steps: tuple[str, ...]) -> None:
    """The rules of a NumPy exercise: the call runs no torch (a breach), the file imports none (a small cost).

    The import is charged to the steps whose code names what it bound (a step that used torch
    costs itself, not its neighbours); an import no step's code names, the habit of a first
    line, costs every step a little, as a rule of the whole file.
    """
    no_torch(answer)
    try:
        expect_no_import(source, "torch")
    except CheckFailed:
        tree = parse(source)  # it parsed in expect_no_import
        users = [s for s in steps if _names_any(tree, s, _bound_by_imports_of(tree, "torch"), steps)]
        if not users or step in users:
            raise


def _bound_by_imports_of(tree: ast.AST, module: str) -> set[str]:
    """The names that the file's imports of `module` (anywhere in it) bind."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == module}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == module and not node.level:
            bound |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Assign) and _dynamic_import(node.value) and \
                node.value.args[0].value.split(".")[0] == module:  # torch = __import__("torch")
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return bound


def _names_any(tree: ast.Module, step: str, names: set[str], steps: tuple[str, ...]) -> bool:
    """Whether the step's definition, or a helper it names (and so on), names any of `names`.

    Other steps are not followed: what they name is theirs (a module that calls `project` is
    not charged for `project`'s code).
    """
    defined = {node.name: node for node in tree.body
               if hasattr(node, "name") and (node.name == step or node.name not in steps)}
    reached, frontier = set(), {step} & defined.keys()
    while frontier:
        reached |= frontier
        named = {n.id for name in frontier for n in ast.walk(defined[name]) if isinstance(n, ast.Name)}
        if named & names:
            return True
        frontier = (named & defined.keys()) - reached
    return False
