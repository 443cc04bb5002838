#!/usr/bin/env python
"""
How long a clean stop takes with many topics.

Writes an ``nsqd.dat`` naming ``--topics`` topics with one channel each into a fresh data
path, starts the drop-in nsqd (``python -m nsqtw.cli``) on it, waits until it listens,
optionally publishes ``--messages`` messages to the first ``--busy`` topics, then sends
SIGTERM and prints the seconds until the process exited (and its exit status).  Nothing is
asserted: a stop's cost should follow what must be written, so 10,000 empty topics should
stop in a few seconds, well inside Kubernetes' default 30 s grace period.

    python bench/bench_stop.py                    # 10,000 empty topics
    python bench/bench_stop.py --topics 5000 --busy 100 --messages 1000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=10000)
    ap.add_argument("--busy", type=int, default=0, help="topics that get messages before the stop")
    ap.add_argument("--messages", type=int, default=100, help="messages per busy topic")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="nsqtw-bench-stop-")
    doc = {"topics": [{"channels": [{"name": "c", "paused": False}], "name": f"t{i:05d}", "paused": False}
                      for i in range(args.topics)], "version": "1.3.0"}
    with open(os.path.join(data, "nsqd.dat"), "w") as f:
        json.dump(doc, f)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "nsqtw.cli", "--tcp-address=127.0.0.1:0", "--http-address=",
                             "--https-address=", f"--data-path={data}", "--log-level=warn"],
                            stderr=subprocess.PIPE, text=True)
    port = 0
    assert proc.stderr is not None
    for line in proc.stderr:
        if "TCP: listening on" in line:
            port = int(line.rsplit(":", 1)[1])
            break
    started = time.perf_counter() - t0
    if args.busy:
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"  V2")
        for i in range(args.busy):
            bodies = [b"x" * 100] * args.messages
            payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
            s.sendall(b"MPUB t%05d\n" % i + struct.pack(">i", len(payload)) + payload)
            got = b""
            while not got.endswith(b"OK"):
                got += s.recv(64)
        s.close()
    t1 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(300)
    stopped = time.perf_counter() - t1
    print(f"{args.topics} topics with a channel each ({args.busy} with {args.messages} messages): "
          f"ready in {started:.1f} s, SIGTERM to exit {stopped:.2f} s (exit {rc})")
    subprocess.run(["rm", "-rf", data])


if __name__ == "__main__":
    main()
