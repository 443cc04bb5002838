"""
A real nsqtw nsqd in a child process, for tests whose code blocks (Spark drivers, blocking sockets).

Run as ``python live_nsqd.py '<json NsqdOptions fields>'``: prints ``{"tcp_port", "http_port"}``
on one line once listening, and stops when its stdin closes.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


class LiveNsqd:
    """Handle on the child: ports, HTTP helpers, stop()."""

    def __init__(self, **options: Any) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(options)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.proc.kill()
            raise RuntimeError("nsqd child did not start")
        info = json.loads(line)
        self.tcp_port: int = info["tcp_port"]
        self.http_port: int = info["http_port"]
        self.tcp_address = f"127.0.0.1:{self.tcp_port}"
        self.http_address = f"127.0.0.1:{self.http_port}"

    def http(self, method: str, path: str, body: bytes | None = None) -> bytes:
        req = urllib.request.Request(f"http://{self.http_address}{path}", data=body, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.read()

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        from nsqtw.spark.replay import encode_mpub
        self.http("POST", f"/mpub?topic={topic}&binary=true", encode_mpub(bodies))

    def stats(self, topic: str) -> dict[str, Any]:
        return json.loads(self.http("GET", f"/stats?format=json&topic={topic}"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _main() -> None:
    from twisted.internet import reactor

    from nsqtw.embed import start_nsqd

    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    holder: dict[str, Any] = {}

    def started(handle: Any) -> None:
        holder["h"] = handle
        sys.stdout.write(json.dumps({"tcp_port": handle.tcp_port, "http_port": handle.http_port}) + "\n")
        sys.stdout.flush()

    def failed(f: Any) -> None:
        f.printTraceback()
        reactor.stop()

    def watch_stdin() -> None:
        sys.stdin.read()
        reactor.callFromThread(shutdown)

    def shutdown() -> None:
        h = holder.get("h")
        d = h.stop() if h else None
        if d is not None:
            d.addBoth(lambda _: reactor.stop())
        else:
            reactor.stop()

    start_nsqd(reactor, **options).addCallbacks(started, failed)
    threading.Thread(target=watch_stdin, daemon=True).start()
    reactor.run()


if __name__ == "__main__":
    _main()
