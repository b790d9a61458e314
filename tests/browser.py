"""The `chromium` fixture and a small DevTools client: open a local page as a reader would.

Chromium is driven over `--remote-debugging-pipe` (JSON messages ending in NUL on file
descriptors 3 and 4), so no port is opened and no extra package is needed. Where chromium is
missing and the tests run as root with apt-get (CI, a fresh machine), Debian's `chromium` is
installed once per session; elsewhere the tests that need it skip with the reason, or fail
when MINI_TRAINER_REQUIRE_BROWSER=1 (.ci/run sets it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REQUIRE_ENV = "MINI_TRAINER_REQUIRE_BROWSER"
INSTALL_TIMEOUT_S = 900
"""apt-get install chromium: about 1-3 minutes on a fresh machine (~100 MB of packages)."""
BROWSER_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--mute-audio",
)  # fmt: skip


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def install_chromium() -> str:
    """apt-get install Debian's chromium (update the lists and retry once); why it failed else."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    log = ""
    for attempt in (install, ["apt-get", "update", "-q"], install):
        result = subprocess.run(
            attempt, capture_output=True, text=True, env=env, timeout=INSTALL_TIMEOUT_S
        )
        log += result.stdout[-2000:] + result.stderr[-2000:]
        if attempt is install and result.returncode == 0:
            return ""
    return f"apt-get install chromium failed:\n{log[-3000:]}"


def missing_browser() -> str | None:
    """Why no browser can run here (after installing one where allowed), or None."""
    if find_chromium():
        return None
    if os.name != "posix" or os.geteuid() != 0 or not shutil.which("apt-get"):
        return "chromium is not installed (apt-get install -y chromium; tests install it as root)"
    failure = install_chromium()
    if failure or not find_chromium():
        return failure or "apt-get installed chromium but no chromium command appeared"
    return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium executable, installed with apt-get as root where missing."""
    reason = missing_browser()
    if reason and os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"the browser test cannot run ({REQUIRE_ENV}=1): {reason}")
    if reason:
        pytest.skip(reason)
    return find_chromium()


@dataclass
class PageView:
    """What the browser saw: the value of the page check, and every console or log problem."""

    result: object
    problems: list[str] = field(default_factory=list)


class DevTools:
    """A DevTools protocol session with one page, over the pipe chromium opens on fds 3/4."""

    def __init__(self, browser: str, width: int, height: int, timeout: float = 120):
        self.profile = tempfile.mkdtemp(prefix="mini-trainer-chromium.")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire() -> None:  # in the child: its fd 3 reads our commands, fd 4 takes replies
            reads, writes = os.dup(to_browser_r), os.dup(from_browser_w)  # 3 and 4 not clobbered
            os.dup2(reads, 3)
            os.dup2(writes, 4)
            os.set_inheritable(3, True)  # dup2 onto itself (fd 3 was free) leaves it close-on-exec
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [browser, *BROWSER_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=wire,  # fds 3, 4 inheritable; the rest are not (PEP 446)
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.timeout = timeout
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def _read(self) -> dict:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("chromium sent no DevTools message in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                err = self.process.stderr.read().decode(errors="replace") if self.process else ""
                raise RuntimeError(f"chromium closed its DevTools pipe:\n{err[-3000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def page(self, method: str, **params) -> dict:
        return self.call(method, session=self.session, **params)

    def wait_for(self, event: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for seen in self.events:
                if seen.get("method") == event:
                    return seen
            self.events.append(self._read())
        raise TimeoutError(f"no {event} from chromium within {self.timeout} s")

    def problems(self) -> list[str]:
        """Console errors and warnings, uncaught exceptions and browser log errors so far."""
        found = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning"):
                found.append("console: " + " ".join(str(a.get("value")) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                found.append("exception: " + json.dumps(params["exceptionDetails"])[:500])
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                entry = params["entry"]
                found.append(f"log: {entry['text']} {entry.get('url', '')}".strip())
        return found

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError, TimeoutError):
            self.call("Browser.close")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        self.process.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def view_page(
    browser: str, page: Path, check_js: str, screenshot: Path, width: int = 1280,
    height: int = 2000,
) -> PageView:  # fmt: skip
    """Load `page` (a local file), evaluate `check_js` once it has loaded, save a full-page PNG."""
    tools = DevTools(browser, width, height)
    try:
        for domain in ("Page", "Runtime", "Log"):
            tools.page(f"{domain}.enable")
        tools.page("Page.navigate", url=page.resolve().as_uri())
        tools.wait_for("Page.loadEventFired")
        value = tools.page("Runtime.evaluate", expression=check_js, returnByValue=True)
        if "exceptionDetails" in value:
            raise RuntimeError(f"the page check threw: {value['exceptionDetails']}")
        shot = tools.page("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        return PageView(value["result"].get("value"), tools.problems())
    finally:
        tools.close()
