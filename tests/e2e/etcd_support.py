"""A real etcd for the tests (Debian's ``etcd-server``): one member on loopback, its ports free
ones, its data in the test's temporary directory; skipped, saying why, when there is none."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from replication_support import free_port, sleep

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


class Etcd:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.url = url
        self.process = process
        self.log_path = log_path

    def gateway(self) -> Any:
        from nsqtw.nsqd.etcd import EtcdGateway
        return EtcdGateway([self.url], reactor, timeout=2.0)


@pytest_twisted.async_yield_fixture
async def etcd(tmp_path: Path) -> Any:
    if ETCD is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server; `make test` installs it as root)")
    from nsqtw.nsqd.etcd import EtcdError

    for attempt in range(3):  # a free port taken by another process before etcd bound it: again
        client, peer = free_port(), free_port()
        data = tmp_path / f"etcd-{attempt}"
        log_path = tmp_path / f"etcd-{attempt}.log"
        url = f"http://127.0.0.1:{client}"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                [ETCD, "--name=test", f"--data-dir={data}", f"--listen-client-urls={url}",
                 f"--advertise-client-urls={url}", f"--listen-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                 f"--initial-cluster=test=http://127.0.0.1:{peer}", "--log-level=error"],
                stdout=out, stderr=subprocess.STDOUT)
        server = Etcd(url, process, log_path)
        gateway = server.gateway()
        try:
            for _ in range(250):
                if process.poll() is not None:
                    break
                try:
                    await gateway.grant(2)
                    break
                except EtcdError:
                    await sleep(0.04)
            else:
                raise AssertionError("etcd did not answer:\n" + log_path.read_text()[-2000:])
        finally:
            await gateway.close()
        if process.poll() is None:
            break
    else:
        raise AssertionError("etcd did not start:\n" + log_path.read_text()[-2000:])
    try:
        yield server
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
