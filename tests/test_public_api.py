"""The public face is small and pinned: what each public module exports (``__all__``), that every name
it names exists, and that every other top-level package says it is internal.  A change to the public
API fails here first, on purpose: update the pin, the API reference (docs/api/) and the changelog
together."""

from __future__ import annotations

import configparser
import importlib
import pkgutil
from pathlib import Path

import pytest
import pytest_twisted

import nsqtw

ROOT = Path(__file__).resolve().parent.parent

PUBLIC: dict[str, list[str]] = {
    "nsqtw.embed": [
        "start_nsqd", "NsqdHandle", "MessagesLost", "NsqdOptions", "EMBEDDED_NSQD_DEFAULTS",
        "embedded_nsqd_options", "start_nsqlookupd", "LookupdHandle", "LookupdOptions",
        "EMBEDDED_LOOKUPD_DEFAULTS", "start_nsqadmin", "AdminHandle", "AdminOptions", "EMBEDDED_ADMIN_DEFAULTS",
    ],
    "nsqtw.client": [
        "Config", "apply_flags", "BackoffStrategy", "ExponentialStrategy", "FullJitterStrategy", "Producer",
        "HTTPProducer", "Consumer", "ConsumerStats", "Message", "NSQConnection", "ConnectionDelegate", "connect",
        "register_inprocess", "NSQError", "ClientError", "NotConnected", "Stopped", "ProtocolError",
        "IdentifyError", "AuthRequired", "AlreadyConnected", "OverMaxInFlight", "Closing", "ConfigError",
    ],
    "nsqtw.testing": [
        "RawV2Client", "connect_raw", "command", "body_command", "identify_command", "mpub_command",
        "decode_frames", "FRAME_RESPONSE", "FRAME_ERROR", "FRAME_MESSAGE",
    ],
    "nsqtw.testing.pytest_plugin": [
        "NsqdFixture", "LookupdFixture", "ClusterFixture", "nsqtw_nsqd", "nsqtw_nsqd_factory", "nsqtw_lookupd",
        "nsqtw_cluster", "nsqtw_clock", "nsqtw_reactor", "start_nsqd_fixture", "start_lookupd_fixture",
        "start_cluster_fixture", "replication_security_options", "fast_data_dir",
    ],
    "nsqtw.options": [
        "OptionError", "NsqdOptions", "parse_duration", "format_duration", "option_fields", "nsq_default",
        "with_embedding_defaults", "options_from_strings", "config_value", "LOG_LEVELS",
    ],
    "nsqtw.errors": [
        "NSQError", "Invalid", "BadProtocol", "BadBody", "BadTopic", "BadChannel", "BadMessage", "PubFailed",
        "MPubFailed", "DPubFailed", "FinFailed", "ReqFailed", "TouchFailed", "SubFailed", "IdentifyFailed",
        "AuthFirst", "AuthFailed", "Unauthorized", "AuthDisabled", "AuthError", "from_wire", "BrokerError",
        "TopicNotFound", "ChannelNotFound", "Exiting", "QueueFull", "BackendError", "HTTPAPIError",
    ],
}

#: top-level names that are public without an ``__all__`` pin: the package root, and the Spark jobs
#: (public through their commands, pinned below)
PUBLIC_TOP = {"embed", "client", "testing", "options", "errors", "spark"}

#: console scripts and the pytest plugin: the public entry points (setup.cfg)
ENTRY_POINTS = {
    "nsqd": "nsqtw.cli:nsqd_main", "nsqlookupd": "nsqtw.cli:nsqlookupd_main",
    "nsqadmin": "nsqtw.cli:nsqadmin_main", "nsq_tail": "nsqtw.tools.tail:main", "to_nsq": "nsqtw.tools.to_nsq:main",
    "nsq_to_file": "nsqtw.tools.to_file:main", "nsq_to_http": "nsqtw.tools.to_http:main",
    "nsq_to_nsq": "nsqtw.tools.nsq_to_nsq:main", "nsq_stat": "nsqtw.tools.stat:main",
    "nsqtw-stats": "nsqtw.spark.stats:main", "nsqtw-replay": "nsqtw.spark.replay:main",
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_module_exports_are_pinned(module: str) -> None:
    mod = importlib.import_module(module)
    assert list(mod.__all__) == PUBLIC[module]
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


def test_the_embedding_face_re_exports_the_components() -> None:
    """nsqtw.embed hands on the components' own objects (one class per handle, not a copy)."""
    from nsqtw import embed
    from nsqtw.admin.embed import AdminHandle
    from nsqtw.lookupd.embed import LookupdHandle
    from nsqtw.nsqd.embed import NsqdHandle

    assert (embed.NsqdHandle, embed.LookupdHandle, embed.AdminHandle) == (NsqdHandle, LookupdHandle, AdminHandle)


def test_every_other_package_says_it_is_internal() -> None:
    internal = []
    for info in pkgutil.iter_modules(nsqtw.__path__):
        if info.name in PUBLIC_TOP:
            continue
        doc = importlib.import_module(f"nsqtw.{info.name}").__doc__ or ""
        if "Internal:" not in doc:
            internal.append(info.name)
    assert internal == []


def test_entry_points_are_pinned() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    assert scripts == ENTRY_POINTS
    assert cfg["options.entry_points"]["pytest11"].strip() == "nsqtw = nsqtw.testing.pytest_plugin"
    for target in ENTRY_POINTS.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_an_embedded_nsqd_handle_gives_addresses_stats_and_stop() -> None:
    """What the embedding snippet uses: the addresses, stats() of a topic, stop()."""
    from nsqtw.client import Producer
    from nsqtw.embed import start_nsqd

    nsqd = await start_nsqd()
    try:
        assert nsqd.tcp_address.startswith("127.0.0.1:") and (nsqd.http_address or "").startswith("127.0.0.1:")
        producer = Producer(nsqd.tcp_address)
        await producer.multi_publish("orders", [b"a", b"b"])
        await producer.stop()
        [topic] = nsqd.stats(topic="orders")["topics"]
        assert topic["topic_name"] == "orders" and topic["depth"] == 2 and topic["message_count"] == 2
        assert not nsqd.stats(topic="nothing")["topics"]  # null, as Go's nsqd answers
    finally:
        await nsqd.stop()
