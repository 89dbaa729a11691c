"""The HTML report: the step table, each lost check with its named mistake and hint, and pictures.

A mask or attention weights that came back wrong (a failure's `details["grid"]`, see
grader/engine/tolerance.py's `grid`) are drawn as heat maps in inline SVG, expected and got
side by side, with a third map of the entries that differ. No plotting library: the SVG is
written here, every number in it computed here, every text escaped. The same pictures serve
`--format html`, the notebook's `attn_grade.check` and the interview scorecard.

`fragment` is a block to embed (a notebook output, a scorecard section): its CSS is scoped
to `.attn-grade`. `to_html` is a whole page around it that prints on A4.
"""

from __future__ import annotations

import html
import math

from grader.exercise import load_course
from grader.report import DEVICE_NOTE, NO_FS_ISOLATION, _escape, _groups, _mark

CELL = 18  # pixels of one cell of a heat map (a grid has 12 × 12 cells at most: the engine cuts it)
MARK_COLOURS = {"✓": "#17692d", "~": "#8a5a00", "✗": "#a4161a"}
PICTURES_PER_STEP = 2  # a step's first lost checks with a mask or weights are drawn; the rest say the same
DIFFER_TOLERANCE = 2e-3  # the grid's weights are rounded to 3 decimals: a smaller difference is rounding

CSS = """
.attn-grade { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1b1b1b;
  max-width: 100%; overflow-wrap: anywhere; }
.attn-grade h2 { font-size: 1.15rem; margin: 0 0 .4rem; }
.attn-grade h3 { font-size: 1rem; margin: 1rem 0 .3rem; }
.attn-grade .meta { color: #444; margin: .1rem 0; }
.attn-grade .warn { color: #8a5a00; margin: .2rem 0; }
.attn-grade .bad { color: #a4161a; margin: .2rem 0; }
.attn-grade table.steps { border-collapse: collapse; margin: .5rem 0; max-width: 100%; }
.attn-grade table.steps th, .attn-grade table.steps td { border: 1px solid #d0d0d0; padding: .2rem .55rem;
  text-align: left; vertical-align: top; }
.attn-grade table.steps th { background: #f3f3f3; }
.attn-grade table.steps td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.attn-grade table.steps tr.total td { font-weight: 600; }
.attn-grade .check { border-left: 3px solid #a4161a; padding: .1rem 0 .1rem .7rem; margin: .5rem 0; }
.attn-grade .check.rule { border-left-color: #5a0000; }
.attn-grade .mistake { color: #8a5a00; }
.attn-grade .hint { color: #0b5394; }
.attn-grade code { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .92em; }
.attn-grade .pictures { display: flex; flex-wrap: wrap; gap: .4rem 1.2rem; margin: .4rem 0; }
.attn-grade figure { margin: 0; }
.attn-grade figcaption { font-size: .85em; color: #444; }
.attn-grade svg { display: block; max-width: 100%; height: auto; }
.attn-grade .legend { font-size: .85em; color: #444; }
"""

PAGE_CSS = """
body { margin: 2rem auto; max-width: 56rem; padding: 0 1rem; }
@page { size: A4; margin: 1.5cm; }
@media print {
  body { margin: 0; padding: 0; max-width: none; }
  .attn-grade { font-size: 10pt; color: #000; }
  .attn-grade table.steps th { background: none; }
  .attn-grade .check, .attn-grade figure, .attn-grade tr { break-inside: avoid; }
  .attn-grade h3 { break-after: avoid; }
}
"""


def to_html(grade, verbose: bool = False) -> str:
    """A whole page: the report of `grade`, self-contained (inline CSS and SVG), made to print on A4."""
    title = html.escape(f"{grade.title} ({grade.exercise}): {grade.score}/{grade.max_score}")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<title>{title}</title>\n'
            f"<style>{PAGE_CSS}</style>\n</head>\n<body>\n{fragment(grade, verbose=verbose)}\n</body>\n</html>\n")


