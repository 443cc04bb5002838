"""The broker round trip over loopback: publish, subscribe, receive, finish."""

import pytest
import pytest_twisted

from nsqtw.testing import body_command, command, connect_raw


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_pub_sub_fin_round_trip(nsqd, raw):
    """A message published over TCP reaches a subscriber with attempts 1, and FIN clears it."""
    raw.send(body_command("PUB", "test", body=b"hello"))
    assert await raw.response() == b"OK"
    consumer = await connect_raw(nsqd.tcp_port)
    consumer.send(command("SUB", "test", "ch") + command("RDY", 5))
    assert await consumer.response() == b"OK"
    msg = await consumer.message()
    assert msg.body == b"hello" and msg.attempts == 1 and len(msg.id) == 16
    consumer.send(command("FIN", msg.id.decode()))
    consumer.send(command("FIN", msg.id.decode()))
    err = await consumer.error()
    assert err.startswith(b"E_FIN_FAILED FIN ") and err.endswith(b"failed ID not in flight")
    ch = nsqd._broker.find_channel("test", "ch")
    assert ch.message_count == 1 and not ch.inflight
    await consumer.close()
