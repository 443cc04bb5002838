"""Router-level behaviour of nsqd's HTTP listener that comes from httprouter v1.3.0 and Go's url.ParseQuery
(nsqd/http.go newHTTPServer, internal/http_api): OPTIONS, HEAD, trailing-slash and case redirects, and
malformed query strings."""

from __future__ import annotations

import pytest
import pytest_twisted

from nsqd_http_helpers import raw_http

pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_options_answers_allow(nsqd):
    """OPTIONS /pub: 200 with 'Allow: OPTIONS, POST' and no body."""
    ours = await raw_http(nsqd.http_port, "OPTIONS", "/pub")
    assert (ours.status, ours.body) == (200, b"")
    assert ours.header("allow") == "OPTIONS, POST"


@pytest_twisted.ensureDeferred
async def test_head_is_method_not_allowed(nsqd):
    """HEAD on a GET-only route is 405 with Allow, as for any unregistered method."""
    ours = await raw_http(nsqd.http_port, "HEAD", "/ping")
    assert ours.status == 405
    assert ours.header("allow") == "GET, OPTIONS"


@pytest.mark.parametrize("path", ["/ping/", "/PING", "/Stats"])
@pytest_twisted.ensureDeferred
async def test_trailing_slash_and_case_redirect(nsqd, path):
    """A GET whose path differs from a route by a trailing slash or by case is redirected to it (301)."""
    ours = await raw_http(nsqd.http_port, "GET", path)
    assert ours.status == 301
    assert ours.header("location").rstrip("/").lower() == path.rstrip("/").lower()


@pytest.mark.parametrize("method,path", [
    ("GET", "/stats?format=json&topic=%zz"),
    ("GET", "/stats?format=json;x=1"),
    ("POST", "/pub?topic=%zz"),
    ("POST", "/pub?topic=t;x"),
])
@pytest_twisted.ensureDeferred
async def test_malformed_query_is_invalid_request(nsqd, method, path):
    """A query string Go cannot parse is 400 INVALID_REQUEST."""
    ours = await raw_http(nsqd.http_port, method, path, b"x" if method == "POST" else None)
    assert (ours.status, ours.body) == (400, b'{"message":"INVALID_REQUEST"}')


@pytest_twisted.ensureDeferred
async def test_percent_encoded_query_is_decoded(nsqd):
    """Well-formed %-escapes and '+' in the query are decoded as Go's ParseQuery does."""
    ours = await raw_http(nsqd.http_port, "POST", "/pub?topic=%74%2Dx", b"x")
    assert (ours.status, ours.body) == (200, b"OK")
    assert "t-x" in nsqd._broker.topics
    ours = await raw_http(nsqd.http_port, "POST", "/pub?topic=a+b", b"x")
    assert (ours.status, ours.body) == (400, b'{"message":"INVALID_TOPIC"}')


@pytest.mark.parametrize("value", ["1_000", "%2010", "10%20"])
@pytest_twisted.ensureDeferred
async def test_defer_parsed_like_go_parseint(nsqd, value):
    """defer= must be a plain base-10 integer (an optional sign allowed), nothing else."""
    ours = await raw_http(nsqd.http_port, "POST", f"/pub?topic=t&defer={value}", b"x")
    assert (ours.status, ours.body) == (400, b'{"message":"INVALID_DEFER"}')


@pytest_twisted.ensureDeferred
async def test_defer_with_plus_sign_is_accepted(nsqd):
    """ParseInt accepts a leading '+' (here %2B), so does nsqtw."""
    ours = await raw_http(nsqd.http_port, "POST", "/pub?topic=t&defer=%2B10", b"x")
    assert (ours.status, ours.body) == (200, b"OK")


@pytest_twisted.ensureDeferred
async def test_config_log_level_is_not_stripped(nsqd):
    """A log level with a trailing newline is not a log level for nsqd."""
    ours = await raw_http(nsqd.http_port, "PUT", "/config/log_level", b"debug\n")
    assert (ours.status, ours.body) == (400, b'{"message":"INVALID_VALUE"}')


@pytest_twisted.ensureDeferred
async def test_config_log_level_case_insensitive(nsqd):
    """The level name is matched case-insensitively and answered as its number."""
    ours = await raw_http(nsqd.http_port, "PUT", "/config/log_level", b"WARN")
    assert (ours.status, ours.body) == (200, b"3")


@pytest_twisted.ensureDeferred
async def test_config_lookupd_addresses_null(nsqd):
    """PUT /config/nsqlookupd_tcp_addresses with JSON null clears the list."""
    ours = await raw_http(nsqd.http_port, "PUT", "/config/nsqlookupd_tcp_addresses", b"null")
    assert (ours.status, ours.body) == (200, b"null")
