"""Headless Chromium for the HTML report's tests and screenshots, offline: find the browser, load a page, and drive
it over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no port, no websocket library).

The session records what a console would show: console errors and warnings (``Runtime.consoleAPICalled``), uncaught
exceptions (``Runtime.exceptionThrown``) and the browser's own errors and warnings, a blocked fetch among them
(``Log.entryAdded``). Every fetch that leaves the machine is refused twice: the page's Content-Security-Policy, and
a host resolver that resolves nothing.

Screenshots of a report for the docs::

    python tests/html/browser_pipe.py report.html docs/report  # docs/report_<figure>.png, one per anchor named
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = ("--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking", "--disable-sync", "--hide-scrollbars",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9", "--mute-audio")


def find_browser() -> str | None:
    """The first Chromium-family browser on ``PATH`` (or ``$KVCLI_CHROMIUM``), else None."""
    named = os.environ.get("KVCLI_CHROMIUM")
    if named:
        return named
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Browser:
    """One headless Chromium and one page (a tab), driven over the DevTools pipe; a context manager.

    Attributes:
        problems: every console error or warning, uncaught exception and browser error or warning so far, one line
            each.
    """

    def __init__(self, binary: str, width: int = 1280, height: int = 900) -> None:
        self.binary, self.width, self.height = binary, width, height
        self.problems: list[str] = []
        self._next = 0
        self._buffer = b""
        self._seen: set[str] = set()  # the events seen since the last navigation

    def __enter__(self) -> Browser:
        self._profile = tempfile.TemporaryDirectory(prefix="kvcli-chromium-")
        to_browser, self._send_fd = os.pipe()
        self._recv_fd, from_browser = os.pipe()

        def pipes() -> None:  # the browser reads commands on fd 3 and answers on fd 4
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self._profile.name}", f"--window-size={self.width},{self.height}",
             "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pipes,
            pass_fds=(3, 4))
        os.close(to_browser)
        os.close(from_browser)
        target = self._call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self._call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self._call("Browser.close")
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._send_fd)
        os.close(self._recv_fd)
        self._profile.cleanup()

    # -- the protocol ----------------------------------------------------------------------------------------------
    def call(self, method: str, **params) -> dict:
        """``method`` on the page's session; its result."""
        return self._call(method, self.session, **params)

    def _call(self, method: str, session: str | None = None, **params) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(60.0)
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self, timeout: float) -> dict:
        """The next message (an event is recorded on its way)."""
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no message from the browser")
            chunk = os.read(self._recv_fd, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        self._record(message)
        return message

    def _record(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method:
            self._seen.add(method)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.problems.append(f"console.{params['type']}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.problems.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
            entry = params["entry"]
            self.problems.append(f"{entry['source']} {entry['level']}: {entry.get('text')} {entry.get('url', '')}")

    # -- the page --------------------------------------------------------------------------------------------------
    def open(self, page: Path, settle: float = 60.0) -> None:
        """Load ``page`` and wait until its figures are drawn (``data-kvcli-drawn`` on ``<html>``: ``"n/n"``), or
        ``settle`` seconds."""
        self._seen.clear()
        self.call("Page.navigate", url=Path(page).resolve().as_uri())
        deadline = time.monotonic() + settle
        while "Page.loadEventFired" not in self._seen:
            self._read(max(0.1, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            drawn = self.evaluate("document.documentElement.getAttribute('data-kvcli-drawn')")
            if drawn and drawn.split("/")[0] == drawn.split("/")[1]:
                break
            if drawn:  # a figure failed: its error is recorded
                break
            time.sleep(0.2)
        time.sleep(0.3)  # events of the last draw (a late warning) reach the pipe

    def evaluate(self, expression: str):
        """``expression``'s value in the page (JSON values; a promise is awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates (CSS pixels of the viewport)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 8) -> None:
        """A left-button drag from one point to another."""
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x0, y=y0, button="left", clickCount=1)
        for k in range(1, steps + 1):
            self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x0 + (x1 - x0) * k / steps,
                      y=y0 + (y1 - y0) * k / steps, button="left", buttons=1)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x1, y=y1, button="left", clickCount=1)

    def screenshot(self, out: Path, selectors: tuple[str, ...] = ()) -> None:
        """A PNG of the whole page, or of the box around the elements ``selectors`` name, into ``out``."""
        if not selectors:
            box = self.evaluate("({x: 0, y: 0, width: document.documentElement.scrollWidth, "
                                "height: document.documentElement.scrollHeight})")
        else:
            box = self.evaluate(f"""(() => {{
              const rs = {json.dumps(list(selectors))}.map((s) => document.querySelector(s).getBoundingClientRect());
              const x = Math.min(...rs.map((r) => r.left)) - 8, y = Math.min(...rs.map((r) => r.top)) - 8;
              return {{x: x + scrollX, y: y + scrollY, width: Math.max(...rs.map((r) => r.right)) - x + 8,
                       height: Math.max(...rs.map((r) => r.bottom)) - y + 8}}; }})()""")
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={**box, "scale": 1})
        Path(out).write_bytes(base64.b64decode(shot["data"]))


#: the screenshots the docs show: file suffix -> the elements it frames (figures by their anchors).
SCREENSHOTS = {"answer": ("header", "#s1 .facts"), "chunk_sizes": ("#s1-hit-ratio", "#s1-savings"),
               "curves": ("#s1-capacity", "#s1-ttl"), "timeline": ("#s1-timeline",)}


def main(argv: list[str]) -> int:
    """``browser_pipe.py REPORT.html PREFIX``: PREFIX_<name>.png of :data:`SCREENSHOTS` (the docs' screenshots);
    exit 1 if the page reported a problem."""
    page, prefix = Path(argv[0]), argv[1]
    binary = find_browser()
    if binary is None:
        print("no Chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 1
    with Browser(binary, width=1240) as browser:
        browser.open(page)
        for name, selector in SCREENSHOTS.items():
            browser.screenshot(Path(f"{prefix}_{name}.png"), selector)
            print(f"{prefix}_{name}.png")
        if browser.problems:
            print("\n".join(browser.problems), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
