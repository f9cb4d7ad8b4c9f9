"""The HTML pages in a real browser: headless Chromium (Debian package `chromium`; .ci/run installs it) loads
the fleet page and every run report from a local HTTP server, takes a screenshot of each, and the test
checks that the page rendered without console errors, exceptions or failed requests, and that every image
loaded. Skipped, saying why, when Chromium is absent."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading

import matplotlib.image
import pytest
from browser import Browser, check_page, chromium_binary
from telemetry_samples import FIXTURE_RUN, baseline_run

from toolchain.schemas import SCHEMA_DIR
from toolchain.telemetry.events import read_jsonl
from toolchain.telemetry.fleet import write_fleet

CHROMIUM = chromium_binary()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install "
                                                          "chromium; .ci/run installs it; or set TOOLCHAIN_CHROMIUM)")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serving(directory):
    """A local HTTP server for `directory` in a thread; yields its base URL."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def site(tmp_path):
    """The fleet page over the recorded host run, the Android and iOS example runs and a run with a
    baseline, with every run's report."""
    runs = [(e[0]["run_id"], e) for e in (
        read_jsonl(FIXTURE_RUN), json.loads((SCHEMA_DIR / "examples" / "telemetry_run_android.json").read_text()),
        json.loads((SCHEMA_DIR / "examples" / "telemetry_run_ios.json").read_text()), baseline_run())]
    files = write_fleet(runs, tmp_path / "fleet")
    with serving(tmp_path / "fleet") as base:
        yield base, files


def test_every_page_renders_in_chromium_with_its_images(site, tmp_path):
    base, files = site
    pages = ["index.html"] + [str(p.relative_to(files.html.parent)) for p in files.reports]
    assert len(pages) == 5
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        for i, page in enumerate(pages):
            shot = tmp_path / f"shot{i}.png"
            seen = check_page(browser, f"{base}/{page}", shot)
            assert seen["problems"] == [], (page, seen["problems"])
            assert seen["images"], f"{page} has no image"
            bad = [img for img in seen["images"] if not img[1] or img[2] == 0]
            assert not bad, f"{page}: images that did not load: {bad}"
            assert seen["title"]
            image = matplotlib.image.imread(shot)
            assert image.shape[0] > 300 and image.shape[1] > 300 and image[..., :3].std() > 0.01   # not blank
    finally:
        browser.close()


def test_the_check_sees_a_broken_page(tmp_path):
    """The checks above can fail: a missing image, a console error and an exception are all reported."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "broken.html").write_text(
        "<!doctype html><html><head><title>b</title><link rel='icon' href='data:,'></head><body>"
        "<img src='missing.png'><script>console.error('boom'); undefined_function();</script></body></html>")
    browser = Browser(CHROMIUM, tmp_path / "profile")
    try:
        with serving(tmp_path / "www") as base:
            seen = check_page(browser, f"{base}/broken.html", tmp_path / "broken.png")
    finally:
        browser.close()
    text = " ".join(seen["problems"])
    assert "boom" in text and "exception" in text and "404" in text
    assert seen["images"] == [["missing.png", True, 0]]
