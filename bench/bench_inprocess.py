#!/usr/bin/env python
"""
In-process bus vs loopback TCP, with the client library and an embedded nsqd in one reactor.

For each transport: publish N messages of S bytes with pipelined MPUB batches of B (a window of
W batches in flight), then consume them with max_in_flight R and FIN each; then N single PUBs
pipelined (W in flight), then a ping-pong of sequential PUBs (one in flight: the round trip).
Prints msgs/s for each phase and the in-process/TCP ratio.

    python bench/bench_inprocess.py                  # defaults: -n 100000 -s 100 -b 100 -r 200
    python bench/bench_inprocess.py -n 20000 --single 5000 --serial 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from twisted.internet import defer, task

sys.path.insert(0, ".")

from nsqtw.client import Config, Consumer, Producer  # noqa: E402
from nsqtw.client.inprocess import register  # noqa: E402
from nsqtw.embed import start_nsqd  # noqa: E402


async def window(calls: list[Any], width: int) -> None:
    """Run the zero-argument callables returning Deferreds, at most ``width`` at once."""
    it = iter(calls)

    async def worker() -> None:
        for call in it:
            await call()

    await defer.gatherResults([defer.ensureDeferred(worker()) for _ in range(width)], consumeErrors=True)


async def run(address: Any, topic: str, args: argparse.Namespace) -> dict[str, float]:
    body = b"x" * args.size
    producer = Producer(address)
    await producer.ping()
    batches = [[body] * args.batch for _ in range(args.n // args.batch)]
    total = len(batches) * args.batch
    t0 = time.perf_counter()
    await window([lambda b=b: producer.multi_publish(topic, b) for b in batches], args.window)
    t_pub = time.perf_counter() - t0

    done = defer.Deferred()
    seen = [0]

    def handle(message: Any) -> None:
        seen[0] += 1
        if seen[0] == total:
            done.callback(None)

    consumer = Consumer(topic, "bench", handle, Config(max_in_flight=args.rdy))
    t0 = time.perf_counter()
    await consumer.connect_to_nsqd(address)
    await done
    t_sub = time.perf_counter() - t0
    await consumer.stop()

    t0 = time.perf_counter()
    await window([lambda: producer.publish(topic + "-single", body)] * args.single, args.window)
    t_single = time.perf_counter() - t0

    t0 = time.perf_counter()
    for _ in range(args.serial):
        await producer.publish(topic + "-serial", body)
    t_serial = time.perf_counter() - t0
    await producer.stop()
    return {
        "mpub msgs/s": total / t_pub,
        "consume msgs/s": total / t_sub,
        "pub (pipelined) msgs/s": args.single / t_single,
        "pub round trips/s": args.serial / t_serial,
    }


async def main(reactor: Any, args: argparse.Namespace) -> None:
    nsqd = await start_nsqd(mem_queue_size=max(args.n, 10000) * 2)
    undo = register(nsqd, "bench")
    try:
        results = {}
        for label, address in (("loopback TCP", nsqd.tcp_address), ("in-process", "inprocess:bench")):
            results[label] = await run(address, "bench_" + label.split()[0].replace("-", "_"), args)
        print(f"{args.n} messages of {args.size} B, MPUB batches of {args.batch}, window {args.window}, "
              f"max_in_flight {args.rdy}; {args.single} pipelined PUBs; {args.serial} sequential PUBs")
        print(f"{'':26}{'loopback TCP':>16}{'in-process':>16}{'ratio':>8}")
        for key in results["in-process"]:
            tcp, mem = results["loopback TCP"][key], results["in-process"][key]
            print(f"{key:26}{tcp:16,.0f}{mem:16,.0f}{mem / tcp:8.2f}")
    finally:
        undo()
        await nsqd.stop()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("-n", type=int, default=100000, help="messages to publish and consume")
    p.add_argument("-s", "--size", type=int, default=100, help="message size in bytes")
    p.add_argument("-b", "--batch", type=int, default=100, help="messages per MPUB")
    p.add_argument("-w", "--window", type=int, default=16, help="commands in flight")
    p.add_argument("-r", "--rdy", type=int, default=200, help="consumer max_in_flight")
    p.add_argument("--single", type=int, default=20000, help="pipelined single PUBs")
    p.add_argument("--serial", type=int, default=5000, help="sequential PUBs (one in flight)")
    return p.parse_args(argv)


if __name__ == "__main__":
    options = parse(sys.argv[1:])
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, options)))
