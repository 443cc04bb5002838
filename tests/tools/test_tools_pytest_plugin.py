"""nsqtw's pytest plugin: the README example as a real test, markers, the cluster fixture, helpers'
timeouts, teardown leaving no files or ports, and (in child pytest runs) loading by -p / entry point,
coexisting with a project's own `nsqd` fixture, and skipping cleanly without pytest-twisted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest
import pytest_twisted

from nsqtw.testing.pytest_plugin import start_lookupd_fixture, start_nsqd_fixture

from daemon_support import env


# --- the README example (keep it under fifteen lines) ------------------------------------------

@pytest_twisted.ensureDeferred
async def test_readme_example(nsqtw_nsqd):
    """Publish to a real in-process nsqd and get the message back on a channel."""
    await nsqtw_nsqd.publish("orders", b"order #1")
    [msg] = await nsqtw_nsqd.wait_for_messages("orders", "billing", 1, timeout=5)
    assert msg.body == b"order #1" and msg.attempts == 1
    assert nsqtw_nsqd.depth("orders", "billing") == 0

# -------------------------------------------------------------------------------------------------


@pytest.mark.nsqtw_options(mem_queue_size=2, msg_timeout=5.0)
@pytest_twisted.ensureDeferred
async def test_options_marker_and_helpers(nsqtw_nsqd):
    """@pytest.mark.nsqtw_options reaches NsqdOptions; MPUB, stats and TCP/HTTP addresses work."""
    assert nsqtw_nsqd.options.mem_queue_size == 2 and nsqtw_nsqd.options.msg_timeout == 5.0
    await nsqtw_nsqd.multi_publish("many", [b"a", b"b", b"c"])
    stats = nsqtw_nsqd.stats(topic="many")
    assert [t["message_count"] for t in stats["topics"]] == [3]
    assert nsqtw_nsqd.tcp_address.startswith("127.0.0.1:") and nsqtw_nsqd.http_url.startswith("http://127.0.0.1:")
    got = await nsqtw_nsqd.wait_for_messages("many", "c", 3)
    assert [m.body for m in got] == [b"a", b"b", b"c"]


@pytest_twisted.ensureDeferred
async def test_wait_for_messages_timeout_says_how_many(nsqtw_nsqd):
    """A wait that cannot be met fails with TimeoutError naming what arrived."""
    await nsqtw_nsqd.publish("few", b"only one")
    with pytest.raises(TimeoutError, match="got 1 of 2 messages on few/ch within 0.2s"):
        await nsqtw_nsqd.wait_for_messages("few", "ch", 2, timeout=0.2)


@pytest.mark.nsqtw_cluster(nsqd=3)
@pytest_twisted.ensureDeferred
async def test_cluster_registers_every_nsqd(nsqtw_cluster):
    """nsqtw_cluster: three nsqd registered with the lookupd; a topic published on one is found there."""
    assert len(nsqtw_cluster.nsqds) == 3 and len(nsqtw_cluster.lookupd.producers()) == 3
    await nsqtw_cluster.nsqds[1].publish("clustered", b"x")
    [p] = await nsqtw_cluster.lookupd.wait_for_producers(1, topic="clustered")
    assert (p.peer.broadcast_address, p.peer.tcp_port) == ("127.0.0.1", nsqtw_cluster.nsqds[1].tcp_port)


def _refused(port: int) -> bool:
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        return False
    except ConnectionRefusedError:
        return True
    finally:
        s.close()


@pytest_twisted.ensureDeferred
async def test_teardown_leaves_no_files_or_ports():
    """After stop, the data directory is gone and both ports refuse connections."""
    nsqd = await start_nsqd_fixture()
    lookupd = await start_lookupd_fixture()
    data, ports = nsqd.data_path, (nsqd.tcp_port, nsqd.http_port, lookupd.handle.tcp_port, lookupd.handle.http_port)
    await nsqd.publish("t", b"x")
    await nsqd.wait_for_messages("t", "c", 1)
    assert os.path.isdir(data)
    await nsqd.stop()
    await lookupd.stop()
    assert not os.path.exists(data)
    assert all(_refused(p) for p in ports)


# --- child pytest runs --------------------------------------------------------------------------

CHILD_TEST = textwrap.dedent('''
    import pytest
    import pytest_twisted

    @pytest.fixture
    def nsqd():
        """The project's own fixture of that name: nsqtw's are prefixed, so both coexist."""
        return "the project's nsqd"

    @pytest_twisted.ensureDeferred
    async def test_roundtrip(nsqtw_nsqd, nsqd):
        assert nsqd == "the project's nsqd"
        await nsqtw_nsqd.publish("orders", b"hello")
        [msg] = await nsqtw_nsqd.wait_for_messages("orders", "audit", 1, timeout=5)
        assert msg.body == b"hello"

    def test_sync_test_with_lookupd(nsqtw_lookupd):
        assert nsqtw_lookupd.producers() == []
''')


def _entry_point_installed() -> bool:
    return any(ep.name == "nsqtw" for ep in metadata.entry_points(group="pytest11"))


def child_pytest(tmp_path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    load = [] if _entry_point_installed() else ["-p", "nsqtw.testing.pytest_plugin"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *load, *args,
                           str(tmp_path / "test_child.py")], capture_output=True, env=env(), cwd=str(tmp_path),
                          timeout=120)


def test_plugin_in_another_suite(tmp_path):
    """A suite that loads the plugin gets working fixtures next to its own `nsqd` fixture."""
    r = child_pytest(tmp_path)
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "2 passed" in out


def test_without_pytest_twisted_fixtures_skip(tmp_path):
    """With pytest-twisted disabled the run does not break: the fixtures skip with a clear reason."""
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    r = child_pytest(tmp_path, "-p", "no:twisted", "-k", "lookupd")
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert "1 skipped" in out and "nsqtw's fixtures need pytest-twisted's reactor" in out


def test_plugin_module_imports_nothing_heavy_itself():
    """Importing the plugin adds only itself to what its package already imports (no twisted.internet.reactor)."""
    code = ("import sys, pytest, nsqtw.testing; before = set(sys.modules); import nsqtw.testing.pytest_plugin; "
            "print(sorted(set(sys.modules) - before)); print('twisted.internet.reactor' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env(), timeout=60)
    lines = r.stdout.decode().splitlines()
    assert lines == ["['nsqtw.testing.pytest_plugin']", "False"], r.stderr.decode()
