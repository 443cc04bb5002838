#!/usr/bin/env python
"""
A consumer that fails every message (each is REQueued at once, without backoff): what a
channel's ``max_attempts`` policy is for. Against ``make run``'s nsqd (TCP 127.0.0.1:4150):

    python examples/failing_consumer.py [topic] [channel] [nsqd-tcp-address]

The client's own ``max_attempts`` is 0 (unlimited), so nsqd's policy decides when to give up.
"""

import sys

from twisted.internet import defer, task

from nsqtw.client import Config, Consumer


def handle(message):
    print(f"attempt {message.attempts}: {message.body.decode('utf-8', 'replace')} (failing it)", flush=True)
    message.disable_auto_response()
    message.requeue(delay=0, backoff=False)  # what a handler that raises does, without the wait


async def main(reactor, topic="orders", channel="billing", address="127.0.0.1:4150"):
    config = Config(max_in_flight=10, max_attempts=0)
    consumer = Consumer(topic, channel, handle, config)
    await consumer.connect_to_nsqd(address)
    reactor.addSystemEventTrigger("before", "shutdown", consumer.stop)
    print(f"failing everything on {topic}/{channel} from {address}; Ctrl-C to stop", flush=True)
    await defer.Deferred()


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor, *sys.argv[1:])))
