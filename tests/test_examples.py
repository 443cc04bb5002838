"""The examples run as written (each is a small program a user copies)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.e2e
def test_embedded_example():
    """examples/embedded.py starts a broker, round-trips a message and stops."""
    proc = _run("examples/embedded.py")
    assert proc.returncode == 0, proc.stderr
    assert "received: hello from an embedded nsqd" in proc.stdout


@pytest.mark.e2e
def test_inprocess_bus_example():
    """examples/inprocess_bus.py moves its messages over the in-process bus."""
    proc = _run("examples/inprocess_bus.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()


def test_embedded_example_passes_mypy_strict():
    """The embedding guide says its example is typed: ``mypy --strict examples/embedded.py`` passes."""
    pytest.importorskip("mypy", reason="mypy is installed by `make lint` (the lint extra)")
    proc = _run("-m", "mypy", "--strict", "--no-incremental", "examples/embedded.py", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_failing_consumer_example_fills_a_channels_dead_letters(nsqd):
    """examples/failing_consumer.py (the policies guide's dead-letter example) fails every
    message: with max_attempts=3 each is delivered three times, then it is dead."""
    import json

    import treq

    from replication_support import sleep
    from nsqtw.testing import connect_raw
    from nsqtw.testing.raw import mpub_command

    base = f"http://127.0.0.1:{nsqd.http_port}"
    for path in ("/topic/create?topic=orders", "/channel/create?topic=orders&channel=billing",
                 "/channel/config?topic=orders&channel=billing&max_attempts=3"):
        assert (await treq.post(base + path)).code == 200
    pub = await connect_raw(nsqd.tcp_port)
    pub.send(mpub_command("orders", [b"a", b"b"]))
    assert await pub.response() == b"OK"
    await pub.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "examples/failing_consumer.py", "orders", "billing",
                             f"127.0.0.1:{nsqd.tcp_port}"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    dead = {}

    async def look():
        resp = await treq.get(base + "/stats?format=json&topic=orders&include_policies=true")
        dead["n"] = json.loads(await resp.text())["topics"][0]["channels"][0]["dead_count"]

    try:
        for _ in range(500):
            await look()
            if dead["n"] == 2:
                break
            await sleep(0.02)
        assert dead["n"] == 2
    finally:
        proc.kill()
        out, _ = proc.communicate(timeout=30)
    assert sorted(line for line in out.splitlines() if line.startswith("attempt")) == sorted(
        f"attempt {n}: {body} (failing it)" for body in ("a", "b") for n in (1, 2, 3))
