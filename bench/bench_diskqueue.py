"""
Micro-benchmark of the disk queue: write and read rates for 200-byte messages.

    PYTHONPATH=. python bench/bench_diskqueue.py [--messages N] [--batch B] [--sync-every S] [--dir D]

Writes N messages in puts of B frames (B=1 is one PUB per put, B=200 an MPUB), then reads
them back in read(B) calls.  fsync runs inline here (no reactor), so with a small
--sync-every the figure includes the fsync cost that a broker would move to its
worker thread.

    PYTHONPATH=. python bench/bench_diskqueue.py --acked --publishers 1 64 [--seconds 3]

measures --sync-every=1 acknowledged publishes: each publisher puts one message and
waits for ``flush_and_sync()`` before the next, under the real reactor with the
threaded SyncWorker (concurrent publishers share fsyncs: group commit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from nsqtw.backend.disk import DiskQueue, SyncWorker  # noqa: E402


def frames(n: int, body: int):
    payload = b"x" * body
    return [struct.pack(">iiqH", 30 + body, 2, 1_700_000_000_000_000_000 + i, 1) + b"%016x" % i + payload
            for i in range(n)]


def run_of(fs):
    size = len(fs[0])
    blob = b"".join(fs)
    return (blob, range(0, len(blob), size), len(blob))


def acked(a) -> None:
    from twisted.internet import defer, reactor, task

    async def one(publishers: int) -> None:
        d = tempfile.mkdtemp(dir=a.dir)
        worker = SyncWorker(reactor)
        worker.startService()
        try:
            q = DiskQueue("bench", d, worker=worker, sync_every=1)
            fr = frames(1, a.body)[0]
            run = (fr, range(0, 1), len(fr))
            stop = time.perf_counter() + a.seconds
            done = [0]

            async def publisher() -> None:
                while time.perf_counter() < stop:
                    q.put(run)
                    await q.flush_and_sync()
                    done[0] += 1

            t0 = time.perf_counter()
            await defer.gatherResults([defer.ensureDeferred(publisher()) for _ in range(publishers)])
            t1 = time.perf_counter()
            await q.close()
            print(f"body={a.body}B sync-every=1 publishers={publishers:<4d} "
                  f"acked {done[0] / (t1 - t0):>10,.0f} msg/s  sync jobs {worker.jobs}")
        finally:
            worker.stopService()
            shutil.rmtree(d)

    async def all_runs() -> None:
        for p in a.publishers:
            await one(p)

    task.react(lambda _r: defer.ensureDeferred(all_runs()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--body", type=int, default=200)
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 200])
    ap.add_argument("--sync-every", type=int, default=2500)
    ap.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--acked", action="store_true")
    ap.add_argument("--publishers", type=int, nargs="*", default=[1, 64])
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    if a.acked:
        return acked(a)
    worker = SyncWorker(None, threaded=False)
    for batch in a.batch:
        d = tempfile.mkdtemp(dir=a.dir)
        try:
            q = DiskQueue("bench", d, worker=worker, sync_every=a.sync_every,
                          max_bytes_per_file=a.max_bytes_per_file)
            fs = frames(batch, a.body)
            runs = [run_of(fs)] * (a.messages // batch)
            n = len(runs) * batch
            t0 = time.perf_counter()
            for r in runs:
                q.put(r)
            t1 = time.perf_counter()
            got = 0
            while got < n:
                for r in q.read(batch):
                    got += len(r[1])
            t2 = time.perf_counter()
            q.close()
            print(f"body={a.body}B batch={batch:<4d} sync-every={a.sync_every:<5d} "
                  f"write {n / (t1 - t0):>10,.0f} msg/s   read {n / (t2 - t1):>10,.0f} msg/s   ({n} msgs)")
        finally:
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
