"""AUTH against the reference auth server in examples/: every error code, TTL re-query, the
request formats nsqd sends, and nsqtw's client sending its auth_secret."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import defer, endpoints, reactor
from twisted.web.server import Site

from nsqtw.client import Config, Consumer, Producer
from nsqtw.embed import start_nsqd
from nsqtw.testing import body_command, command, connect_raw, identify_command

pytestmark = pytest.mark.e2e

_spec = importlib.util.spec_from_file_location(
    "auth_server_example", Path(__file__).resolve().parents[2] / "examples" / "auth_server.py")
auth_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auth_example)

GRANTS = {"secrets": {
    "good": {"identity": "alice", "identity_url": "https://example.com/alice", "ttl": 3600,
             "authorizations": [
                 {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["subscribe"]},
                 {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}]},
    "short": {"identity": "bob", "ttl": 1,
              "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
    "tlsonly": {"identity": "carol", "require_tls": True, "ttl": 60,
                "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}]},
}}


@pytest_twisted.async_yield_fixture
async def authd(tmp_path):
    path = tmp_path / "grants.json"
    path.write_text(json.dumps(GRANTS))
    server = auth_example.AuthServer(str(path))
    port = await endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(Site(server.app.resource()))
    server.address = f"127.0.0.1:{port.getHost().port}"
    server.path = path
    yield server
    await port.stopListening()


@pytest_twisted.async_yield_fixture
async def secured(authd):
    nsqd = await start_nsqd(auth_http_addresses=[authd.address])
    yield nsqd
    await nsqd.stop()


async def _identified(nsqd):
    raw = await connect_raw(nsqd.tcp_port)
    raw.send(identify_command(feature_negotiation=True))
    answer = json.loads(await raw.response())
    assert answer["auth_required"] is True
    return raw


@pytest_twisted.ensureDeferred
async def test_auth_then_allowed_and_unauthorized(secured, authd):
    """AUTH answers identity and permission count; allowed commands run, others are E_UNAUTHORIZED."""
    raw = await _identified(secured)
    raw.send(body_command("AUTH", body=b"good"))
    assert json.loads(await raw.response()) == {
        "identity": "alice", "identity_url": "https://example.com/alice", "permission_count": 2}
    raw.send(body_command("PUB", "orders", body=b"x"))
    assert await raw.response() == b"OK"
    raw.send(body_command("PUB", "other", body=b"x"))
    assert await raw.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'
    await raw.closed
    assert authd.requests[0] == {"common_name": "", "remote_ip": "127.0.0.1", "secret": "good", "tls": "false"}


@pytest_twisted.ensureDeferred
async def test_sub_permission_and_wrong_channel(secured):
    """SUB needs subscribe on topic and channel: billing is allowed, shipping is not."""
    raw = await _identified(secured)
    raw.send(body_command("AUTH", body=b"good") + command("SUB", "orders", "shipping"))
    await raw.response()
    assert await raw.error() == b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "shipping"'
    raw2 = await _identified(secured)
    raw2.send(body_command("AUTH", body=b"good") + command("SUB", "orders", "billing"))
    await raw2.response()
    assert await raw2.response() == b"OK"
    await raw2.close()


@pytest.mark.parametrize("cmd", [command("SUB", "orders", "billing"), body_command("PUB", "orders", body=b"x"),
                                 body_command("DPUB", "orders", 10, body=b"x"),
                                 body_command("MPUB", "orders", body=b"\x00\x00\x00\x01\x00\x00\x00\x01x")])
@pytest_twisted.ensureDeferred
async def test_auth_first(secured, cmd):
    """Before AUTH, SUB/PUB/DPUB/MPUB are E_AUTH_FIRST (fatal)."""
    raw = await _identified(secured)
    raw.send(cmd)
    err = await raw.error()
    assert err.startswith(b"E_AUTH_FIRST AUTH required before ")
    await raw.closed


@pytest_twisted.ensureDeferred
async def test_unknown_secret_and_tls_only_grant_are_unauthorized(secured):
    """A secret with no authorizations (or a TLS-only grant over TCP) is E_UNAUTHORIZED."""
    for secret in (b"nope", b"tlsonly"):
        raw = await _identified(secured)
        raw.send(body_command("AUTH", body=secret))
        assert await raw.error() == b"E_UNAUTHORIZED AUTH no authorizations found"
        await raw.closed


@pytest_twisted.ensureDeferred
async def test_auth_server_down_is_auth_failed():
    """No auth server answering: E_AUTH_FAILED AUTH failed (the reason is logged, not sent)."""
    nsqd = await start_nsqd(auth_http_addresses=["127.0.0.1:1"], http_client_request_timeout=2.0)
    try:
        raw = await _identified(nsqd)
        raw.send(body_command("AUTH", body=b"good"))
        assert await raw.error() == b"E_AUTH_FAILED AUTH failed"
        await raw.closed
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_auth_disabled_and_auth_twice(nsqd, secured):
    """Without --auth-http-address AUTH is E_AUTH_DISABLED; a second AUTH is E_INVALID."""
    raw = await connect_raw(nsqd.tcp_port)
    raw.send(body_command("AUTH", body=b"x"))
    assert await raw.error() == b"E_AUTH_DISABLED AUTH disabled"
    raw2 = await _identified(secured)
    raw2.send(body_command("AUTH", body=b"good") + body_command("AUTH", body=b"good"))
    await raw2.response()
    assert await raw2.error() == b"E_INVALID AUTH already set"


@pytest_twisted.ensureDeferred
async def test_ttl_expiry_requeries_the_auth_server(secured, authd):
    """When the TTL runs out, the next PUB asks the auth server again (with the same secret)."""
    raw = await _identified(secured)
    raw.send(body_command("AUTH", body=b"short"))
    await raw.response()
    client = next(c for c in secured._broker.clients.values() if c.auth is not None)
    client.auth.expires = 0  # the 1 s TTL has passed
    asked = len(authd.requests)
    raw.send(body_command("PUB", "anything", body=b"x"))
    assert await raw.response() == b"OK"
    assert len(authd.requests) == asked + 1 and authd.requests[-1]["secret"] == "short"
    assert client.auth.expires > 0


@pytest_twisted.ensureDeferred
async def test_post_method_sends_json_arrays(authd):
    """--auth-http-request-method=post sends a JSON object of arrays."""
    nsqd = await start_nsqd(auth_http_addresses=[authd.address], auth_http_request_method="post")
    try:
        raw = await _identified(nsqd)
        raw.send(body_command("AUTH", body=b"good"))
        assert json.loads(await raw.response())["identity"] == "alice"
        assert authd.requests[-1]["secret"] == "good" and authd.requests[-1]["tls"] == "false"
    finally:
        await nsqd.stop()


@pytest_twisted.ensureDeferred
async def test_client_library_sends_auth_secret(secured):
    """nsqtw's Producer and Consumer AUTH with auth_secret and work within their grant."""
    config = Config(auth_secret="good")
    producer = Producer(secured.tcp_address, config)
    await producer.publish("orders", b"paid")
    got = defer.Deferred()
    consumer = Consumer("orders", "billing", lambda m: got.callback(m.body) if not got.called else None, config)
    await consumer.connect_to_nsqd(secured.tcp_address)
    assert await got.addTimeout(10, reactor) == b"paid"
    stats = [c for c in secured._broker.clients.values() if c.auth is not None]
    assert stats and all(c.auth.identity == "alice" for c in stats)
    await consumer.stop()
    await producer.stop()
