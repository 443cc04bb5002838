"""An embedded broker changes nothing in its host's process (issue 23).

After ``start_nsqd()``, ``start_nsqlookupd()``, ``start_nsqadmin()`` and the pytest fixtures'
starts: no thread was added, no memory-trim loop runs, the collector's freeze count,
thresholds and callbacks are untouched, and the HTTP site is already built (its imports ran
inside the start, not in a reactor turn after it).  ``options=`` gets the same embedding
defaults as keyword arguments, the handles are typed, and a throwaway data directory is never
fsynced.  (How late a host's 10 ms loop runs after the start is a figure, printed by
``bench/bench_embed_stall.py``; tests never assert times.)
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import typing
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import task

from nsqtw.admin.options import AdminOptions
from nsqtw.embed import NsqdHandle, embedded_nsqd_options, start_nsqd
from nsqtw.embed import AdminHandle, start_nsqadmin
from nsqtw.embed import LookupdHandle, start_nsqlookupd
from nsqtw.lookupd.options import LookupdOptions
from nsqtw.options import NsqdOptions, default_hostname
from nsqtw.runtime.process import MemoryTrimService
from nsqtw.runtime.listen import LazyFactory
from nsqtw.runtime.memory import release_free_memory

ROOT = Path(__file__).resolve().parents[2]


def _reactor() -> Any:
    from twisted.internet import reactor
    return reactor


def process_state() -> dict[str, Any]:
    return {"freeze": gc.get_freeze_count(), "threshold": gc.get_threshold(), "callbacks": list(gc.callbacks),
            "threads": {t for t in threading.enumerate() if t.is_alive()}}


def assert_untouched(before: dict[str, Any]) -> None:
    after = process_state()
    added = sorted(t.name for t in after["threads"] - before["threads"])
    assert added == [], f"threads left alive by the start: {added}"
    assert after["freeze"] == before["freeze"]
    assert after["threshold"] == before["threshold"]
    assert after["callbacks"] == before["callbacks"]


def services(tree: Any) -> list[Any]:
    out = [tree]
    try:
        children = list(tree)
    except TypeError:
        return out
    for child in children:
        out.extend(services(child))
    return out


def assert_no_trim_loop(*trees: Any) -> None:
    for tree in trees:
        for svc in services(tree):
            assert not isinstance(svc, MemoryTrimService)
            assert "trim" not in (getattr(svc, "name", None) or "")
    for call in _reactor().getDelayedCalls():
        owner = getattr(call.func, "__self__", None)
        if isinstance(owner, task.LoopingCall):
            step = owner.f
            assert step is not release_free_memory
            assert "trim" not in (getattr(getattr(step, "__self__", None), "name", None) or "")


def assert_site_built(listener: Any) -> None:
    """The HTTP site is built inside the start: no reactor turn after it imports and builds it."""
    factory = listener.factory
    if isinstance(factory, LazyFactory):
        assert factory._factory is not None
    for call in _reactor().getDelayedCalls():
        assert getattr(call.func, "__func__", None) is not LazyFactory.build


# --- nothing changed in the host's process --------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_start_nsqd_changes_nothing_in_the_process() -> None:
    before = process_state()
    nsqd = await start_nsqd()
    try:
        assert_untouched(before)
        assert_no_trim_loop(nsqd._service)
        assert_site_built(nsqd._service.http_listener)
    finally:
        await nsqd.stop()
    assert_untouched(before)


@pytest_twisted.ensureDeferred
async def test_start_nsqlookupd_and_nsqadmin_change_nothing_in_the_process() -> None:
    before = process_state()
    lookupd = await start_nsqlookupd()
    admin = await start_nsqadmin(lookupd_http_addresses=[lookupd.http_address])
    try:
        assert_untouched(before)
        assert_no_trim_loop(lookupd._service, admin._service)
        assert_site_built(lookupd._service.http_listener)
        assert_site_built(admin._service.http_listener)
    finally:
        await admin.stop()
        await lookupd.stop()


@pytest_twisted.ensureDeferred
async def test_the_pytest_fixtures_change_nothing_in_the_process() -> None:
    from nsqtw.testing.pytest_plugin import start_cluster_fixture, start_nsqd_fixture

    before = process_state()
    nsqd = await start_nsqd_fixture()
    cluster = await start_cluster_fixture(1)
    try:
        assert_untouched(before)
        assert_no_trim_loop(nsqd.handle._service, cluster.nsqds[0].handle._service, cluster.lookupd.handle._service)
        assert_site_built(nsqd.handle._service.http_listener)
    finally:
        await cluster.stop()
        await nsqd.stop()


def test_importing_nsqtw_installs_no_gc_callback() -> None:
    """``nsqtw.runtime.memory`` times the collector only in a daemon (the process policy installs it)."""
    probe = ("import gc; n = len(gc.callbacks); import nsqtw.runtime.memory, nsqtw.nsqd.embed, nsqtw.nsqd.service; "
             "print(len(gc.callbacks) - n, gc.get_freeze_count())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=str(ROOT), capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.split() == ["0", "0"]


# --- options= gets the embedding defaults --------------------------------------------------------


def test_options_object_gets_the_embedding_defaults_for_fields_left_at_nsqs() -> None:
    opts = embedded_nsqd_options(NsqdOptions(mem_queue_size=7))
    assert (opts.tcp_address, opts.http_address, opts.https_address, opts.broadcast_address) == (
        "127.0.0.1:0", "127.0.0.1:0", "", "127.0.0.1")
    assert opts.mem_queue_size == 7
    chosen = embedded_nsqd_options(NsqdOptions(tcp_address="127.0.0.1:4150", broadcast_address="nsq.example"))
    assert (chosen.tcp_address, chosen.broadcast_address) == ("127.0.0.1:4150", "nsq.example")
    # a keyword argument wins over both, even when it spells NSQ's own default
    kept = embedded_nsqd_options(NsqdOptions(), tcp_address="0.0.0.0:4150", broadcast_address=default_hostname())
    assert (kept.tcp_address, kept.broadcast_address) == ("0.0.0.0:4150", default_hostname())
    assert embedded_nsqd_options(mem_queue_size=7) == opts


@pytest_twisted.ensureDeferred
async def test_start_nsqd_with_options_is_local_and_leaves_nothing_behind(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    nsqd = await start_nsqd(options=NsqdOptions(mem_queue_size=7))
    data_path = nsqd.options.data_path
    try:
        assert nsqd.host == "127.0.0.1" and nsqd.tcp_port > 0
        assert nsqd.http_address is not None and nsqd.http_address.startswith("127.0.0.1:")
        assert nsqd.https_port is None
        assert nsqd.options.broadcast_address == "127.0.0.1"
        assert nsqd.options.mem_queue_size == 7
        assert data_path and Path(data_path) != tmp_path and os.path.isdir(data_path)
    finally:
        await nsqd.stop()
    assert not os.path.exists(data_path)  # the temporary directory is removed on stop
    assert list(tmp_path.iterdir()) == []  # nothing (nsqd.dat) written into the working directory


@pytest_twisted.ensureDeferred
async def test_start_nsqlookupd_and_nsqadmin_with_options_are_local() -> None:
    lookupd = await start_nsqlookupd(options=LookupdOptions())
    admin = await start_nsqadmin(options=AdminOptions(lookupd_http_addresses=[lookupd.http_address]))
    try:
        assert lookupd.host == "127.0.0.1" and lookupd.http_host == "127.0.0.1"
        assert lookupd.tcp_port > 0 and lookupd.http_port > 0
        assert lookupd.options.broadcast_address == "127.0.0.1"
        assert admin.host == "127.0.0.1" and admin.http_port > 0
    finally:
        await admin.stop()
        await lookupd.stop()


def test_the_starts_are_typed() -> None:
    for start, handle in ((start_nsqd, NsqdHandle), (start_nsqlookupd, LookupdHandle),
                          (start_nsqadmin, AdminHandle)):
        assert typing.get_args(typing.get_type_hints(start)["return"]) == (handle,)


# --- a throwaway data directory is never fsynced ---------------------------------------------


async def _spill_and_stop(monkeypatch, **kwargs: Any) -> tuple[int, list[str]]:
    """Start nsqd, publish to disk (mem_queue_size 0), stop; the fsyncs and the threads it ran."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    before = {t for t in threading.enumerate() if t.is_alive()}
    nsqd = await start_nsqd(mem_queue_size=0, sync_every=1, **kwargs)
    threads = sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())
    reactor = _reactor()
    for i in range(5):
        nsqd._broker.publish("spill", [b"message %d" % i], reactor.seconds())
        nsqd._service.settle()
    await nsqd._service.sync_barrier()
    await nsqd.stop()
    return len(synced), threads


