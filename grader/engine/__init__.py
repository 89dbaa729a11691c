"""The check engine: what a spec may use to declare an exercise's checks, and the runner that grades them.

A spec (grader/course/NAME/spec.py) imports from here and from its own reference, nothing else
(tests/test_course.py enforces it). The modules behind this surface:
  spec.py      the vocabulary: Spec, StepSpec, Check, Mistake, Raises, Call, and the check kinds
  runner.py    pytest collection of a spec, one Run per check, and the diagnosis of a failure
  script.py    scripts: actions run in order on a candidate's objects in one worker (build, call, get, fill)
  stock.py     the property checks module steps share: linear_layers, raises_value_error, gradients, end_to_end
  tolerance.py the tolerance policy and the comparisons: an answer's form and values against the reference's
  rules.py     the forbidden-call rules, the tampering that hides a call, a NumPy exercise's torch-free file
  inputs.py    a check's seeded inputs (Gen)
  failure.py   CheckFailed, how every check fails
  diagnose.py  the general mistakes, named for any step
  search.py    the generic wrong answers a failed check's answer is compared with: arguments swapped, ignored,
               one off, an input transposed, a tuple reordered, float64 computed in float32
  tiles.py     tiles_only: what a tiled step's torch calls may create (nothing larger than a tile of scores)
  attention.py attention written out plainly, with knobs that make its wrong versions (`attention.attend`)

Glossary (one word per concept, in the code and in its messages):
  answer     what the candidate's code returned for one call, decoded from the worker's bytes
  reference  the model answer's result for the same inputs (solutions/NAME.py, run in the grader)
  oracle     the grader answering a composite's questions about the steps it calls (`StepSpec.answered`)
             with the reference's results, so a composite is graded on its own wiring (grader/oracle.py,
             beside the process layer whose questions it answers)
  stand-in   a substitute object the worker builds from the exercise's folder (stand_ins.py) in place
             of a candidate's class that lost points, e.g. kv_cache's KVCache
  mistake    a named, catalogued wrong answer or exception (`Mistake`), with its message and how it is recognised
  variant    a function computing a mistake's wrong answer from a check's inputs
"""

from grader.arrays import as_tensor_tree
from grader.candidate import CandidateError, Seeded
from grader.engine import attention, diagnose, search
from grader.engine.diagnose import RESULT_ON_CPU
from grader.engine.failure import CheckFailed, exactly
from grader.engine.rules import (
    CODE_IN_BACKWARD,
    GRAPH,
    check_calls,
    check_rules,
    expect_no_import,
    expect_seen,
    no_torch,
    numpy_only,
    parse,
)
from grader.engine.runner import Run, matches_any, source_of
from grader.engine.script import (
    Script,
    build,
    call,
    chunks,
    expect_chunks,
    expect_count,
    expect_each,
    expect_joined,
    expect_result,
    fill,
    get,
    type_name,
)
from grader.engine.spec import (
    ALWAYS,
    ON_META,
    Call,
    Check,
    Mistake,
    Probe,
    Raises,
    Spec,
    StepSpec,
    device,
    prop,
    rules,
    shape,
    values,
)
from grader.engine.stock import defaults, end_to_end, gradients, linear_layers, raises_value_error
from grader.engine.tiles import TILE_POSITIONS, TileSizes, judge_tiles, tiles_only
from grader.engine.tolerance import EXACT_FLOAT64, HALF_TYPES, Tolerance, expect_close, expect_form, grid, upcast
from grader.sandbox.recorder import FUNCTION_NODES, NODE_KIND
from grader.wire import device_of

__all__ = [
    "ALWAYS", "ON_META", "HALF_TYPES", "RESULT_ON_CPU", "Call", "CandidateError", "Check", "CheckFailed", "Mistake",
    "Probe", "Raises", "EXACT_FLOAT64",
    "Run", "Seeded", "Spec", "StepSpec", "Tolerance", "as_tensor_tree", "attention", "check_calls", "check_rules",
    "defaults",
    "device", "device_of", "diagnose", "end_to_end", "expect_close", "expect_form", "expect_no_import", "expect_seen",
    "gradients", "grid", "linear_layers", "search",
    "matches_any", "no_torch", "numpy_only", "prop", "raises_value_error", "rules", "shape", "source_of", "upcast",
    "values",
    "TILE_POSITIONS", "TileSizes", "judge_tiles", "tiles_only", "CODE_IN_BACKWARD", "GRAPH", "parse", "exactly",
    "FUNCTION_NODES", "NODE_KIND",
    "Script", "build", "call", "chunks", "expect_chunks", "expect_count", "expect_each",
    "expect_joined", "expect_result", "fill",
    "get", "type_name",
]
