"""The server-rendered pages: what each shows, escaping of everything upstream says, fragments, errors."""

from __future__ import annotations

import pytest
import pytest_twisted

from admin_helpers import call, create_channel, publish, within
from nsqtw.admin.html import Markup, commafy, el, escape, nanotohuman, percentile_label
from nsqtw.testing import command, connect_raw, identify_command

pytestmark = pytest.mark.e2e


def test_html_builder_escapes_text_and_attributes() -> None:
    """Text and attribute values are escaped; Markup from el() is not escaped twice."""
    cell = el("td", "<b>&", data_v='x" onmouseover="y', class_="num", hidden=True, title=None)
    assert cell == '<td data-v="x&quot; onmouseover=&quot;y" class="num" hidden>&lt;b&gt;&amp;</td>'
    assert el("p", el("b", "1"), " < ", [2, None, "3"]) == "<p><b>1</b> &lt; 23</p>"
    assert isinstance(escape("<"), Markup) and escape(escape("<")) == "&lt;"
    assert el("input", type="text") == '<input type="text">'


def test_number_formats_match_the_page_script() -> None:
    """commafy, nanotohuman and percentile labels read like nsqadmin's handlebars helpers."""
    assert commafy(1234567) == "1,234,567" and commafy(None) == "0"
    assert nanotohuman(529798926) == "529.8ms" and nanotohuman(1500) == "1.5us" and nanotohuman(12) == "12ns"
    assert nanotohuman(61_500_000_000) == "1m1.5s" and nanotohuman(2_000_000_000) == "2s"
    assert percentile_label(0.99) == "99<sup>th</sup>" and percentile_label(0.5) == "50<sup>th</sup>"
    assert percentile_label(0.01) == "1<sup>st</sup>"


@pytest_twisted.ensureDeferred
async def test_channel_page_escapes_what_clients_say(admin, nsqds) -> None:
    """A consumer's user agent, client id and hostname are shown escaped, never as markup."""
    consumer = await connect_raw(nsqds[0].tcp_port)
    consumer.send(identify_command(client_id='"><img src=x onerror=alert(1)>',
                                   hostname="<b>host</b>", user_agent="<script>alert(1)</script>",
                                   feature_negotiation=True))
    await within(consumer.response())
    consumer.send(command("SUB", "t", "c") + command("RDY", 7))
    assert await within(consumer.response()) == b"OK"
    try:
        code, html, headers = await call("GET", admin.url + "topics/t/c")
        assert code == 200 and headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
        assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<img src=x" not in html and "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
        assert "<b>host</b>" not in html and "&lt;b&gt;host&lt;/b&gt;" in html
        assert "Client connections" in html and ">subscribed<" in html
        assert f'data-row="client:{nsqds[0].http_address}/' in html
        assert '<td class="num" data-v="ready_count">7</td>' in html
    finally:
        await consumer.close()


@pytest_twisted.ensureDeferred
async def test_topic_page_rows_and_fragment(admin, nsqds) -> None:
    """The topic page has a row per node, a total and a row per channel; ?fragment=1 is just <main>'s content."""
    await create_channel(nsqds[0], "t", "c")
    await publish(nsqds[1], "t", [b"1", b"2"])
    code, html, _ = await call("GET", admin.url + "topics/t")
    assert code == 200 and html.startswith("<!doctype html>")
    for n in nsqds:
        assert f'data-row="node:{n.http_address}"' in html
    assert 'data-row="total"' in html and 'data-row="channel:c"' in html
    assert 'data-spark="topic/depth"' in html and 'data-api="/api/topics/t"' in html
    assert '<td class="num" data-v="depth">2</td>' in html
    code, fragment, _ = await call("GET", admin.url + "topics/t?fragment=1")
    assert code == 200 and "<html" not in fragment and "<main" not in fragment
    assert 'data-row="channel:c"' in fragment
    # the topic's finish rate adds up its channels (each gets every message): the chart says so
    assert 'data-labels="publish,finish (all channels)"' in html
    assert "finish rate of all its channels together" in html
    code, channel_page, _ = await call("GET", admin.url + "topics/t/c")
    assert code == 200 and 'data-labels="publish,finish"' in channel_page


@pytest_twisted.ensureDeferred
async def test_every_page_renders(admin, nsqds) -> None:
    """Topics, nodes, node, lookup and counter render with their headings and data."""
    await create_channel(nsqds[0], "t", "c")
    await publish(nsqds[0], "t", [b"1", b"2", b"3"])
    await within(admin.poll())
    expectations = {
        "": ['href="/topics/t"', 'data-row="topic:t"', ">Topics<"],
        "topics": ['data-row="topic:t"'],
        "nodes": [f'data-row="node:{nsqds[0].http_address}"', "nsqd nodes", ">1.3.0"],
        f"nodes/{nsqds[0].http_address}": ['data-row="topic:t"', 'data-row="channel:t/c"', ">3<"],
        "lookup": ["No nsqlookupd.", 'id="create-form"'],
        "counter": ['id="counter"', 'data-total="3"', 'data-spark="total/rate"'],
    }
    for path, needles in expectations.items():
        code, html, _ = await call("GET", admin.url + path)
        assert code == 200, path
        for needle in needles:
            assert needle in html, (path, needle)


@pytest_twisted.ensureDeferred
async def test_pages_without_data(admin) -> None:
    """Unknown topic, channel and node are HTML 404 pages that say what is missing, not tracebacks."""
    code, html, _ = await call("GET", admin.url + "topics/none")
    assert code == 404 and "TOPIC_NOT_FOUND" in html and "data-action" not in html and "<html" in html
    code, html, _ = await call("GET", admin.url + "topics/none/c")
    assert code == 404 and "TOPIC_NOT_FOUND" in html
    code, html, _ = await call("GET", admin.url + "nodes/1.2.3.4:5")
    assert code == 404 and "NODE_NOT_FOUND" in html
    code, html, _ = await call("GET", admin.url + "")
    assert code == 200 and "No topics found." in html


@pytest_twisted.ensureDeferred
async def test_upstream_failure_page(start_admin) -> None:
    """When nothing answers, pages say UPSTREAM_ERROR with status 502 and still have the navigation."""
    admin = await start_admin(nsqd_http_addresses=["127.0.0.1:1"])
    code, html, _ = await call("GET", admin.url + "topics")
    assert code == 502 and "UPSTREAM_ERROR: failed to query any nsqd" in html and 'href="/nodes"' in html


@pytest_twisted.ensureDeferred
async def test_dev_static_dir_replaces_the_packaged_assets(start_admin, nsqds, tmp_path) -> None:
    """--dev-static-dir serves /static/ from a directory (for editing the CSS/JS without reinstalling)."""
    (tmp_path / "admin.css").write_text("body { color: hotpink; }")
    admin = await start_admin(nsqd_http_addresses=[nsqds[0].http_address], dev_static_dir=str(tmp_path))
    code, css, headers = await call("GET", admin.url + "static/admin.css")
    assert (code, css) == (200, "body { color: hotpink; }")
    assert headers.getRawHeaders(b"content-type") == [b"text/css; charset=utf-8"]
    assert (await call("GET", admin.url + "static/admin.js"))[0] == 404
