"""The HTML report (`--format html`) and the interview scorecard, opened in a real browser: headless Chromium
from the system's packages, driven by playwright's Python package.

Each page is measured in the browser (nothing wider than the window, every table and picture visible with a
size), screenshotted (the screenshots are kept in $ATTN_GRADE_SHOTS when set) and printed to PDF on A4.
Where Chromium or playwright is missing the tests skip, saying what to install; .ci/run installs both and
sets ATTN_GRADE_REQUIRE_BROWSER=1, so in CI they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import time
import zlib
from pathlib import Path

import pytest

from grader.exercise import load_course
from grader.grade import grade
from grader.html import fragment, to_html
from grader.interview import Scorecard, Session
from grader.progress import Progress
from tests.conftest import ROOT
from tests.exercises.masks.variants import BUGGY as MASKS_BUGGY

CHROMIUM = os.environ.get("ATTN_GRADE_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
WIDTHS = (1100, 480)  # a laptop's window and a phone's
WEIGHTS_FLIPPED = """
right_attention = attention


def attention(q, k, v, mask=None, dropout_p=0.0, training=False, generator=None):
    output, weights = right_attention(q, k, v, mask, dropout_p, training, generator)
    return output, weights.flip(-1)
"""
INSTALL = "apt-get install -y chromium (Debian's /usr/bin/chromium) and pip install playwright"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"needs playwright's Python package: {INSTALL}"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"needs Chromium at {CHROMIUM} (or $ATTN_GRADE_CHROMIUM): {INSTALL}"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A fresh headless Chromium (its own profile folder), closed after the module's tests."""
    missing = _missing()
    if missing:
        if os.environ.get("ATTN_GRADE_REQUIRE_BROWSER"):
            pytest.fail(missing)
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def masks_grade(tmp_path_factory, zygote):
    """masks with a top-left causal mask, and attention whose output is right but whose weights are flipped:
    a mask and weights to draw."""
    picked = {v.name: v.code for v in MASKS_BUGGY}
    code = (ROOT / "solutions" / "masks.py").read_text() + picked["causal_top_left"] + WEIGHTS_FLIPPED
    path = tmp_path_factory.mktemp("masks") / "masks.py"
    path.write_text(code)
    return grade(path, "masks", zygote=zygote, device="cpu")


def test_the_html_report_fits_the_window_shows_its_table_and_pictures_and_prints_on_a4(browser, masks_grade,
                                                                                         tmp_path):
    page_path = tmp_path / "report.html"
    page_path.write_text(to_html(masks_grade), encoding="utf-8")
    for width in WIDTHS:
        page = _open(browser, page_path, width)
        _fits(page, width)
        assert page.locator("table.steps").is_visible()
        svgs = page.locator("svg")
        assert svgs.count() >= 6  # expected, got and differ, for the mask and for the weights
        assert _colourful(svgs.first.screenshot())
        _keep(page, f"report-{width}")
        page.close()
    page = _open(browser, page_path, WIDTHS[0])
    _prints_on_a4(page, tmp_path / "report.pdf", max_pages=4)
    page.close()


def test_the_scorecard_fits_the_window_shows_its_tables_and_pictures_and_prints_on_a4(browser, masks_grade,
                                                                                       tmp_path):
    exercise = load_course()["masks"]
    started = float(int(time.time())) - 1800
    session = Session(tmp_path, exercise, "Ada Lovelace", 45, started)
    card = Scorecard.build(session, masks_grade, Progress(tmp_path), started + 1500, "quit", "0" * 64)
    assert card.pictures  # the same pictures as the report
    page_path = tmp_path / "scorecard.html"
    page_path.write_text(card.html(), encoding="utf-8")
    for width in WIDTHS:
        page = _open(browser, page_path, width)
        _fits(page, width)
        assert page.locator("table").first.is_visible()
        assert page.locator("svg").count() >= 3 and _colourful(page.locator("svg").first.screenshot())
        _keep(page, f"scorecard-{width}")
        page.close()
    page = _open(browser, page_path, WIDTHS[0])
    _prints_on_a4(page, tmp_path / "scorecard.pdf", max_pages=5)
    page.close()


def test_a_notebooks_check_output_fits_a_notebooks_column(browser, masks_grade, tmp_path):
    """The block a notebook shows under a check cell (its own scoped style, no page around it) in a
    notebook's output column."""
    page_path = tmp_path / "notebook-output.html"
    page_path.write_text('<!DOCTYPE html><meta charset="utf-8"><body style="margin:8px">'
                         + fragment(masks_grade, steps=("causal_mask",), file="the notebook's cells"), encoding="utf-8")
    page = _open(browser, page_path, 760)
    _fits(page, 760)
    assert page.locator("table.steps").is_visible() and page.locator("svg").count() == 3
    _keep(page, "notebook-check-causal_mask")
    page.close()


def _open(browser, path: Path, width: int):
    page = browser.new_page()
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page


def _fits(page, width: int) -> None:
    """Nothing is wider than the window; every table and picture is shown, with a size, inside it."""
    measured = page.evaluate("""() => {
        const root = document.documentElement;
        const boxes = [...document.querySelectorAll('table, svg')].map(e => {
            const r = e.getBoundingClientRect();
            return {tag: e.tagName, width: r.width, height: r.height, right: r.right,
                    shown: getComputedStyle(e).visibility !== 'hidden' && getComputedStyle(e).display !== 'none'};
        });
        return {scrollWidth: root.scrollWidth, clientWidth: root.clientWidth, boxes};
    }""")
    assert measured["scrollWidth"] <= measured["clientWidth"], (width, measured["scrollWidth"])
    assert measured["boxes"], "no table nor picture on the page"
    for box in measured["boxes"]:
        assert box["shown"] and box["width"] > 0 and box["height"] > 0, (width, box)
        assert box["right"] <= measured["clientWidth"] + 0.5, (width, box)


def _prints_on_a4(page, pdf_path: Path, max_pages: int) -> None:
    """The print style applies, and the page prints on A4 in a few pages."""
    page.emulate_media(media="print")
    assert page.evaluate("getComputedStyle(document.body).maxWidth") == "none"  # the @media print rule
    pdf = page.pdf(format="A4", print_background=True)
    pdf_path.write_bytes(pdf)
    pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf))
    assert 1 <= pages <= max_pages, pages
    sizes = {tuple(float(v) for v in box.split()) for box in re.findall(rb"/MediaBox\s*\[([^\]]+)\]", pdf)}
    assert sizes and all(abs(w - 595.3) < 1.5 and abs(h - 841.9) < 1.5 for _, _, w, h in sizes), sizes  # A4, points
    _keep_file(pdf_path)


def _keep(page, name: str) -> None:
    """A full-page screenshot, kept in $ATTN_GRADE_SHOTS when set (to be looked at), checked not blank."""
    shot = page.screenshot(full_page=True)
    assert _colourful(shot)
    folder = os.environ.get("ATTN_GRADE_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.png").write_bytes(shot)


def _keep_file(path: Path) -> None:
    folder = os.environ.get("ATTN_GRADE_SHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(folder) / path.name)


def _colourful(png: bytes) -> bool:
    """Whether a PNG holds more than one colour (a blank or failed render does not): its pixels decoded
    with zlib, no image library needed."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, data = 8, b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        if kind == b"IDAT":
            data += png[position + 8:position + 8 + length]
        position += 12 + length
    pixels = zlib.decompress(data)
    return len(set(pixels[::7])) > 8  # white, black text and the pictures' shades: many byte values
