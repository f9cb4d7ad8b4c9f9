"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
ending in NUL on fds 3 and 4), stdlib only: load a page, collect console errors, exceptions and failed
requests, check the images, take a screenshot."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-pipe"]


def chromium_binary() -> str | None:
    return os.environ.get("TOOLCHAIN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, binary: str, profile: Path, *, timeout_s: float = 30.0):
        self.timeout_s = timeout_s
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def fds() -> None:     # the child's fd 3 reads our commands, fd 4 writes its answers
            a, b = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.log = profile.parent / f"{profile.name}.stderr.txt"
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         preexec_fn=fds, close_fds=False)
        os.close(to_r)
        os.close(from_w)
        self._id = 0
        self._answers: dict[int, dict] = {}
        self.events: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = os.read(self._from_r, 1 << 16)
            if not chunk:
                with self._cond:
                    self._answers[-1] = {"closed": True}
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cond:
                        self._answers[msg["id"]] = msg
                        self._cond.notify_all()
                else:
                    self.events.put(msg)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            while self._id not in self._answers:
                if -1 in self._answers or not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(f"no answer to {method} from Chromium (log: {self.log})")
            answer = self._answers.pop(self._id)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_w)


def check_page(browser: Browser, url: str, screenshot: Path) -> dict:
    """Load `url` in a new tab; return {"problems": [console errors, exceptions, failed requests],
    "images": [[src, complete, naturalWidth]], "title"}; the screenshot is written to `screenshot`."""
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    session = browser.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable", session)
    while not browser.events.empty():
        browser.events.get_nowait()
    browser.call("Page.navigate", session, url=url)
    problems, loaded = [], False
    deadline = time.monotonic() + browser.timeout_s
    while not loaded:
        try:
            ev = browser.events.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"{url} did not finish loading") from None
        if ev.get("sessionId") != session:
            continue
        method, p = ev["method"], ev.get("params", {})
        if method == "Page.loadEventFired":
            loaded = True
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            problems.append(f"console.{p['type']}: {[a.get('value', a.get('description')) for a in p['args']]}")
        elif method == "Runtime.exceptionThrown":
            problems.append(f"exception: {p['exceptionDetails'].get('text')}")
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            problems.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Network.loadingFailed":
            problems.append(f"request failed: {p.get('errorText')}")
        elif method == "Network.responseReceived" and p["response"]["status"] >= 400:
            problems.append(f"HTTP {p['response']['status']}: {p['response']['url']}")
    js = "JSON.stringify(Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth]))"
    images = json.loads(browser.call("Runtime.evaluate", session, expression=js, returnByValue=True)["result"]["value"])
    title = browser.call("Runtime.evaluate", session, expression="document.title",
                         returnByValue=True)["result"]["value"]
    shot = browser.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
    screenshot.write_bytes(base64.b64decode(shot["data"]))
    browser.call("Target.closeTarget", targetId=target)
    return {"problems": problems, "images": images, "title": title}
