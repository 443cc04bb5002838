"""A round trip through an independent NSQ client: pynsq (Tornado) in a subprocess publishes with its Writer
and consumes with its Reader against an nsqd embedded in the test's reactor."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

pytestmark = pytest.mark.e2e

pytest.importorskip("nsq", reason="pynsq is not installed")

SCRIPT = textwrap.dedent(r'''
    import json, sys
    import nsq
    import tornado.ioloop

    addr, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loop = tornado.ioloop.IOLoop.current()
    received, acked, errors = [], [0], []

    def handler(msg):
        received.append(msg.body.decode())
        if len(received) == n:
            # give the Reader's automatic FINs a moment to reach nsqd before closing
            loop.call_later(0.3, finish)
        return True

    def finish():
        print("RESULT " + json.dumps({"received": received, "acked": acked[0], "errors": errors}))
        sys.stdout.flush()
        loop.stop()

    def on_pub(conn, data):
        if isinstance(data, nsq.Error):
            errors.append(str(data))
        else:
            acked[0] += 1

    writer = nsq.Writer([addr])
    reader = nsq.Reader(topic=topic, channel="pynsq", nsqd_tcp_addresses=[addr], message_handler=handler,
                        max_in_flight=25, user_agent="pynsq-conformance")
    sent = [False]

    def try_publish():
        if sent[0] or not writer.conns or not reader.conns:
            return
        sent[0] = True
        half = n // 2
        for i in range(half):
            writer.pub(topic, ("single-%d" % i).encode(), callback=on_pub)
        writer.mpub(topic, [("multi-%d" % i).encode() for i in range(half, n)], callback=on_pub)

    tornado.ioloop.PeriodicCallback(try_publish, 20).start()
    loop.call_later(25, lambda: (print("TIMEOUT " + json.dumps({"received": len(received)})), loop.stop()))
    loop.start()
''')

N = 200


@pytest.mark.nsqd_options(e2e_processing_latency_percentiles=[1.0])
@pytest_twisted.ensureDeferred
async def test_pynsq_writer_and_reader_round_trip(nsqd, tmp_path):
    """pynsq's Writer publishes N messages (PUB and MPUB) and its Reader receives and FINs every one;
    /stats agrees: N published, N delivered, N finished, nothing left."""
    script = tmp_path / "pynsq_round_trip.py"
    script.write_text(SCRIPT)
    d = getProcessOutputAndValue(sys.executable, [str(script), nsqd.tcp_address, "pynsq_topic", str(N)],
                                 env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    d.addTimeout(60, reactor)
    out, err, code = await d
    text = out.decode()
    assert code == 0, err.decode()[-2000:]
    line = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    assert line, f"pynsq did not finish: {text[-500:]} {err.decode()[-2000:]}"
    result = json.loads(line[0][len("RESULT "):])
    expected = [f"single-{i}" for i in range(N // 2)] + [f"multi-{i}" for i in range(N // 2, N)]
    assert sorted(result["received"]) == sorted(expected)
    assert result["errors"] == [] and result["acked"] == N // 2 + 1

    resp = await treq.get(f"http://{nsqd.http_address}/stats?format=json&topic=pynsq_topic")
    stats = json.loads(await resp.content())
    topic = stats["topics"][0]
    assert topic["topic_name"] == "pynsq_topic" and topic["message_count"] == N
    ch = topic["channels"][0]
    assert ch["channel_name"] == "pynsq"
    assert (ch["message_count"], ch["depth"], ch["in_flight_count"], ch["requeue_count"], ch["timeout_count"]) \
        == (N, 0, 0, 0, 0)
    assert ch["e2e_processing_latency"]["count"] == N  # one latency sample per FIN
