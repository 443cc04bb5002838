"""nsqd's own flags turn the exporters on: /metrics, --stats-export-path, --statsd-address."""

from __future__ import annotations

import pytest
import pytest_twisted
import treq
from twisted.internet import defer, protocol, reactor

from nsqtw.embed import start_nsqd


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_metrics_route_serves_prometheus_text(nsqd):
    """GET /metrics answers the Prometheus exposition of /stats."""
    r = await treq.post(f"http://{nsqd.http_address}/pub?topic=m", b"x")
    assert r.code == 200
    r = await treq.get(f"http://{nsqd.http_address}/metrics")
    body = (await r.content()).decode()
    assert r.code == 200 and r.headers.getRawHeaders("content-type")[0].startswith("text/plain")
    assert 'nsq_topic_messages_total{topic="m"} 1' in body


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_export_and_statsd_services_start_from_options(tmp_path):
    """--stats-export-path and --statsd-address add their services to nsqd's tree."""
    received = defer.Deferred()

    class Sink(protocol.DatagramProtocol):
        def datagramReceived(self, data, addr):
            if not received.called:
                received.callback(data)

    port = reactor.listenUDP(0, Sink(), interface="127.0.0.1")
    nsqd = await start_nsqd(stats_export_path=str(tmp_path), stats_export_interval=0.05,
                            statsd_address=f"127.0.0.1:{port.getHost().port}", statsd_interval=1.5)
    try:
        names = {s.__class__.__name__ for s in nsqd._service}
        assert {"StatsExportService", "StatsdService"} <= names
        data = await received.addTimeout(10, reactor)
        assert b"|g" in data or b"|c" in data
    finally:
        await nsqd.stop()
        await port.stopListening()
