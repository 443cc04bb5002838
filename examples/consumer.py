#!/usr/bin/env python
"""
Consume a topic from the nsqd that ``make run`` starts (TCP 127.0.0.1:4150); Ctrl-C stops
gracefully (CLS, in-flight messages answered, then exit).

    python examples/consumer.py [topic] [channel] [nsqd-tcp-address]
"""

import sys

from twisted.internet import defer, task

from nsqtw.client import Config, Consumer


def handle(message):
    """Return normally to FIN; raise (or return a failing Deferred) to REQ with backoff."""
    print(f"attempt {message.attempts}: {message.body.decode('utf-8', 'replace')}")


async def main(reactor, topic="test", channel="example", address="127.0.0.1:4150"):
    consumer = Consumer(topic, channel, handle, Config(max_in_flight=10))
    await consumer.connect_to_nsqd(address)          # or connect_to_nsqlookupd("127.0.0.1:4161")
    reactor.addSystemEventTrigger("before", "shutdown", consumer.stop)
    print(f"consuming {topic}/{channel} from {address}; Ctrl-C to stop")
    await defer.Deferred()                           # run until the reactor stops


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, *sys.argv[1:])))