def fragment(grade, steps: tuple[str, ...] = (), verbose: bool = False, file: str | None = None) -> str:
    """The report as a block of HTML with its own scoped CSS: a notebook output, or a page's body.

    `steps` shows only those steps (a notebook's check of one step), with the whole file's total below;
    `file` names what was graded where the grade's own file is a temporary one (a notebook's cells).
    """
    e = html.escape
    env = grade.environment
    shown = [s for s in grade.steps if not steps or s.id in steps]
    parts = [f"<style>{CSS}</style>", '<div class="attn-grade">',
             f"<h2>{e(grade.title)} ({e(grade.exercise)}): {_score(shown)}</h2>",
             f'<p class="meta">{e(file or grade.file)} · torch {e(str(env.get("torch", "?")))}; '
             f"{e(str(DEVICE_NOTE.get(env.get('device'), env.get('device'))))}</p>"]
    if env.get("fs_isolation") is False:
        parts.append(f'<p class="warn">⚠ {e(NO_FS_ISOLATION)}</p>')
    if env.get("file_error"):
        parts.append(f'<p class="bad">{e(_escape(str(env["file_error"])))}</p>')
    parts.append(step_table(shown, grade if steps else None))
    hints = _hints(grade.exercise)
    for step in shown:
        parts.append(_step_details(step, hints.get(step.id), verbose))
    parts.append("</div>")
    return "\n".join(parts)


def step_table(steps, whole=None) -> str:
    """The step table: a row per step (its mark, id, score and title), the total; under it, with `whole` (the
    grade of which `steps` are a part), the whole file's total."""
    e = html.escape
    rows = []
    for step in steps:
        mark = _mark(step)[0]
        rows.append(f'<tr><td style="color:{MARK_COLOURS[mark]}">{mark}</td><td><code>{e(step.id)}</code></td>'
                    f'<td class="num">{step.score}/{step.max_score}</td><td>{e(step.title)}</td></tr>')
    total = f'<tr class="total"><td></td><td>Total</td><td class="num">{_score(steps)}</td><td></td></tr>'
    if whole is not None:
        total += (f'<tr class="total"><td></td><td>Whole file</td><td class="num">{whole.score}/{whole.max_score}'
                  "</td><td></td></tr>")
    return ('<table class="steps"><thead><tr><th></th><th>Step</th><th>Score</th><th>Title</th></tr></thead>'
            f"<tbody>{''.join(rows)}{total}</tbody></table>")


def _score(steps) -> str:
    return f"{sum(s.score for s in steps)}/{sum(s.max_score for s in steps)}"


def _step_details(step, hint: str | None, verbose: bool) -> str:
    """A step's lost checks, one block per diagnosis (as the text report groups them), with its pictures."""
    e = html.escape
    blocks, drawn = [], 0
    if step.breach:
        blocks.append(f'<div class="check rule"><b>Rule broken, the step earns nothing:</b> '
                      f"{e(_escape(step.breach))}</div>")
    for first, names in _groups(step, verbose):
        if first.points == first.max_points and not verbose:
            continue
        label = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        lines = [f"<div><code>{e(label)}</code> ({e(first.outcome)}): {e(_escape(first.message))}</div>"]
        if first.mistake:
            count = f" ({len(names)} checks)" if len(names) > 1 else ""
            lines.append(f'<div class="mistake">→ likely mistake{count}: {e(_escape(first.mistake))}</div>')
        if drawn < PICTURES_PER_STEP and grid_of(first.details) is not None:
            lines.append(pictures(first.details))
            drawn += 1
        blocks.append(f'<div class="check">{"".join(lines)}</div>')
    if not blocks:
        return ""
    if hint and step.score < step.max_score:
        blocks.append(f'<div class="hint">Hint (the idea): {e(hint)}</div>')
    return f"<h3><code>{e(step.id)}</code> {step.score}/{step.max_score}: {e(step.title)}</h3>" + "".join(blocks)


def _hints(exercise: str) -> dict[str, str]:
    """Each step's first hint (the idea): the next step a learner takes, shown under a lost step."""
    found = load_course().get(exercise)
    return {s.id: s.hints[0] for s in found.steps if s.hints} if found else {}


# -- pictures ---------------------------------------------------------------------------------


def grid_of(details) -> dict | None:
    """A failure's grid ({"expected": rows, "got": rows}) when both sides are matrices fit to draw, else None."""
    found = details.get("grid") if isinstance(details, dict) else None
    if not isinstance(found, dict):
        return None
    sides = found.get("expected"), found.get("got")
    return {"expected": sides[0], "got": sides[1]} if all(_matrix(side) for side in sides) else None


