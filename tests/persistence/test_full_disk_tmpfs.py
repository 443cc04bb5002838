"""A real full disk (a small tmpfs the test mounts; needs root): nothing acknowledged is lost.

nsqd runs with ``--mem-queue-size=0 --sync-every=1`` on an 8 MiB tmpfs; a
consumer holds every acknowledged message in flight when the disk is filled.
REQs are refused with E_REQ_FAILED, the consumer's disconnect puts the
messages back, they are held in memory (``held_count``, ``/ping`` NOK) and,
once space returns, written out and delivered -- every one of them.  A clean
stop of the ``nsqd`` command on a full disk exits 1 and says what it lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task

from nsqtw.embed import start_nsqd
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE
from nsqtw.testing import command, connect_raw, mpub_command

from fulldisk_support import fill

N = 200


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait (on the reactor) for a state the server reaches after handling a socket event."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        await task.deferLater(reactor, 0.01, lambda: None)
    raise AssertionError("condition not reached")


async def http_get(port: int, path: str):
    resp = await treq.get(f"http://127.0.0.1:{port}{path}")
    return resp.code, await resp.content()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_full_tmpfs_loses_no_acknowledged_message(small_tmpfs):
    nsqd = await start_nsqd(data_path=small_tmpfs, mem_queue_size=0, sync_every=1)
    filler = None
    try:
        cons = await connect_raw(nsqd.tcp_port)
        cons.send(command("SUB", "t", "c") + command("RDY", N))
        assert await cons.response() == b"OK"
        pub = await connect_raw(nsqd.tcp_port)
        sent = [b"m%03d-" % i + b"x" * 500 for i in range(N)]
        pub.send(mpub_command("t", sent))
        assert await pub.response() == b"OK"  # acknowledged: on disk and fsynced
        inflight = [await cons.message() for _ in range(N)]
        assert len({m.id for m in inflight}) == N

        filler = fill(small_tmpfs)
        # REQ until the disk cannot take one (the data file's last tmpfs page may still have
        # room for a few): a successful REQ comes straight back (RDY allows), a failed one is
        # refused with E_REQ_FAILED and the message stays in flight
        ch = nsqd._broker.find_channel("t", "c")
        for m in inflight:
            cons.send(command("REQ", m.id.decode(), 0))
            ftype, data = await cons.frame()
            if ftype == FRAME_ERROR:
                assert data.startswith(b"E_REQ_FAILED REQ " + m.id + b" failed DISKQUEUE(t:c)"), data
                assert m.id in ch.inflight
                break
            assert ftype == FRAME_MESSAGE and data[10:26] == m.id  # requeued and delivered again
        else:
            raise AssertionError("the full disk took every REQ")
        assert len(ch.inflight) == N
        # a new publish is refused (nothing held for it: it was never acknowledged)
        pub.send(command("PUB", "t") + len(b"late").to_bytes(4, "big") + b"late")
        assert (await pub.error()).startswith(b"E_PUB_FAILED")

        await cons.close()  # every in-flight message goes back: the disk refuses them all
        await until(lambda: not ch.clients)
        assert nsqd._broker.backlog.count() == N
        code, body = await http_get(nsqd.http_port, "/ping")
        assert code == 500 and body.startswith(b"NOK - %d messages held in memory" % N), body
        code, body = await http_get(nsqd.http_port, "/stats?format=json&topic=t")
        assert json.loads(body)["topics"][0]["channels"][0]["held_count"] == N
        nsqd._service.retry_held()  # the timer's step: the disk is still full, nothing changes
        assert nsqd._broker.backlog.count() == N

        os.unlink(filler)
        filler = None
        nsqd._service.retry_held()
        # the refused PUB may be on disk anyway (its write fitted in a page, its fsync failed):
        # the publisher was told it failed, so it is at most an extra copy, never a loss
        total = ch.backend.depth()
        assert nsqd._broker.backlog.count() == 0 and total in (N, N + 1)
        code, body = await http_get(nsqd.http_port, "/ping")
        assert (code, body) == (200, b"OK")

        again = await connect_raw(nsqd.tcp_port)
        again.send(command("SUB", "t", "c") + command("RDY", total))
        assert await again.response() == b"OK"
        got = []
        for _ in range(total):
            m = await again.message()
            got.append(m.body)
            again.send(command("FIN", m.id.decode()))
        assert sorted(b for b in got if b != b"late") == sorted(sent)
        await again.close()
        await pub.close()
    finally:
        if filler:
            os.unlink(filler)
        await nsqd.stop()


TWISTD = [sys.executable, "-c", "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()",
          "--nodaemon", "--pidfile="]


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _run_and_fill(command: list[str], path: str, bodies: list[bytes], *flags: str) -> subprocess.Popen:
    """Start ``command`` on ``path``, MPUB ``bodies`` to topic t (no channel: they wait in the
    topic's memory queue), wait for nsqd.dat, fill the disk; the running process."""
    import socket

    tcp = _free_port()
    proc = subprocess.Popen(
        [*command, f"--data-path={path}", f"--tcp-address=127.0.0.1:{tcp}", "--http-address=127.0.0.1:0",
         "--mem-queue-size=100", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sock = None
    for _ in range(500):
        try:
            sock = socket.create_connection(("127.0.0.1", tcp), timeout=5)
            break
        except OSError as e:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read()) from e
            time.sleep(0.02)
    assert sock is not None
    body = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    sock.sendall(b"  V2" + b"MPUB t\n" + (len(body) + 4).to_bytes(4, "big") + len(bodies).to_bytes(4, "big") + body)
    reply = b""
    while not reply.endswith(b"OK"):
        chunk = sock.recv(64)
        assert chunk, reply
        reply += chunk
    sock.close()
    dat = os.path.join(path, "nsqd.dat")
    for _ in range(500):  # topic t's nsqd.dat rewrite done (it frees the old file's page)
        if os.path.exists(dat) and b'"t"' in open(dat, "rb").read() and \
                not [n for n in os.listdir(path) if n.endswith(".tmp")]:
            break
        time.sleep(0.01)
    assert os.path.exists(os.path.join(path, "nsqd.reserve"))  # room kept for the final flush
    fill(path)
    return proc


def _stop(proc: subprocess.Popen) -> str:
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("command", [
    pytest.param([sys.executable, "-m", "nsqtw.tools.nsqd"], id="nsqd"),
    pytest.param(TWISTD + ["nsqd"], id="twistd-nsqd"),
    pytest.param(TWISTD + ["nsqtw", "--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
                           "--admin-http-address=127.0.0.1:0"], id="twistd-allinone"),
])
def test_clean_stop_on_a_full_tmpfs_waits_then_exits_1_and_says_what_it_lost(small_tmpfs, command):
    """The nsqd command and twistd, stopped by SIGTERM with more in memory than the reserved
    room and no space to write it: the stop waits --stop-disk-wait (saying so), then exits 1
    (twistd alone would exit 0) with a line that says what was lost."""
    bodies = [bytes([65 + i]) * 600_000 for i in range(3)]  # 1.8 MB: more than the 1 MiB reserve
    proc = _run_and_fill(command, small_tmpfs, bodies, "--stop-disk-wait=1s")
    err = _stop(proc)
    assert proc.returncode == 1, err
    assert "waiting up to" in err and "(--stop-disk-wait)" in err, err
    assert "gave up waiting for disk space after 1s" in err, err
    assert ("3 messages could not be written to disk at shutdown and are lost" in err
            or "failed to write 3 messages to disk at shutdown" in err), err


@pytest.mark.e2e
def test_the_reserved_room_takes_the_final_flush_of_a_full_tmpfs(small_tmpfs):
    """A full disk at SIGTERM, but what memory holds fits in nsqd.reserve: released at the stop,
    it takes the flush, exit 0, and the messages are there after a restart."""
    proc = _run_and_fill([sys.executable, "-m", "nsqtw.tools.nsqd"], small_tmpfs, [b"a", b"b", b"c"])
    err = _stop(proc)
    assert proc.returncode == 0, err
    assert not os.path.exists(os.path.join(small_tmpfs, "nsqd.reserve"))
    from nsqtw.backend.disk import read_queue_metadata
    meta = read_queue_metadata(open(os.path.join(small_tmpfs, "t.diskqueue.meta.dat"), "rb").read())
    assert meta[0] == 3, meta


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_a_stop_waits_for_space_to_write_what_is_held(small_tmpfs):
    """Messages held for a full disk at stop(): the stop retries until space returns (here
    after about a second), then writes them; nothing is lost and they are there after a
    restart."""
    nsqd = await start_nsqd(data_path=small_tmpfs, mem_queue_size=0, sync_every=1, stop_disk_wait=30.0,
                            disk_reserve_bytes=0)
    cons = await connect_raw(nsqd.tcp_port)
    cons.send(command("SUB", "t", "c") + command("RDY", 50))
    assert await cons.response() == b"OK"
    pub = await connect_raw(nsqd.tcp_port)
    sent = [b"w%03d-" % i + b"x" * 500 for i in range(50)]
    pub.send(mpub_command("t", sent))
    assert await pub.response() == b"OK"
    for _ in range(50):
        await cons.message()
    await pub.close()
    filler = fill(small_tmpfs)
    await cons.close()  # every in-flight message goes back: held, the disk is full
    ch = nsqd._broker.find_channel("t", "c")
    await until(lambda: not ch.clients)
    assert nsqd._broker.backlog.count() == 50
    stopping = nsqd.stop()
    await task.deferLater(reactor, 1.2, lambda: None)
    assert not stopping.called  # still waiting for space
    os.unlink(filler)
    await stopping  # no MessagesLost
    again = await start_nsqd(data_path=small_tmpfs, mem_queue_size=0)
    try:
        assert again._broker.find_channel("t", "c").depth() == 50
    finally:
        await again.stop()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_embedded_stop_on_a_full_tmpfs_raises(small_tmpfs):
    from nsqtw.embed import MessagesLost

    nsqd = await start_nsqd(data_path=small_tmpfs, mem_queue_size=100, disk_reserve_bytes=0, stop_disk_wait=0.3)
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("t", [b"a", b"b"]))
    assert await pub.response() == b"OK"
    await pub.close()
    await nsqd._service.metadata_writer.request()  # nsqd.dat written (frees the old file's page)
    fill(small_tmpfs)
    with pytest.raises(MessagesLost, match="2 messages could not be written"):
        await nsqd.stop()


@pytest.mark.e2e
@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_timeouts_under_publishing_on_a_full_tmpfs_stay_bounded_and_lose_nothing(small_tmpfs):
    """A consumer (RDY 100, then 10) that lets every message time out, publishers that keep going, a
    full disk: held memory stops at --max-held-bytes (the rest of the timeouts are extended),
    every publish needing the disk is refused while messages are held, and once space
    returns every acknowledged message is delivered."""
    cap = 20 * 1024
    nsqd = await start_nsqd(data_path=small_tmpfs, mem_queue_size=0, sync_every=1, msg_timeout=0.2,
                            max_held_bytes=cap, disk_reserve_bytes=0)
    broker = nsqd._broker
    filler = None
    acked: set[bytes] = set()
    refused = 0
    seq = 0

    async def publish(k: int) -> None:
        nonlocal seq, refused
        pub = await connect_raw(nsqd.tcp_port)
        try:
            for _ in range(k):
                bodies = [b"p%06d-" % (seq + i) + b"x" * 300 for i in range(5)]
                seq += 5
                pub.send(mpub_command("t", bodies))
                ftype, data = await pub.frame()
                if ftype == FRAME_ERROR:
                    assert data.startswith((b"E_MPUB_FAILED MPUB failed", b"E_PUB_FAILED")), data
                    refused += 1
                    await pub.close()
                    pub = await connect_raw(nsqd.tcp_port)
                else:
                    acked.update(bodies)
        finally:
            await pub.close()

    try:
        cons = await connect_raw(nsqd.tcp_port)
        cons.send(command("SUB", "t", "c") + command("RDY", 100))
        assert await cons.response() == b"OK"
        await publish(40)  # 200 acknowledged, 100 of them in flight (never FINed)
        for _ in range(100):
            await cons.message()
        filler = fill(small_tmpfs)
        cons.send(command("RDY", 10))  # from now on 10 in flight: what times out waits in memory
        held_bytes = []
        for _ in range(15):  # ~3 s: each 0.2 s every in-flight message times out again
            await publish(4)
            await task.deferLater(reactor, 0.2, lambda: None)
            held_bytes.append(broker.backlog.held_bytes())
        assert refused > 0
        assert max(held_bytes) <= cap + 100 * 400  # one scan's batch past the cap at most
        assert held_bytes[-1] == held_bytes[-5]  # flat
        assert broker.backlog.extended > 0
        code, body = await http_get(nsqd.http_port, "/stats?format=json")
        doc = json.loads(body)
        assert doc["held"]["max_bytes"] == cap and doc["held"]["timeout_extended_count"] > 0
        code, body = await http_get(nsqd.http_port, "/metrics")
        assert b"nsq_held_max_bytes %d" % cap in body

        await cons.close()
        os.unlink(filler)
        filler = None
        ch = broker.find_channel("t", "c")
        await until(lambda: not ch.clients)
        await until(lambda: broker.backlog.count() == 0, timeout=15)  # the retry timer writes them
        again = await connect_raw(nsqd.tcp_port)
        again.send(command("SUB", "t", "c") + command("RDY", 1000))
        assert await again.response() == b"OK"
        got: set[bytes] = set()
        while not acked <= got:
            m = await again.message()
            got.add(m.body)
            again.send(command("FIN", m.id.decode()))
        await again.close()
    finally:
        if filler:
            os.unlink(filler)
        await nsqd.stop()


@pytest.mark.e2e
def test_sigkill_while_holding_loses_nothing_that_was_on_disk(small_tmpfs):
    """--mem-queue-size=0 --sync-every=1: 200 acknowledged messages in flight, the disk fills,
    the consumer leaves (everything is held), SIGKILL.  The records were never taken off the
    disk (a channel's queue keeps what it read until it is FINed): after a restart with space
    back, all 200 are delivered."""
    import socket

    sys.path.insert(0, os.path.dirname(__file__))
    from test_crash import Broker, _connect, _frames, _mpub, drain

    broker = Broker(small_tmpfs, "--mem-queue-size=0", "--sync-every=1")
    sent = [b"k%03d-" % i + b"x" * 500 for i in range(200)]
    pub = _connect(broker.port)
    pbuf = bytearray()
    pub.sendall(_mpub(b"crash", sent))
    assert _frames(pub, pbuf) == (0, b"OK")
    cons = _connect(broker.port)
    cbuf = bytearray()
    cons.sendall(b"SUB crash drain\nRDY 200\n")
    assert _frames(cons, cbuf) == (0, b"OK")
    for _ in range(200):
        assert _frames(cons, cbuf)[0] == 2
    time.sleep(0.3)  # the reads' metadata syncs
    filler = fill(small_tmpfs)
    try:
        cons.shutdown(socket.SHUT_RDWR)
        cons.close()  # 200 go back: the disk refuses them, they are held
        time.sleep(0.5)
        broker.kill()
    finally:
        os.unlink(filler)
    pub.close()
    broker = Broker(small_tmpfs, "--mem-queue-size=0")
    try:
        got = drain(broker.port, 200)
    finally:
        broker.stop()
    assert set(sent) <= set(got), f"{len(set(sent) - set(got))} lost"
