"""A headless Chromium for tests: find it, lay a page out, screenshot it, and judge whether a chart was drawn."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

# names Debian's `chromium` package and Google's builds install on PATH
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
NO_BROWSER = (
    "no Chromium on PATH (looked for {names}): install Debian's package "
    "(apt-get install --no-install-recommends chromium), as .ci/run does"
)
WIDTH = 1280
TIMEOUT_S = 120
# offline and quiet: no first-run UI, no update checks, no network services, no GPU
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)
# appended to a copy of the page: writes where each chart lies (and whether it decoded) into <body data-boxes>;
# a data attribute on <body> changes nothing in the layout
_MEASURE = """<script>
window.addEventListener("load", () => {
  const boxes = [...document.querySelectorAll("figure img")].map((img) => {
    const r = img.getBoundingClientRect();
    return {id: img.closest("figure").id, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height,
            natural: img.naturalWidth, complete: img.complete};
  });
  document.body.dataset.boxes = JSON.stringify(
    {boxes, height: document.documentElement.scrollHeight, width: document.documentElement.scrollWidth});
});
</script>"""


# the same, for the computed style of the elements a list of CSS selectors names, into <body data-styles>
_STYLES = """<script>
window.addEventListener("load", () => {
  const pick = (el) => {
    const s = getComputedStyle(el);
    return {cls: el.className, text: el.textContent, color: s.color, background: s.backgroundColor};
  };
  document.body.dataset.styles = JSON.stringify(
    Object.fromEntries(SELECTORS.map((sel) => [sel, [...document.querySelectorAll(sel)].map(pick)])));
});
</script>"""


def find_browser() -> str | None:
    """Return the path of a Chromium on PATH, or None."""
    return next((path for name in BROWSER_NAMES if (path := shutil.which(name))), None)


def require_browser() -> str:
    """Return the Chromium to use, or skip the calling test saying why (none installed)."""
    browser = find_browser()
    if browser is None:
        pytest.skip(NO_BROWSER.format(names=", ".join(BROWSER_NAMES)))
    return browser


def _run(browser: str, *args: str) -> subprocess.CompletedProcess:
    """Run the browser with a fresh profile folder (removed afterwards) and fail on a non-zero exit."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [browser, *FLAGS, f"--user-data-dir={profile}", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def chart_layout(browser: str, page: Path, work: Path) -> dict:
    """Lay `page` out in the browser and return where its charts are: {"boxes": [...], "height", "width"}.

    A copy of the page with a measuring script is opened (--dump-dom); the page itself stays script-free.
    Each box is {"id" (the figure's), "x", "y", "w", "h" (CSS pixels in the page), "natural" (the decoded
    image's width, 0 when the browser could not decode it), "complete"}.
    """
    probe = work / f"measure-{page.name}"
    probe.write_text(page.read_text().replace("</body>", _MEASURE + "</body>"))
    dom = _run(browser, f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'data-boxes="([^"]*)"', dom)
    assert found, f"the measuring script did not run; the DOM starts {dom[:300]!r}"
    return json.loads(html.unescape(found.group(1)))


def element_styles(browser: str, page: Path, work: Path, selectors: list[str]) -> dict[str, list[dict]]:
    """Lay `page` out and return, per CSS selector, its elements' class, text and computed colour and background.

    Like `chart_layout`, a copy of the page with a script is opened (--dump-dom); colours are the browser's
    computed values ("rgb(r, g, b)").
    """
    probe = work / f"styles-{page.name}"
    script = _STYLES.replace("SELECTORS", json.dumps(selectors))
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = _run(browser, f"--window-size={WIDTH},1000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'data-styles="([^"]*)"', dom)
    assert found, f"the style script did not run; the DOM starts {dom[:300]!r}"
    return json.loads(html.unescape(found.group(1)))


def screenshot(browser: str, page: Path, out: Path, height: int) -> Path:
    """Screenshot `page` at WIDTH x `height` CSS pixels (scale 1) into `out` (PNG) and return `out`."""
    _run(browser, f"--window-size={WIDTH},{height}", f"--screenshot={out}", page.as_uri())
    assert out.is_file(), f"no screenshot written to {out}"
    return out


def drawn_fraction(image, box: tuple[int, int, int, int]) -> tuple[int, float]:
    """Return (number of distinct colours, share of pixels unlike the most common one) inside `box` of a PIL image.

    A blank chart area (a broken image, an empty figure) is one colour: (1, 0.0).
    """
    crop = image.convert("RGB").crop(box)
    counts = crop.getcolors(maxcolors=crop.width * crop.height)
    total = crop.width * crop.height
    top = max(n for n, _ in counts)
    return len(counts), 1.0 - top / total
