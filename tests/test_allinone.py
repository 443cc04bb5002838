"""The all-in-one service (``twistd nsqtw``, ``make run``): one process, a working cluster."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor, task

from nsqtw.allinone.tap import Options, makeService, split_extra_flags


def test_extra_flags_in_every_go_form():
    """The all-in-one's own flags are taken out of argv in any Go form; the rest go to nsqd."""
    values, rest = split_extra_flags(["-lookupd-tcp-listen=:1", "--lookupd-http-listen", ":2",
                                      "--admin-http-address=", "--mem-queue-size=5"])
    assert values == {"lookupd_tcp_address": ":1", "lookupd_http_address": ":2", "admin_http_address": "",
                      "admin_history_path": ""}
    assert rest == ["--mem-queue-size=5"]


async def _eventually(check, timeout: float = 10.0):
    deadline = reactor.seconds() + timeout
    while True:
        result = await check()
        if result or reactor.seconds() > deadline:
            return result
        await task.deferLater(reactor, 0.05, lambda: None)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_allinone_serves_a_registered_cluster(tmp_path, monkeypatch):
    """nsqd publishes, nsqlookupd lists it as the topic's producer, nsqadmin shows the topic.
    (The daemons' process policy is recorded, not applied: this is pytest's process.)"""
    import nsqtw.runtime.process

    applied: list = []
    monkeypatch.setattr(nsqtw.runtime.process, "apply_daemon_policy", lambda service, reactor: applied.append(service))
    opts = Options()
    opts.parseOptions(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                       f"--data-path={tmp_path}", "--broadcast-address=127.0.0.1",
                       "--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
                       "--admin-http-address=127.0.0.1:0"])
    service = makeService(opts)
    assert applied == [service]
    service.startService()
    try:
        await service.ready()
        nsqd, lookupd, admin = service.nsqd, service.lookupd, service.admin
        r = await treq.post(f"http://127.0.0.1:{nsqd.http_port}/pub?topic=hello", b"world")
        assert (r.code, await r.content()) == (200, b"OK")

        async def registered():
            r = await treq.get(f"http://127.0.0.1:{lookupd.http_port}/lookup?topic=hello")
            if r.code != 200:
                return None
            doc = json.loads(await r.content())
            return [p["tcp_port"] for p in doc["producers"]]

        assert await _eventually(registered) == [nsqd.tcp_port]

        async def listed():
            r = await treq.get(f"http://127.0.0.1:{admin.http_port}/api/topics")
            return json.loads(await r.content()).get("topics") if r.code == 200 else None

        assert await _eventually(listed) == ["hello"]
    finally:
        await service.stopService()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_admin_history_path_keeps_nsqadmins_charts_across_a_restart(tmp_path, monkeypatch):
    """``--admin-history-path`` is nsqadmin's ``--history-path`` in the all-in-one: the history
    is written at stop and read back by the next start."""
    import nsqtw.runtime.process

    monkeypatch.setattr(nsqtw.runtime.process, "apply_daemon_policy", lambda service, reactor: None)
    history = tmp_path / "history"
    history.mkdir()

    def start():
        opts = Options()
        opts.parseOptions(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
                           f"--data-path={tmp_path}", "--broadcast-address=127.0.0.1",
                           "--lookupd-tcp-listen=127.0.0.1:0", "--lookupd-http-listen=127.0.0.1:0",
                           "--admin-http-address=127.0.0.1:0", f"--admin-history-path={history}"])
        return makeService(opts)

    service = start()
    assert service.admin.options.history_path == str(history)
    service.startService()
    try:
        await service.ready()
        r = await treq.post(f"http://127.0.0.1:{service.nsqd.http_port}/pub?topic=kept", b"x")
        assert r.code == 200
        await service.admin.poller.poll_once()
    finally:
        await service.stopService()
    saved = history / "nsqadmin.history.json"
    assert saved.exists() and "kept" in saved.read_text()
    again = start()
    again.startService()
    try:
        await again.ready()
        assert "kept" in json.dumps(again.admin.history.overview())
    finally:
        await again.stopService()
