"""nsq_to_nsq between two live brokers: copy to a destination topic, round-robin over two
destinations, JSON filtering exactly as Go (require field/value, whitelist re-marshal, drop
non-JSON, backoff on a missing required field)."""

from __future__ import annotations

import json

import pytest
import pytest_twisted

from nsqtw.options import OptionError
from nsqtw.tools.nsq_to_nsq import JsonFilter, NsqToNsq, ToNsqdOptions, go_json_marshal

from tools_support import tool_options, wait_for, within


def publish(nsqd, topic: str, bodies) -> None:
    nsqd._broker.publish(topic, list(bodies), nsqd._service.now())
    nsqd._service.settle()


def test_go_json_marshal():
    """Sorted keys, compact, HTML-escaped, integral floats without a fraction, Go's exponents."""
    doc = {"b": 1.5e-05, "a": [1, 2.0, 1e21, 1.5e-07, "<&>"], "c": None, "d": True}
    assert go_json_marshal(doc) == '{"a":[1,2,1e+21,1.5e-7,"\\u003c\\u0026\\u003e"],"b":0.000015,"c":null,"d":true}'


@pytest.mark.parametrize("field,value,doc,expected", [
    ("kind", "", {"kind": 1}, (True, False)),
    ("kind", "", {"other": 1}, (False, False)),
    ("kind", "click", {"other": 1}, (False, True)),      # missing field with a value required: backoff
    ("kind", "click", {"kind": "click"}, (True, False)),
    ("kind", "click", {"kind": "view"}, (False, False)),
    ("n", "3", {"n": 3}, (True, False)),                  # a number compared as a number
    ("n", "3", {"n": 3.0}, (True, False)),
    ("n", "3", {"n": "3.0"}, (False, False)),             # a string compared as a string
    ("n", "3", {"n": True}, (False, False)),
    ("n", "x", {"n": [1]}, (False, False)),
])
def test_should_pass(field, value, doc, expected):
    """Go's shouldPassMessage, case by case."""
    assert JsonFilter(field, value).should_pass(doc) == expected


def test_flag_checks():
    """Go's refusals: a destination is required, names are validated."""
    with pytest.raises(OptionError, match="--destination-nsqd-tcp-address required"):
        tool_options(ToNsqdOptions, "--topic=t", "--nsqd-tcp-address=a:1")
    with pytest.raises(OptionError, match="--topic and --channel are required"):
        tool_options(ToNsqdOptions, "--nsqd-tcp-address=a:1", "--destination-nsqd-tcp-address=b:2")
    with pytest.raises(OptionError, match="--destination-topic is invalid"):
        tool_options(ToNsqdOptions, "--topic=t", "--nsqd-tcp-address=a:1", "--destination-nsqd-tcp-address=b:2",
                     "--destination-topic=bad topic")


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_copy_between_brokers(nsqd, nsqtw_nsqd_factory):
    """Everything on source topic 'src' reaches the other broker's 'dst', FINed at the source."""
    dest = await nsqtw_nsqd_factory()
    bodies = [b"msg %d" % i for i in range(25)]
    publish(nsqd, "src", bodies)
    app = NsqToNsq(tool_options(ToNsqdOptions, "--topic=src", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                f"--destination-nsqd-tcp-address={dest.tcp_address}", "--destination-topic=dst"))
    await within(app.start())
    await wait_for(lambda: dest.depth("dst") == 25, what="25 copied")
    await within(app.stop())
    channel = nsqd._broker.topics["src"].channels["nsq_to_nsq"]
    assert channel.depth() == 0 and not channel.inflight
    got = await dest.wait_for_messages("dst", "check", 25)
    assert sorted(m.body for m in got) == sorted(bodies)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_round_robin_two_destinations_same_topic(nsqd, nsqtw_nsqd_factory):
    """--mode=round-robin with two destinations: half each, on the source topic's name."""
    d1, d2 = await nsqtw_nsqd_factory(), await nsqtw_nsqd_factory()
    publish(nsqd, "rr", [b"%d" % i for i in range(10)])
    app = NsqToNsq(tool_options(ToNsqdOptions, "--topic=rr", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                "--mode=round-robin", f"--destination-nsqd-tcp-address={d1.tcp_address}",
                                f"--destination-nsqd-tcp-address={d2.tcp_address}"))
    await within(app.start())
    await wait_for(lambda: d1.depth("rr") + d2.depth("rr") == 10, what="ten copied")
    assert d1.depth("rr") == d2.depth("rr") == 5
    await within(app.stop())


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_json_filtering(nsqd, nsqtw_nsqd_factory):
    """require field+value and a whitelist: matching objects are re-marshalled with the whitelisted
    fields; mismatches and non-JSON are dropped (FIN); a missing field is REQueued with backoff."""
    dest = await nsqtw_nsqd_factory()
    publish(nsqd, "js", [
        json.dumps({"kind": "click", "user": 7, "x": 1.0, "secret": "s"}).encode(),
        json.dumps({"kind": "view", "user": 8}).encode(),
        b"not json",
        b"[1, 2]",
        json.dumps({"kind": "click", "user": 9, "z": "<b>"}).encode(),
    ])
    app = NsqToNsq(tool_options(ToNsqdOptions, "--topic=js", f"--nsqd-tcp-address={nsqd.tcp_address}",
                                f"--destination-nsqd-tcp-address={dest.tcp_address}", "--require-json-field=kind",
                                "--require-json-value=click", "--whitelist-json-field=user",
                                "--whitelist-json-field=x", "--whitelist-json-field=z"))
    await within(app.start())
    await wait_for(lambda: dest.depth("js") == 2 and app.dropped == 3, what="two passed, three dropped")
    got = sorted(m.body for m in await dest.wait_for_messages("js", "check", 2))
    assert got == [b'{"user":7,"x":1}', b'{"user":9,"z":"\\u003cb\\u003e"}']
    # a missing required field: backoff, the message goes back to nsqd
    publish(nsqd, "js", [b'{"user": 10}'])
    await wait_for(lambda: app.consumers[0].messages_requeued >= 1, what="requeued")
    await within(app.stop())
    channel = nsqd._broker.topics["js"].channels["nsq_to_nsq"]
    assert len(channel.deferred) == 1 and not channel.inflight  # REQ with go-nsq's delay
