"""A daemon imports only what it uses (issue 47).

Each drop-in daemon is started as its real entry point in a subprocess (``lean_driver.py``),
asked over HTTP (so its HTTP API is built and serving), stopped with SIGTERM, and the modules it
had imported are checked: nothing of nsqadmin, the client, Spark, the tools or pyspark in nsqd or
nsqlookupd; no TLS stack (pyOpenSSL, cryptography) unless the options ask for TLS, and then TLS
works; the web framework present where HTTP is served.  The finder behind it
(:mod:`nsqtw.runtime.lean`) is checked in a subprocess of its own too, since it changes the
process it runs in.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().parent / "lean_driver.py"

#: never in an nsqd or an nsqlookupd
FOREIGN = ("nsqtw.admin", "nsqtw.client", "nsqtw.spark", "nsqtw.tools", "nsqtw.allinone", "nsqtw.testing",
           "nsqtw.embed", "pyspark", "treq", "py4j")
TLS_STACK = ("OpenSSL", "cryptography", "service_identity")


def _under(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes)]


def run_daemon(tmp_path: Path, name: str, flags: list[str], https: bool = False) -> dict:
    """Start ``name``, GET /ping over HTTP (and HTTPS), stop it; its modules and the answers."""
    out = tmp_path / "modules.json"
    env = dict(os.environ, LEAN_PROBE_OUT=str(out), PYTHONPATH=str(ROOT))
    env.pop("NSQTW_LEAN_IMPORTS", None)
    proc = subprocess.Popen([sys.executable, str(DRIVER), name, *flags], cwd=str(tmp_path), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    answers: dict[str, bytes] = {}
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        wanted = {"HTTP", "HTTPS"} if https else {"HTTP"}
        addresses: dict[str, str] = {}
        while not wanted <= set(addresses):
            line = proc.stderr.readline()
            assert line, f"{name} exited before listening (exit {proc.wait()}):\n{''.join(lines)}"
            lines.append(line)
            found = re.search(r"INFO: (HTTPS?): listening on (\S+)", line)
            if found:
                addresses[found.group(1)] = found.group(2)
        with urllib.request.urlopen(f"http://{addresses['HTTP']}/ping", timeout=30) as answer:
            answers["HTTP"] = answer.read()
        if https:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            with urllib.request.urlopen(f"https://{addresses['HTTPS']}/ping", timeout=30, context=context) as answer:
                answers["HTTPS"] = answer.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(lines) + proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    record = json.loads(out.read_text())
    record["answers"] = answers
    return record


NSQD = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--https-address=",
        "--broadcast-address=127.0.0.1"]
LOOKUPD = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]


@pytest.mark.e2e
def test_an_idle_nsqd_imports_nothing_it_does_not_use(tmp_path):
    record = run_daemon(tmp_path, "nsqd", NSQD + [f"--data-path={tmp_path}"])
    loaded = record["loaded"]
    assert record["answers"]["HTTP"] == b"OK"
    assert _under(loaded, FOREIGN) == []
    assert _under(loaded, TLS_STACK) == [], "no TLS configured, yet the TLS stack was imported"
    assert _under(loaded, ("nsqtw.lookupd.service", "nsqtw.lookupd.http")) == []
    assert [m for m in loaded if "replication" in m] == []
    assert "klein" in loaded and "nsqtw.nsqd.http" in loaded  # HTTP is served: its framework is there
    assert "http.cookiejar" not in loaded  # Twisted's deprecated alias: deferred, never used


@pytest.mark.e2e
def test_an_idle_nsqlookupd_imports_nothing_it_does_not_use(tmp_path):
    record = run_daemon(tmp_path, "nsqlookupd", LOOKUPD)
    loaded = record["loaded"]
    assert record["answers"]["HTTP"] == b"OK"
    assert _under(loaded, FOREIGN + TLS_STACK + ("nsqtw.nsqd", "nsqtw.backend")) == []
    assert "klein" in loaded and "nsqtw.lookupd.http" in loaded


@pytest.mark.e2e
def test_an_nsqd_with_tls_options_keeps_the_tls_stack_and_serves_https(tmp_path):
    from nsqtw.testing.certs import make_certificates

    certs = make_certificates(str(tmp_path))
    flags = [f for f in NSQD if not f.startswith("--https-address")]
    record = run_daemon(tmp_path, "nsqd", flags + ["--https-address=127.0.0.1:0", f"--tls-cert={certs['server']}",
                                                   f"--tls-key={certs['server_key']}", f"--data-path={tmp_path}"],
                        https=True)
    assert record["answers"] == {"HTTP": b"OK", "HTTPS": b"OK"}
    assert "OpenSSL.SSL" in record["loaded"]
    assert _under(record["loaded"], FOREIGN) == []


LEAN_PROBE = """
import json, sys
from nsqtw.runtime.lean import LeanImportFinder, apply_lean_imports
finder = apply_lean_imports(tls=False)
result = {"installed": isinstance(finder, LeanImportFinder)}
from twisted.internet import epollreactor, tcp
from twisted.internet.endpoints import TCP4ServerEndpoint
try:
    import OpenSSL  # noqa: F401
    result["refused"] = False
except ImportError as e:
    result["refused"] = "no TLS is configured" in str(e)
result["start_tls"] = hasattr(tcp.Server, "startTLS")
result["cookiejar_lazy"] = type(sys.modules["http.cookiejar"]).__name__ == "_LazyModule"  # Twisted's import
import http.cookiejar  # noqa: E402 - loads it, as a first use would
result["cookiejar_works"] = http.cookiejar.CookieJar().__class__.__name__ == "CookieJar"
result["again"] = apply_lean_imports(tls=False) is finder and sys.meta_path.count(finder) == 1
apply_lean_imports(tls=True)
import OpenSSL.SSL  # noqa: F401,E402
result["tls_after"] = "OpenSSL.SSL" in sys.modules
print(json.dumps(result))
"""


def test_the_lean_finder_refuses_the_tls_stack_and_defers_modules_in_its_own_process():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NSQTW_LEAN_IMPORTS", None)
    out = subprocess.run([sys.executable, "-c", LEAN_PROBE], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    assert json.loads(out) == {"installed": True, "refused": True, "start_tls": False, "cookiejar_lazy": True,
                               "cookiejar_works": True, "again": True, "tls_after": True}


def test_the_lean_finder_is_off_with_the_environment_switch():
    env = dict(os.environ, PYTHONPATH=str(ROOT), NSQTW_LEAN_IMPORTS="0")
    code = ("import sys; from nsqtw.runtime.lean import apply_lean_imports; print(apply_lean_imports(tls=False), "
            "sum(type(f).__name__ == 'LeanImportFinder' for f in sys.meta_path))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                         check=True).stdout
    assert out.split() == ["None", "0"]


def test_which_options_want_tls():
    from nsqtw.lookupd.options import LookupdOptions
    from nsqtw.options import NsqdOptions
    from nsqtw.runtime.lean import tls_wanted

    assert not tls_wanted(NsqdOptions())
    assert not tls_wanted(LookupdOptions())
    assert tls_wanted(NsqdOptions(tls_cert="/c.pem", tls_key="/k.pem"))
    assert tls_wanted(NsqdOptions(auth_http_addresses=["https://auth.example:4181"]))
    assert not tls_wanted(NsqdOptions(auth_http_addresses=["auth.example:4181"]))
    assert tls_wanted(NsqdOptions(etcd_endpoints=["https://etcd.example:2379"]))
    assert not tls_wanted(NsqdOptions(etcd_endpoints=["http://etcd.example:2379"]))
