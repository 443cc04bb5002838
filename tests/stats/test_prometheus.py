"""render_metrics: /stats in the Prometheus text exposition format (nsqio/nsq#732)."""

from __future__ import annotations

import json

import pytest
import pytest_twisted

from nsqtw.nsqd.stats.prometheus import CONTENT_TYPE, render_metrics


def _go_stats(fixtures_dir) -> dict:
    raw = (fixtures_dir / "go-nsqd-1.3.0-http" / "stats-json.txt").read_bytes()
    return json.loads(raw.split(b"\r\n\r\n", 1)[-1].split(b"\n\n", 1)[-1])


def _samples(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = value
    return out


def test_real_go_stats_document(fixtures_dir) -> None:
    """A real Go nsqd 1.3.0 /stats renders to the expected samples, HELP/TYPE before each family."""
    text = render_metrics(_go_stats(fixtures_dir), labels={"node": "n1:4151"}).decode()
    s = _samples(text)
    assert s['nsq_info{node="n1:4151",version="1.3.0"}'] == "1"
    assert s['nsq_healthy{node="n1:4151"}'] == "1"
    assert s['nsq_topic_messages_total{node="n1:4151",topic="events"}'] == "4"
    assert s['nsq_topic_message_bytes_total{node="n1:4151",topic="events"}'] == "14"
    assert s['nsq_channel_in_flight{node="n1:4151",topic="events",channel="archive"}'] == "2"
    assert s['nsq_channel_clients{node="n1:4151",topic="events",channel="archive"}'] == "1"
    assert s['nsq_channel_e2e_processing_latency_seconds{node="n1:4151",topic="events",channel="archive",'
             'quantile="0.99"}'] == "0.529798926"
    assert s['nsq_topic_e2e_processing_latency_samples{node="n1:4151",topic="events"}'] == "2"
    client = ('node="n1:4151",topic="events",channel="archive",client_id="worker-1",hostname="worker-1.example",'
              'remote_address="127.0.0.1:58698",user_agent="example-client/1.0"')
    assert s["nsq_client_finished_total{" + client + "}"] == "2"
    assert s["nsq_client_ready{" + client + "}"] == "5"
    assert s['nsq_producer_published_total{node="n1:4151",topic="events",client_id="worker-1",'
             'hostname="worker-1.example",remote_address="127.0.0.1:58698",'
             'user_agent="example-client/1.0"}'] == "1"
    assert s['nsq_mem_heap_objects{node="n1:4151"}'] == "3291"
    assert s['nsq_mem_gc_runs_total{node="n1:4151"}'] == "0"
    # every family: HELP then TYPE then its samples, contiguous, each family once
    lines = text.splitlines()
    seen = set()
    current = None
    for i, line in enumerate(lines):
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in seen
            seen.add(name)
            assert lines[i + 1].startswith(f"# TYPE {name} ")
            current = name
        elif not line.startswith("#"):
            assert line.split("{")[0].split(" ")[0] == current
    kinds = {ln.split()[2]: ln.split()[3] for ln in lines if ln.startswith("# TYPE ")}
    assert all(k == "counter" for n, k in kinds.items() if n.endswith("_total"))
    assert all(k == "gauge" for n, k in kinds.items() if not n.endswith("_total"))
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_parses_with_prometheus_client(fixtures_dir) -> None:
    """The official Python parser accepts the page and sees counters and quantile labels."""
    parser = pytest.importorskip("prometheus_client.parser")
    text = render_metrics(_go_stats(fixtures_dir)).decode()
    families = {f.name: f for f in parser.text_string_to_metric_families(text)}
    assert families["nsq_topic_messages"].type == "counter"
    assert families["nsq_channel_depth"].type == "gauge"
    qs = {s.labels["quantile"] for s in families["nsq_topic_e2e_processing_latency_seconds"].samples}
    assert qs == {"0.99", "0.5"}


def test_label_escaping_and_empty_doc() -> None:
    """Label values escape backslash, quote and newline; a node without topics still renders."""
    doc = {"version": "1.3.0", "health": "NOK - disk\nfull", "start_time": 5, "topics": None,
           "producers": [{"client_id": 'a"b\\c', "hostname": "h", "remote_address": "r", "user_agent": "u\nx",
                          "pub_counts": [{"topic": "t", "count": 3}]}]}
    text = render_metrics(doc).decode()
    assert "nsq_healthy 0" in text and "nsq_topics 0" in text and "nsq_start_time_seconds 5" in text
    assert 'client_id="a\\"b\\\\c"' in text and 'user_agent="u\\nx"' in text
    assert "nsq_mem_" not in text


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_klein_metrics_route_on_live_broker(nsqd) -> None:
    """A klein /metrics route serving render_metrics(broker_stats(...)) answers a real HTTP GET."""
    import treq
    from klein import Klein
    from twisted.internet import reactor
    from twisted.web.server import Site

    from nsqtw.nsqd.stats.snapshot import broker_stats

    app = Klein()

    @app.route("/metrics")
    def metrics(request):
        request.setHeader("Content-Type", CONTENT_TYPE)
        return render_metrics(broker_stats(nsqd._broker, nsqd._service.now()))

    nsqd._broker.publish("clicks", [b"a", b"b", b"c"], nsqd._service.now())
    port = reactor.listenTCP(0, Site(app.resource()), interface="127.0.0.1")
    try:
        resp = await treq.get(f"http://127.0.0.1:{port.getHost().port}/metrics")
        body = (await resp.content()).decode()
        assert resp.headers.getRawHeaders("content-type")[0] == CONTENT_TYPE
        assert 'nsq_topic_messages_total{topic="clicks"} 3' in body
        assert 'nsq_topic_depth{topic="clicks"} 3' in body
    finally:
        await port.stopListening()
