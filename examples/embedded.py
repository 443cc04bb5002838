#!/usr/bin/env python
"""
An nsqd inside your own Twisted program: start it on port 0, publish, consume, stop.

    python examples/embedded.py

Typed throughout: ``mypy --strict examples/embedded.py`` passes.
"""

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTCP

from nsqtw.client import Consumer, Message, Producer
from nsqtw.embed import start_nsqd


async def main(reactor: IReactorTCP) -> None:
    nsqd = await start_nsqd(reactor)                       # 127.0.0.1, ports chosen by the OS
    print("nsqd on", nsqd.tcp_address, "and http://" + (nsqd.http_address or "(no HTTP)"))

    received: defer.Deferred[bytes] = defer.Deferred()

    def handle(message: Message) -> None:                  # return: FIN; raise: REQ with backoff
        received.callback(message.body)

    consumer = Consumer("greetings", "printer", handle)
    await consumer.connect_to_nsqd(nsqd.tcp_address)

    producer = Producer(nsqd.tcp_address)
    await producer.publish("greetings", b"hello from an embedded nsqd")
    print("received:", (await received).decode())

    await producer.stop()
    await consumer.stop()
    await nsqd.stop()                                      # listeners closed, temp data removed


if __name__ == "__main__":
    task.react(main)
