"""The headless-browser helpers of the report tests: the skip without a browser, the blank-chart judge."""

from __future__ import annotations

import pytest
from helpers.browser import BROWSER_NAMES, drawn_fraction, find_browser, require_browser


def test_without_a_browser_the_test_is_skipped_with_the_reason(monkeypatch):
    from helpers import browser

    asked: list[str] = []

    def which(name: str) -> None:
        asked.append(name)

    monkeypatch.setattr(browser.shutil, "which", which)
    assert find_browser() is None and asked == list(BROWSER_NAMES)
    with pytest.raises(pytest.skip.Exception, match=r"no Chromium on PATH .*apt-get install --no-install-recommends"):
        require_browser()


def test_the_first_browser_on_path_is_used(monkeypatch):
    from helpers import browser

    monkeypatch.setattr(browser.shutil, "which", lambda name: f"/opt/{name}" if name != "chromium" else None)
    assert require_browser() == "/opt/chromium-browser"


def test_a_single_colour_area_reads_as_blank_and_a_drawn_one_does_not():
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (200, 100), "white")
    assert drawn_fraction(image, (0, 0, 200, 100)) == (1, 0.0)
    ImageDraw.Draw(image).line((0, 0, 199, 99), fill="#4c78a8", width=3)
    ImageDraw.Draw(image).text((120, 10), "iter 1", fill="black")
    colours, drawn = drawn_fraction(image, (0, 0, 200, 100))
    assert colours >= 3 and 0.01 < drawn < 0.2
    assert drawn_fraction(image, (0, 60, 60, 100)) == (1, 0.0)  # a corner the line and the text miss
