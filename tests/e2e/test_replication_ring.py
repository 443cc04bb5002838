"""Onward replication in a ring of three (A -> B -> C -> A), over loopback: when A dies, B
adopts A's unfinished messages and replicates them to C before it delivers any of them, so
losing B next loses nothing either."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq

from nsqtw.embed import start_nsqd
from nsqtw.testing import command, connect_raw

from replication_support import free_port, until

pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_b_replicates_what_it_adopted_from_a_to_c_before_delivering_it():
    a_port = free_port()
    c = await start_nsqd(replication_insecure=True, node_id=3, replication_address="127.0.0.1:0", adopt_after=60,
                         replica_peers=[f"127.0.0.1:{a_port}"], replication_degraded="accept")
    b = await start_nsqd(replication_insecure=True, node_id=2, replication_address="127.0.0.1:0", adopt_after=0.3,
                         replica_peers=[f"127.0.0.1:{c._service.replication_port}"])
    a = await start_nsqd(replication_insecure=True, node_id=1, replication_address=f"127.0.0.1:{a_port}", adopt_after=60,
                         replica_peers=[f"127.0.0.1:{b._service.replication_port}"])
    nodes = [a, b, c]
    try:
        await until(lambda: all(n._service.replication.origin.in_sync() == 1 for n in nodes))
        for path in ("topic/create?topic=t", "channel/create?topic=t&channel=ch"):
            assert (await treq.post(f"http://127.0.0.1:{a.http_port}/{path}")).code == 200
        r = await treq.post(f"http://127.0.0.1:{a.http_port}/mpub?topic=t", b"\n".join(b"r%d" % i for i in range(6)))
        assert r.code == 200
        await until(lambda: 1 in b._service.shadow_files.states and b._service.shadow_files.states[1].count() == 6)
        assert 2 not in c._service.shadow_files.states or not c._service.shadow_files.states[2].count()

        s = await connect_raw(b.tcp_port)
        s.send(command("SUB", "t", "ch"))
        assert await s.response() == b"OK"
        s.send(command("RDY", 10))
        nodes.remove(a)
        await a.stop()  # A dies: B adopts after --adopt-after
        first = await s.message()
        # by the first delivery, C already holds every adopted message in its shadow of B
        assert b._service.adoption.adopted[0][:3] == (1, 6, 0)
        held = c._service.shadow_files.states[2].unfinished()
        assert {m.frame[34:] for m in held} >= {b"r%d" % i for i in range(6)}
        assert all(m.pending == frozenset({"ch"}) for m in held)
        # they went as a new snapshot of B (a window at a time), not as one batch of them all
        (to_c,) = b._service.replication.origin.peers.values()
        assert to_c.catch_ups == 2 and to_c.state == "in_sync"
        got = [first] + [await s.message() for _ in range(5)]
        assert sorted(m.body for m in got) == [b"r%d" % i for i in range(6)]
        assert not b._service.broker.topics["t"].channels["ch"].paused  # released after C stored them
        await s.close()
    finally:
        for n in nodes:
            await n.stop()
