#!/usr/bin/env python
"""
A broker, a producer and a consumer in one reactor, joined by the in-process bus: the same
V2 bytes through the same protocol code as over TCP, with no socket.

    python examples/inprocess_bus.py
"""

from twisted.internet import defer, task

from nsqtw.client import Config, Consumer, Producer, register_inprocess
from nsqtw.embed import start_nsqd


async def main(reactor, count=1000):
    nsqd = await start_nsqd()                        # also listens on loopback TCP as usual
    register_inprocess(nsqd, "local")                # now "inprocess:local" reaches it
    done, seen = defer.Deferred(), []

    def handle(message):
        seen.append(message.body)
        if len(seen) == count:
            done.callback(None)

    consumer = Consumer("orders", "audit", handle, Config(max_in_flight=100))
    await consumer.connect_to_nsqd("inprocess:local")
    producer = Producer(nsqd)                        # the handle works as an address too
    await producer.multi_publish("orders", [b"order-%d" % i for i in range(count)])
    await done
    await consumer.stop()                            # CLS; returns once every FIN is out
    print(f"{len(seen)} messages over the in-process bus; {consumer.stats()}")
    await producer.stop()
    await nsqd.stop()


if __name__ == "__main__":
    task.react(lambda reactor: defer.ensureDeferred(main(reactor)))
