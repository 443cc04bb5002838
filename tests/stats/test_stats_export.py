"""--stats-export-path: hourly JSON Lines snapshots of /stats, written off the reactor thread."""

from __future__ import annotations

import json
import os

import pytest
import pytest_twisted

from nsqtw.nsqd.stats.export import (StatsExportService, export_filename, host_key, node_identity,
                                snapshot_line)
from nsqtw.nsqd.stats.snapshot import broker_stats, go_json

from stats_fakes import make_node, run_inline


def _lines(path: str) -> list:
    with open(path, "rb") as f:
        return f.read().splitlines()


def test_host_key_like_statsd() -> None:
    """The file's host key is statsd's: broadcast address and HTTP port with . and : as _."""
    assert host_key("10.0.0.1", 4151) == "10_0_0_1_4151"
    assert host_key("::1", 4151) == "[__1]_4151"


def test_snapshot_line_embeds_stats_byte_for_byte(clock) -> None:
    """The ``stats`` member is exactly go_json(/stats), wrapped with node identity and time."""
    node = make_node(clock)
    node.broker.publish("t", [b"a", b"bb"], clock.seconds())
    doc = broker_stats(node.broker, clock.seconds())
    ident = node_identity(node, "myhost")
    line = snapshot_line(clock.seconds(), ident, doc)
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    assert b',"stats":' + go_json(doc) + b"}\n" in line
    rec = json.loads(line)
    assert rec["timestamp"] == 1_700_000_000
    assert rec["time"] == "2023-11-14T22:13:20.000Z"
    assert rec["node"] == {"broadcast_address": "node1.example", "hostname": "myhost",
                           "tcp_port": 4150, "http_port": 4151}
    assert rec["stats"]["topics"][0]["message_count"] == 2


def test_broadcast_ports_win_over_bound_ports(clock) -> None:
    """--broadcast-tcp/http-port, when set, identify the node instead of the bound ports."""
    node = make_node(clock, broadcast_tcp_port=5150, broadcast_http_port=5151)
    ident = node_identity(node, "h")
    assert (ident["tcp_port"], ident["http_port"]) == (5150, 5151)
    assert export_filename(0, ident) == "nsqd-stats.1970-01-01_00.node1_example_5151.jsonl"


def test_interval_driven_by_clock_and_hourly_files(clock, tmp_path) -> None:
    """One line per interval on the injected clock; a new file when the UTC hour changes."""
    node = make_node(clock)
    svc = StatsExportService(node, path=str(tmp_path), interval=10.0, run_in_thread=run_inline,
                             hostname="h")
    svc.startService()
    assert os.listdir(tmp_path) == []
    node.broker.publish("orders", [b"x"], clock.seconds())
    clock.advance(9.9)
    assert not list(tmp_path.iterdir())
    clock.advance(0.1)
    first = tmp_path / "nsqd-stats.2023-11-14_22.node1_example_4151.jsonl"
    assert _lines(str(first)) and len(_lines(str(first))) == 1
    for _ in range(5):
        clock.advance(10)
    assert len(_lines(str(first))) == 6
    # 22:14:20 + 46 min -> past 23:00
    for _ in range(300):
        clock.advance(10)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["nsqd-stats.2023-11-14_22.node1_example_4151.jsonl",
                     "nsqd-stats.2023-11-14_23.node1_example_4151.jsonl"]
    total = sum(len(_lines(str(tmp_path / n))) for n in names)
    assert total == 306
    recs = [json.loads(x) for x in _lines(str(tmp_path / names[1]))]
    assert all(r["time"].startswith("2023-11-14T23:") for r in recs)
    assert recs[0]["stats"]["topics"][0]["topic_name"] == "orders"
    assert recs[0]["stats"]["start_time"] == 1_700_000_000
    svc.stopService()
    assert svc.written == 306


def test_stopped_service_stops_writing(clock, tmp_path) -> None:
    """After stopService no more snapshots are taken."""
    node = make_node(clock)
    svc = StatsExportService(node, path=str(tmp_path), interval=1.0, run_in_thread=run_inline)
    svc.startService()
    clock.advance(1)
    svc.stopService()
    clock.advance(10)
    assert svc.written == 1


def test_refuses_empty_path(clock) -> None:
    """An export service without --stats-export-path is a configuration error."""
    with pytest.raises(ValueError):
        StatsExportService(make_node(clock), path="")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_attached_to_running_nsqd_writes_in_a_thread(nsqd, tmp_path) -> None:
    """Attached with setServiceParent to a live NsqdService, it writes from its worker thread."""
    import threading

    nsqd._broker.publish("live", [b"m"] * 3, nsqd._service.now())
    svc = StatsExportService(nsqd._service, path=str(tmp_path / "stats"), interval=3600.0)
    seen = []
    orig = svc._write

    def spy(*args):
        seen.append(threading.current_thread().name)
        return orig(*args)

    svc._write = spy
    svc.setServiceParent(nsqd._service)
    assert svc.running
    written = await svc.snapshot_now()
    assert os.path.basename(written).endswith(f"127_0_0_1_{nsqd.http_port}.jsonl")
    rec = json.loads(_lines(written)[-1])
    assert rec["node"]["tcp_port"] == nsqd.tcp_port
    assert rec["stats"]["topics"][0]["topic_name"] == "live"
    assert rec["stats"]["topics"][0]["depth"] == 3
    assert seen and seen[0] != threading.current_thread().name
    await svc.disownServiceParent()
    assert not svc.running
