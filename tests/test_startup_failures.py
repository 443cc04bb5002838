"""A daemon that cannot bind one of its addresses refuses to start, whole, and leaves nothing held."""

from __future__ import annotations

import socket

import pytest
import pytest_twisted

from nsqtw.embed import start_nsqd


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_http_port_in_use_fails_start_and_releases_everything(tmp_path):
    """HTTP address taken: start_nsqd fails, its TCP port is closed again and the data path unlocked."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    try:
        with pytest.raises(Exception) as info:
            await start_nsqd(data_path=str(tmp_path), http_address=f"127.0.0.1:{taken}")
        assert "Address already in use" in str(info.value) or "in use" in repr(info.value)
        nsqd = await start_nsqd(data_path=str(tmp_path))  # the data path is free again
        await nsqd.stop()
    finally:
        blocker.close()


@pytest.mark.e2e
@pytest.mark.parametrize("daemon,flag", [("nsqd", "--tcp-address"), ("nsqd", "--http-address"),
                                         ("nsqlookupd", "--tcp-address"), ("nsqadmin", "--http-address")])
def test_taken_port_prints_one_fatal_line_and_exits_1(tmp_path, daemon, flag):
    """As Go's daemons: `FATAL: failed to instantiate nsqd - listen (127.0.0.1:P) failed - listen tcp
    127.0.0.1:P: bind: address already in use`, exit code 1, no traceback (issue 14 item 6)."""
    import subprocess
    import sys
    from pathlib import Path

    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    taken = blocker.getsockname()[1]
    args = [f"{flag}=127.0.0.1:{taken}"]
    if daemon == "nsqd":
        args += [f"--data-path={tmp_path}", "--https-address="]
        args += ["--http-address=127.0.0.1:0"] if flag != "--http-address" else ["--tcp-address=127.0.0.1:0"]
    elif daemon == "nsqlookupd":
        args += ["--http-address=127.0.0.1:0"]
    else:
        args += ["--nsqd-http-address=127.0.0.1:1"]
    try:
        out = subprocess.run([sys.executable, "-m", "nsqtw.cli", daemon, *args],
                             cwd=str(Path(__file__).resolve().parents[1]), capture_output=True, text=True, timeout=60)
    finally:
        blocker.close()
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    fatal = [line for line in lines if "FATAL" in line]
    assert fatal == [line for line in lines if f"listen (127.0.0.1:{taken})" in line]
    assert len(fatal) == 1, out.stderr
    assert fatal[0].endswith(f"FATAL: failed to instantiate {daemon} - listen (127.0.0.1:{taken}) failed - "
                             f"listen tcp 127.0.0.1:{taken}: bind: address already in use")
    assert "Traceback" not in out.stderr and "Unhandled" not in out.stderr and "ERROR" not in out.stderr


TWISTD = ["-c", "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()",
          "--nodaemon", "--pidfile="]


@pytest.mark.e2e
@pytest.mark.parametrize("plugin,args,expected", [
    ("nsqd", ["--tls-cert=/nonexistent.pem", "--tls-key=/nonexistent.pem"],
     "FATAL: failed to instantiate nsqd - failed to build TLS config - --tls-cert /nonexistent.pem: "
     "No such file or directory"),
    ("nsqtw", ["--lookupd-http-listen="],
     "FATAL: failed to instantiate nsqtw - --lookupd-http-listen must be <addr>:<port>"),
    ("nsqtw", ["--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=nope"],
     "FATAL: failed to instantiate nsqtw - --lookupd-http-listen 'nope': missing port in address"),
])
def test_twistd_refused_configuration_is_one_fatal_line(tmp_path, plugin, args, expected):
    """A configuration the service tree refuses, under twistd: the drop-in command's one FATAL
    line naming the flag, status 1, no traceback (twistd alone prints one and exits 0)."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, *TWISTD, plugin, f"--data-path={tmp_path}", *args],
                         cwd=str(Path(__file__).resolve().parents[1]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert expected in out.stderr
    assert "Traceback" not in out.stdout + out.stderr
