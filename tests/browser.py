"""Headless Chromium driven over the DevTools protocol (through --remote-debugging-pipe: JSON
messages ended by a NUL byte on file descriptors 3 and 4), enough to open a page, run JavaScript in it
and in its frames, as a person's browser would show them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self):
        self._profile = tempfile.TemporaryDirectory(prefix="flashbench-chromium-", ignore_cleanup_errors=True)
        to_chromium, self._out = os.pipe()
        self._in, from_chromium = os.pipe()

        def as_fds_3_and_4():
            reads, writes = os.dup(to_chromium), os.dup(from_chromium)  # above 4, then moved there
            os.dup2(reads, 3)
            os.dup2(writes, 4)

        self._proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--window-size=1600,1000", f"--user-data-dir={self._profile.name}", "about:blank"],
            preexec_fn=as_fds_3_and_4, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer, self._id = b"", 0
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=self.session)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe during {method}")
            self._buffer += chunk

    def evaluate(self, expression: str, context: int | None = None):
        """The value of a JavaScript expression in the page (or in the execution context given)."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context is not None:
            params["contextId"] = context
        result = self.send("Runtime.evaluate", params, session=self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, context: int | None = None, timeout: float = 20.0):
        """Poll until `expression` is truthy; its value."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression, context)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout} s")
            time.sleep(0.1)
        return value

    def open(self, url: str) -> None:
        self.send("Page.navigate", {"url": url}, session=self.session)
        self.wait_for("document.readyState === 'complete'")

    def frames(self) -> list[dict]:
        """The page's child frames (iframes) as {id, url}."""
        tree = self.send("Page.getFrameTree", session=self.session)["frameTree"]
        return [child["frame"] for child in tree.get("childFrames", [])]

    def context_of(self, frame_id: str) -> int:
        """An execution context in `frame_id` (its own world: the frame's page is left as it is)."""
        return self.send("Page.createIsolatedWorld", {"frameId": frame_id}, session=self.session)["executionContextId"]

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()
        os.close(self._out)
        os.close(self._in)
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