@pytest_twisted.ensureDeferred
async def test_a_throwaway_data_directory_is_never_fsynced(monkeypatch) -> None:
    monkeypatch.setattr("nsqtw.nsqd.embed.scratch_dir", lambda: __import__("tempfile").mkdtemp(prefix="nsqtw-disk-"))
    fsyncs, threads = await _spill_and_stop(monkeypatch)  # no /dev/shm: a directory on a real disk
    assert fsyncs == 0
    assert threads == []


@pytest_twisted.ensureDeferred
async def test_a_data_directory_of_the_callers_is_fsynced_off_the_reactor_thread(monkeypatch, tmp_path) -> None:
    fsyncs, threads = await _spill_and_stop(monkeypatch, data_path=str(tmp_path))
    assert fsyncs > 0
    assert threads == ["nsqtw-diskqueue-sync"] or all("sync" in t for t in threads)


def test_without_fsync_is_per_thread() -> None:
    """A throwaway broker's jobs skip fsync on their own thread only: a durable broker's worker
    thread running at the same moment still fsyncs."""
    from nsqtw.backend import durability

    calls: list[str] = []

    def record_fsync(fd: int) -> None:
        calls.append(threading.current_thread().name)

    def other_thread() -> None:
        durability.fsync(-1)

    def job() -> None:
        durability.fsync(-1)  # skipped: this thread runs without fsync
        t = threading.Thread(target=other_thread, name="durable-worker")
        t.start()
        t.join()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", record_fsync)
        durability.without_fsync(job)
        durability.fsync(-1)  # and the setting ends with the job
    assert calls == ["durable-worker", threading.current_thread().name]