def pictures(details) -> str:
    """Expected and got side by side as heat maps, and the entries that differ; "" without a grid."""
    found = grid_of(details)
    if found is None:
        return ""
    expected, got = found["expected"], found["got"]
    masks = all(isinstance(v, bool) for side in (expected, got) for row in side for v in row)
    kind = "mask" if masks else "weights"
    differ = _differ(expected, got)
    numbers = [v for side in (expected, got) for row in side for v in row
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    low, high = (min(numbers), max(numbers)) if numbers else (0.0, 1.0)
    if masks or (low >= 0 and high <= 1):  # weights: a shade is the weight itself
        low, high, scale = 0.0, 1.0, "white 0 to dark blue 1"
    else:  # any other values: one shade scale for both sides, from the smallest to the largest
        kind, scale = "values", f"white {low:.3g} to dark blue {high:.3g}"
    maps = [heat_map(_scaled(expected, low, high), f"expected {kind}"),
            heat_map(_scaled(got, low, high), f"got {kind}"),
            heat_map(differ, f"differ ({sum(v for row in differ for v in row)} entries)", colour="#c62828")]
    legend = "dark: may attend, light: blocked" if masks else f"shade by value, {scale}; ? not a number"
    return (f'<div class="pictures">{"".join(maps)}</div>'
            f'<div class="legend">A row per query, a column per key ({legend}); at most 12 × 12 shown.</div>')


def heat_map(rows: list[list], caption: str, colour: str = "#0b3d91") -> str:
    """One matrix as an SVG heat map with its caption: bools dark (True) or light, numbers in [0, 1] by shade,
    anything else ("nan", "inf", out of range) hatched red with a "?"."""
    height, width = len(rows), max((len(row) for row in rows), default=0)
    pad = 14  # room for the axis names
    cells = []
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            x, y = pad + j * CELL, pad + i * CELL
            fill, text = _fill(value, colour)
            cells.append(f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{fill}" stroke="#bbb" '
                         f'stroke-width="0.5"><title>[{i}, {j}] = {html.escape(str(value))}</title></rect>')
            if text:
                cells.append(f'<text x="{x + CELL / 2}" y="{y + CELL * 0.7}" font-size="11" text-anchor="middle" '
                             f'fill="#a4161a">{text}</text>')
    w, h = pad + width * CELL + 2, pad + height * CELL + 2
    axes = (f'<text x="{pad}" y="10" font-size="9" fill="#555">key →</text>'
            f'<text x="9" y="{pad}" font-size="9" fill="#555" transform="rotate(90 9 {pad})">query →</text>')
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
           f'aria-label="{html.escape(caption)}">{axes}{"".join(cells)}</svg>')
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>"


def _fill(value, colour: str) -> tuple[str, str]:
    """The colour of a cell, and a mark to draw in it ("" for none)."""
    if isinstance(value, bool):
        return (colour if value else "#f4f4f4"), ""
    if isinstance(value, (int, float)) and math.isfinite(value) and -1e-6 <= value <= 1 + 1e-6:
        level = min(max(float(value), 0.0), 1.0)
        return _blend("#ffffff", colour, level), ""
    return "#ffe0e0", "?"


def _blend(start: str, end: str, level: float) -> str:
    a = [int(start[k:k + 2], 16) for k in (1, 3, 5)]
    b = [int(end[k:k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * level):02x}" for x, y in zip(a, b, strict=True))


def _scaled(rows: list[list], low: float, high: float) -> list[list]:
    """Numbers mapped onto [0, 1] by the shared range (bools and strings as they are)."""
    if (low, high) == (0.0, 1.0):
        return rows
    span = (high - low) or 1.0
    return [[(v - low) / span if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else v
             for v in row] for row in rows]


def _differ(expected: list[list], got: list[list]) -> list[list[bool]]:
    """True where got differs from expected (beyond the grid's rounding), over the larger of the two."""
    height = max(len(expected), len(got))
    width = max(len(row) for side in (expected, got) for row in side)

    def at(side, i, j):
        return side[i][j] if i < len(side) and j < len(side[i]) else None

    def same(a, b) -> bool:
        if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
            return a == b
        return isinstance(b, (int, float)) and abs(a - b) <= DIFFER_TOLERANCE

    return [[not same(at(expected, i, j), at(got, i, j)) for j in range(width)] for i in range(height)]


def _matrix(side) -> bool:
    return (isinstance(side, list) and 0 < len(side) <= 64 and all(isinstance(row, list) and len(row) <= 64
                                                                   for row in side)
            and all(isinstance(v, (bool, int, float, str)) for row in side for v in row))
