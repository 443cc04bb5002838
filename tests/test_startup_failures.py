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


# --- every refused start under twistd: one FATAL line on stderr, status 1 (issue 28 item 1) ------

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def _twistd(args, cwd=REPO, pidfile=True, timeout=60):
    import subprocess
    import sys

    head = TWISTD if pidfile else [a for a in TWISTD if a != "--pidfile="]
    return subprocess.run([sys.executable, *head, *args], cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


def _one_fatal_line(out, expected_end):
    """stderr holds exactly the drop-in command's FATAL line; nothing anywhere is a traceback."""
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert " FATAL: " in lines[0] and lines[0].endswith(expected_end), lines[0]
    assert "Traceback" not in out.stdout + out.stderr and "ERROR" not in out.stdout + out.stderr


@pytest.fixture
def taken_port():
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen(1)
    yield blocker.getsockname()[1]
    blocker.close()


@pytest.mark.e2e
@pytest.mark.parametrize("plugin,flag", [
    ("nsqd", "--tcp-address"), ("nsqd", "--http-address"), ("nsqlookupd", "--http-address"),
    ("nsqadmin", "--http-address"), ("nsqtw", "--admin-http-address"), ("nsqtw", "--lookupd-tcp-listen"),
])
def test_twistd_taken_port_is_one_fatal_line(tmp_path, taken_port, plugin, flag):
    """`twistd -n nsqd` with its port taken: `[nsqd] ... FATAL: failed to instantiate nsqd - listen
    (127.0.0.1:P) failed - listen tcp 127.0.0.1:P: bind: address already in use` on stderr, status 1,
    no traceback (twistd alone prints a 30-line one), and no twistd.pid left behind."""
    zero = {"nsqd": ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                     f"--data-path={tmp_path}"],
            "nsqlookupd": ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
            "nsqadmin": ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"],
            "nsqtw": ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                      f"--data-path={tmp_path}", "--lookupd-tcp-listen=127.0.0.1:0",
                      "--lookupd-http-listen=127.0.0.1:0", "--admin-http-address=127.0.0.1:0"]}[plugin]
    out = _twistd([plugin, *zero, f"{flag}=127.0.0.1:{taken_port}"], cwd=tmp_path, pidfile=False)
    _one_fatal_line(out, f"FATAL: failed to instantiate {plugin} - listen (127.0.0.1:{taken_port}) failed - "
                         f"listen tcp 127.0.0.1:{taken_port}: bind: address already in use")
    assert out.stderr.startswith(f"[{plugin}] ")
    assert not (tmp_path / "twistd.pid").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("plugin", ["nsqd", "nsqtw"])
@pytest.mark.parametrize("path,expected", [
    ("missing/dir", "failed to lock data-path: open {path}: no such file or directory"),
    ("a-file", "failed to lock data-path: open {path}: not a directory"),
])
def test_twistd_unusable_data_path_is_one_fatal_line(tmp_path, plugin, path, expected):
    data_path = tmp_path / path
    if path == "a-file":
        data_path.write_text("")
    out = _twistd([plugin, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                   f"--data-path={data_path}"]
                  + (["--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
                      "--admin-http-address=127.0.0.1:0"] if plugin == "nsqtw" else []))
    _one_fatal_line(out, f"FATAL: failed to instantiate {plugin} - " + expected.format(path=data_path))


@pytest.mark.e2e
def test_twistd_read_only_data_path_is_one_fatal_line(tmp_path):
    """nsqd.dat cannot be written (a read-only mount: root writes through permission bits)."""
    import os
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(ro)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
    else:
        ro.chmod(0o555)
    try:
        out = _twistd(["nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                       f"--data-path={ro}"])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        ro.chmod(0o755)
    assert out.returncode == 1
    _one_fatal_line(out, out.stderr.strip()[-40:])  # the shape; the text is checked below
    assert "FATAL: failed to instantiate nsqd - failed to persist metadata - " in out.stderr
    assert "Read-only file system" in out.stderr or "Permission denied" in out.stderr


@pytest.mark.e2e
def test_twistd_bad_flag_value_is_one_fatal_line():
    """A value nsqd refuses: the drop-in command's FATAL line and status 1, not twistd's usage text."""
    out = _twistd(["nsqd", "--node-id=5000"])
    _one_fatal_line(out, "FATAL: failed to instantiate nsqd - --node-id must be [0,1024)")


@pytest.mark.e2e
def test_twistd_unknown_flag_is_gos_message_and_status_2():
    """An unknown flag: Go's `flag provided but not defined` and the usage, status 2, as `nsqd --bogus`."""
    out = _twistd(["nsqd", "--bogus"])
    assert out.returncode == 2
    assert out.stderr.startswith("flag provided but not defined: -bogus\nUsage of nsqd:\n")
    assert "Traceback" not in out.stderr


@pytest.mark.e2e
def test_daemonizing_twistd_refused_start_reports_and_leaves_nothing(tmp_path, taken_port):
    """Without -n: twistd's parent says why and exits 1, the log has the FATAL line, the pidfile is
    gone and no process is left holding the ports that did bind (nsqd's disk thread)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, *TWISTD[:2], f"--pidfile={tmp_path}/t.pid", f"--logfile={tmp_path}/t.log",
                          "nsqtw", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                          f"--data-path={tmp_path}", "--lookupd-tcp-listen=127.0.0.1:0",
                          "--lookupd-http-listen=127.0.0.1:0", f"--admin-http-address=127.0.0.1:{taken_port}"],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=60,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 1
    assert "An error has occurred: b'failed to instantiate nsqtw - listen (127.0.0.1:" in out.stderr
    log = (tmp_path / "t.log").read_text()
    assert f"FATAL: failed to instantiate nsqtw - listen (127.0.0.1:{taken_port}) failed" in log
    assert "Traceback" not in log
    assert not (tmp_path / "t.pid").exists()  # removed before the parent was told
    # the daemon's child ends right after telling its parent: wait (blocking, no polling) until
    # the data path's lock is free, i.e. no process is left holding it
    import fcntl
    import os
    import threading

    fd = os.open(str(tmp_path), os.O_RDONLY)
    taken = threading.Event()
    waiter = threading.Thread(target=lambda: (fcntl.flock(fd, fcntl.LOCK_EX), taken.set()), daemon=True)
    waiter.start()
    try:
        assert taken.wait(60), "a process still holds the data path"
    finally:
        os.close(fd)
