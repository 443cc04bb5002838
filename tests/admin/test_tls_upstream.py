"""--http-client-tls-*: nsqadmin's outgoing calls to an https upstream (a self-signed nsqd stand-in on
loopback), and the switch to https when a plain-HTTP nsqd answers 403 with its ``https_port``."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
import pytest_twisted
from klein import Klein
from twisted.internet import ssl
from twisted.web.server import Site

from admin_helpers import within
from nsqtw.admin.cluster import FetchError, Upstream
from nsqtw.admin.options import AdminOptions
from nsqtw.admin.service import make_http_client

pytestmark = [
    pytest.mark.e2e,
    # twisted's own CertificateOptions hands pyOpenSSL objects to pyOpenSSL, which now warns about it
    pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning"),
]


def self_signed(tmp_path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (IP SAN) and its key, as PEM files."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class Secure:
    app = Klein()

    @app.route("/info")
    def info(self, request: Any) -> bytes:
        return json.dumps({"version": "1.3.0", "secure": request.isSecure()}).encode()


class Plain:
    """A --tls-required nsqd's plain HTTP side: 403 TLS_REQUIRED naming the https port."""

    app = Klein()

    def __init__(self, https_port: int) -> None:
        self.https_port = https_port

    @app.route("/info")
    def info(self, request: Any) -> bytes:
        request.setResponseCode(403)
        return json.dumps({"message": "TLS_REQUIRED", "https_port": self.https_port}).encode()


@pytest_twisted.async_yield_fixture
async def https_server(tmp_path):
    from twisted.internet import reactor

    cert_path, key_path = self_signed(tmp_path)
    with open(cert_path, "rb") as c, open(key_path, "rb") as k:
        pem = c.read() + k.read()
    pair = ssl.PrivateCertificate.loadPEM(pem)
    # cryptography objects: pyOpenSSL deprecates passing its own X509 and PKey (what .options() passes)
    ctx = ssl.CertificateOptions(privateKey=pair.privateKey.original.to_cryptography_key(),
                                 certificate=pair.original.to_cryptography())
    secure = reactor.listenSSL(0, Site(Secure().app.resource()), ctx, interface="127.0.0.1")
    plain = reactor.listenTCP(0, Site(Plain(secure.getHost().port).app.resource()), interface="127.0.0.1")
    yield secure.getHost().port, plain.getHost().port, cert_path
    await secure.stopListening()
    await plain.stopListening()


def upstream(**tls: Any) -> Upstream:
    from twisted.internet import reactor

    opts = AdminOptions(nsqd_http_addresses=["127.0.0.1:4151"], **tls)
    return Upstream(make_http_client(reactor, opts), reactor, 5.0, "test")


@pytest_twisted.ensureDeferred
async def test_unknown_certificate_is_refused_by_default(https_server) -> None:
    """Without a CA file or skip-verify, a self-signed upstream fails verification."""
    port, _, _ = https_server
    with pytest.raises(FetchError) as e:
        await within(upstream().get_json(f"https://127.0.0.1:{port}/info"))
    assert f"https://127.0.0.1:{port}/info" in str(e.value)


@pytest_twisted.ensureDeferred
async def test_root_ca_file_and_insecure_skip_verify(https_server) -> None:
    """--http-client-tls-root-ca-file trusts the upstream's CA; --http-client-tls-insecure-skip-verify trusts any."""
    port, _, cert = https_server
    doc = await within(upstream(http_client_tls_root_ca_file=cert).get_json(f"https://127.0.0.1:{port}/info"))
    assert doc == {"version": "1.3.0", "secure": True}
    doc = await within(upstream(http_client_tls_insecure_skip_verify=True).get_json(
        f"https://127.0.0.1:{port}/info"))
    assert doc["secure"] is True


@pytest_twisted.ensureDeferred
async def test_403_with_https_port_is_retried_over_https(https_server) -> None:
    """A plain-HTTP upstream answering 403 with https_port is asked again over https (nsqadmin's client does)."""
    port, plain_port, cert = https_server
    doc = await within(upstream(http_client_tls_root_ca_file=cert).get_json(f"http://127.0.0.1:{plain_port}/info"))
    assert doc == {"version": "1.3.0", "secure": True}
