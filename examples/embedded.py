#!/usr/bin/env python
"""
An nsqd inside your own Twisted program: start it on port 0, publish, consume, stop.

    python examples/embedded.py
"""

from twisted.internet import defer, task

from nsqtw.client import Consumer, Producer
from nsqtw.embed import start_nsqd


async def main(reactor):
    nsqd = await start_nsqd(reactor)                       # 127.0.0.1, ports chosen by the OS
    print("nsqd on", nsqd.tcp_address, "and http://" + nsqd.http_address)

    received = defer.Deferred()
    consumer = Consumer("greetings", "printer", lambda msg: received.callback(msg.body))
    await consumer.connect_to_nsqd(nsqd.tcp_address)

    producer = Producer(nsqd.tcp_address)
    await producer.publish("greetings", b"hello from an embedded nsqd")
    print("received:", (await received).decode())

    await producer.stop()
    await consumer.stop()
    await nsqd.stop()                                      # listeners closed, temp data removed


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
