"""The drop-in nsqd / nsqlookupd / nsqadmin commands, started as subprocesses the way client libraries'
integration tests start Go's binaries: single- and double-dash flags, port 0 and fixed ports, a pynsq
round trip (directly and through nsqlookupd), --version / -h / unknown flags, --config, the working
directory as data path, clean exits on SIGTERM/SIGINT, and rebinding the same ports after SIGKILL."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest
import pytest_twisted
import treq

from daemon_support import Daemon, env, free_port, pynsq_round_trip

pytestmark = pytest.mark.e2e


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsqtw.cli", *argv], capture_output=True, env=env(), timeout=60)


def test_version_help_and_flag_errors():
    """--version prints 'nsqd v1.3.0 (...)' on stdout; -h is Go's usage; an unknown flag exits 2 with usage;
    an unsupported feature exits 1 naming the flag."""
    v = run("--version")
    assert v.returncode == 0 and v.stdout.decode().startswith("nsqd v1.3.0 (")
    assert run("nsqlookupd", "-version").stdout.decode().startswith("nsqlookupd v1.3.0 (")
    h = run("-h")
    assert h.returncode == 0 and h.stderr.decode().startswith("Usage of nsqd:\n") and "-mem-queue-size int" in h.stderr.decode()
    bad = run("--no-such-flag=1")
    assert bad.returncode == 2 and bad.stderr.decode().startswith("flag provided but not defined: -no-such-flag\nUsage of nsqd:")
    exp = run("--enable-experiment=topology-aware-consumption", "--tcp-address=127.0.0.1:0")
    assert exp.returncode == 1 and "--enable-experiment is not supported" in exp.stderr.decode()


@pytest_twisted.ensureDeferred
async def test_nsqd_port_zero_single_dash_pynsq_round_trip(tmp_path):
    """`nsqd -tcp-address 127.0.0.1:0 -http-address=127.0.0.1:0 -data-path D`: the log names the real
    ports; pynsq publishes and consumes 20 messages; /ping answers; SIGTERM exits 0 with nsqd.dat written."""
    data = tmp_path / "data"
    data.mkdir()
    nsqd = Daemon(tmp_path, "nsqd", "-tcp-address", "127.0.0.1:0", "-http-address=127.0.0.1:0",
                  f"-data-path={data}", "-worker-id", "-mem-queue-size", "100")
    try:
        addrs = await nsqd.listening("TCP", "HTTP")
        assert addrs["TCP"][1] != 0 and addrs["HTTP"][1] != 0
        result = await pynsq_round_trip(tmp_path, nsqd.address("TCP"), "dropin", 20)
        assert result["acked"] == 20 and result["received"] == sorted(f"m-{i}" for i in range(20))
        r = await treq.get(f"http://{nsqd.address('HTTP')}/ping")
        assert (await r.content()) == b"OK"
        assert await nsqd.stop(signal.SIGTERM) == 0
    finally:
        nsqd.close()
    err = nsqd.stderr()
    assert "INFO: nsqd v1.3.0 (built w/nsqtw" in err and "WARNING: --worker-id is deprecated" in err
    assert (data / "nsqd.dat").exists() and "Traceback" not in err


@pytest_twisted.ensureDeferred
async def test_lookupd_and_nsqd_fixed_ports_double_dash_sigint(tmp_path):
    """nsqlookupd and nsqd on fixed ports with --flag value syntax; nsqd registers; pynsq's Reader finds
    it through lookupd; SIGINT stops both with exit code 0."""
    lt, lh, nt, nh = (free_port() for _ in range(4))
    lookupd = Daemon(tmp_path, "nsqlookupd", "--tcp-address", f"127.0.0.1:{lt}", "--http-address", f"127.0.0.1:{lh}",
                     "--broadcast-address", "127.0.0.1")
    nsqd = None
    try:
        assert (await lookupd.listening("TCP", "HTTP")) == {"TCP": ("127.0.0.1", lt), "HTTP": ("127.0.0.1", lh)}
        nsqd = Daemon(tmp_path, "nsqd", "--tcp-address", f"127.0.0.1:{nt}", f"--http-address=127.0.0.1:{nh}",
                      "--broadcast-address=127.0.0.1", "--lookupd-tcp-address", f"127.0.0.1:{lt}")
        await nsqd.listening("TCP", "HTTP")
        result = await pynsq_round_trip(tmp_path, f"127.0.0.1:{nt}", "via_lookupd", 10, lookupd_http=f"127.0.0.1:{lh}")
        assert result["received"] == sorted(f"m-{i}" for i in range(10))
        r = await treq.get(f"http://127.0.0.1:{lh}/lookup?topic=via_lookupd")
        producers = (await r.json())["producers"]
        assert [(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in producers] == [("127.0.0.1", nt, nh)]
        assert await nsqd.stop(signal.SIGINT) == 0
        assert await lookupd.stop(signal.SIGINT) == 0
    finally:
        lookupd.close()
        if nsqd is not None:
            nsqd.close()
    assert (tmp_path / "nsqd.dat").exists()  # no --data-path: the working directory


@pytest_twisted.ensureDeferred
async def test_rebind_same_ports_right_after_sigkill(tmp_path):
    """SIGKILL an nsqd with a client connected, start another on the same fixed ports at once: it binds
    (SO_REUSEADDR on Twisted's listening sockets; the data-path lock died with the process)."""
    nt, nh = free_port(), free_port()
    flags = (f"--tcp-address=127.0.0.1:{nt}", f"--http-address=127.0.0.1:{nh}", f"--data-path={tmp_path}")
    first = Daemon(tmp_path, "nsqd", *flags)
    client = None
    try:
        await first.listening()
        client = socket.create_connection(("127.0.0.1", nt))
        client.sendall(b"  V2")
        r = await treq.get(f"http://127.0.0.1:{nh}/ping")
        await r.content()
        assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
        second = Daemon(tmp_path, "nsqd", *flags)
        try:
            assert (await second.listening()) == {"TCP": ("127.0.0.1", nt), "HTTP": ("127.0.0.1", nh)}
            assert await second.stop() == 0
        finally:
            second.close()
    finally:
        first.close()
        if client is not None:
            client.close()


@pytest_twisted.ensureDeferred
async def test_config_file_and_flags_win(tmp_path):
    """--config TOML with NSQ's keys (an empty tls_min_version as in contrib/nsqd.cfg.example); a flag
    given on the command line wins over the file; the module entry point works too."""
    nh = free_port()
    cfg = tmp_path / "nsqd.cfg"
    cfg.write_text(f'tcp_address = "127.0.0.1:0"\nhttp_address = "127.0.0.1:{nh}"\nmem_queue_size = 7\n'
                   f'tls_min_version = ""\ndata_path = "{tmp_path}"\nmax_msg_size = 1000\n')
    nsqd = Daemon(tmp_path, "nsqd", "--config", str(cfg), "-max-msg-size=2000", module="nsqtw.tools.nsqd")
    try:
        addrs = await nsqd.listening()
        assert addrs["HTTP"] == ("127.0.0.1", nh)
        r = await treq.get(f"http://127.0.0.1:{nh}/config/mem_queue_size")
        assert await r.json() == 7
        r = await treq.get(f"http://127.0.0.1:{nh}/config/max_msg_size")
        assert await r.json() == 2000
        assert await nsqd.stop() == 0
    finally:
        nsqd.close()


@pytest_twisted.ensureDeferred
async def test_nsqadmin_command(tmp_path):
    """nsqadmin -http-address 127.0.0.1:0: the log names the port, /ping answers, SIGTERM exits 0."""
    admin = Daemon(tmp_path, "nsqadmin", "-http-address", "127.0.0.1:0", "-nsqd-http-address=127.0.0.1:4151")
    try:
        await admin.listening("HTTP")
        r = await treq.get(f"http://{admin.address('HTTP')}/ping")
        assert (await r.content()) == b"OK"
        assert await admin.stop() == 0
    finally:
        admin.close()


@pytest_twisted.ensureDeferred
async def test_https_listener_is_announced(tmp_path):
    """With a TLS cert, 'HTTPS: listening on <real address>' is logged (port 0) and HTTPS serves /ping."""
    from nsqtw.testing.certs import make_certificates

    certs = make_certificates(str(tmp_path))
    nsqd = Daemon(tmp_path, "nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                  "--https-address=127.0.0.1:0", f"--tls-cert={certs['server']}", f"--tls-key={certs['server_key']}")
    try:
        addrs = await nsqd.listening("TCP", "HTTP", "HTTPS")
        assert addrs["HTTPS"][1] > 0
        assert await nsqd.stop() == 0
    finally:
        nsqd.close()
