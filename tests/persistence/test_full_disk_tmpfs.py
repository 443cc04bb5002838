"""A real full disk (a small tmpfs the test mounts; needs root): nothing acknowledged is lost.

nsqd runs with ``--mem-queue-size=0 --sync-every=1`` on an 8 MiB tmpfs; a
consumer holds every acknowledged message in flight when the disk is filled.
REQs are refused with E_REQ_FAILED, the consumer's disconnect puts the
messages back, they are held in memory (``held_count``, ``/ping`` NOK) and,
once space returns, written out and delivered -- every one of them.  A clean
stop of the ``nsqd`` command on a full disk exits 1 and says what it lost.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task

from nsqtw.embed import start_nsqd
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_MESSAGE
from nsqtw.testing import command, connect_raw, mpub_command

N = 200


@pytest.fixture
def small_tmpfs():
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path = tempfile.mkdtemp(prefix="nsqtw-fulldisk-")
    rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", path],
                        capture_output=True, text=True)
    if rc.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {rc.stderr.strip() or rc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def fill(path: str) -> str:
    """Write a file until the filesystem is full; its name."""
    name = os.path.join(path, "filler")
    chunk = b"\0" * 65536
    with open(name, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    # the last partial chunk may have left a few bytes free: take them too
    with open(name, "ab", buffering=0) as f:
        try:
            while True:
                f.write(b"\0")
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return name


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
        ch = nsqd.broker.find_channel("t", "c")
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
        assert nsqd.broker.backlog.count() == N
        code, body = await http_get(nsqd.http_port, "/ping")
        assert code == 500 and body.startswith(b"NOK - %d messages held in memory" % N), body
        code, body = await http_get(nsqd.http_port, "/stats?format=json&topic=t")
        assert json.loads(body)["topics"][0]["channels"][0]["held_count"] == N
        nsqd.service.retry_held()  # the timer's step: the disk is still full, nothing changes
        assert nsqd.broker.backlog.count() == N

        os.unlink(filler)
        filler = None
        nsqd.service.retry_held()
        # the refused PUB may be on disk anyway (its write fitted in a page, its fsync failed):
        # the publisher was told it failed, so it is at most an extra copy, never a loss
        total = ch.backend.depth()
        assert nsqd.broker.backlog.count() == 0 and total in (N, N + 1)
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


@pytest.mark.e2e
@pytest.mark.parametrize("command", [
    pytest.param([sys.executable, "-m", "nsqtw.tools.nsqd"], id="nsqd"),
    pytest.param(TWISTD + ["nsqd"], id="twistd-nsqd"),
    pytest.param(TWISTD + ["nsqtw", "--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
                           "--admin-http-address=127.0.0.1:0"], id="twistd-allinone"),
])
def test_clean_stop_on_a_full_tmpfs_exits_1_and_says_what_it_lost(small_tmpfs, command):
    """The nsqd command and twistd, stopped by SIGTERM with messages in memory and no space to
    write them: exit status 1 (twistd alone would exit 0) and a line that says what was lost."""
    import socket

    def free_port() -> int:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    tcp = free_port()
    proc = subprocess.Popen(
        [*command, f"--data-path={small_tmpfs}",
         f"--tcp-address=127.0.0.1:{tcp}", "--http-address=127.0.0.1:0", "--mem-queue-size=100"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
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
        body = b"".join(len(b).to_bytes(4, "big") + b for b in [b"a", b"b", b"c"])
        sock.sendall(b"  V2" + b"MPUB t\n" + (len(body) + 4).to_bytes(4, "big") + (3).to_bytes(4, "big") + body)
        reply = sock.recv(64)
        assert reply.endswith(b"OK"), reply
        sock.close()
        dat = os.path.join(small_tmpfs, "nsqd.dat")
        for _ in range(500):  # topic t's nsqd.dat rewrite done (it frees the old file's page)
            if os.path.exists(dat) and b'"t"' in open(dat, "rb").read() and \
                    not [n for n in os.listdir(small_tmpfs) if n.endswith(".tmp")]:
                break
            time.sleep(0.01)
        fill(small_tmpfs)
        proc.send_signal(signal.SIGTERM)
        err, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert ("3 messages could not be written to disk at shutdown and are lost" in err
            or "failed to write 3 messages to disk at shutdown" in err), err


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_embedded_stop_on_a_full_tmpfs_raises(small_tmpfs):
    from nsqtw.embed import MessagesLost

    nsqd = await start_nsqd(data_path=small_tmpfs, mem_queue_size=100)
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("t", [b"a", b"b"]))
    assert await pub.response() == b"OK"
    await pub.close()
    await nsqd.service.metadata_writer.request()  # nsqd.dat written (frees the old file's page)
    fill(small_tmpfs)
    with pytest.raises(MessagesLost, match="2 messages could not be written"):
        await nsqd.stop()
