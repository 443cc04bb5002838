#!/usr/bin/env python
"""
Publish to the nsqd that ``make run`` starts (TCP 127.0.0.1:4150).

    python examples/producer.py [topic] [nsqd-tcp-address]
"""

import sys

from twisted.internet import defer, task

from nsqtw.client import Producer


async def main(reactor, topic="test", address="127.0.0.1:4150"):
    producer = Producer(address)                     # dials on the first publish
    await producer.publish(topic, b"hello")
    await producer.multi_publish(topic, [b"one", b"two", b"three"])
    await producer.deferred_publish(topic, 5.0, b"five seconds later")
    print(f"published 5 messages to {topic!r} on {address}")
    await producer.stop()


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, *sys.argv[1:])))
