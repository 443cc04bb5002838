"""Client-side feature negotiation over loopback against a minimal scripted nsqd: TLS (startTLS,
then OK over TLS), raw DEFLATE, snappy framing and AUTH, each confirmed by a real round trip.

nsqtw's broker does not negotiate these yet, so the server here is a tiny fake that follows
nsqd's sequence (IDENTIFY JSON, upgrade, OK in the new layer; AUTH after)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import struct
import zlib

import pytest
import pytest_twisted
from twisted.internet import defer
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol

from nsqtw.client import Config, NotConnected, Producer
from nsqtw.client.connection import connect
from nsqtw.errors import Unauthorized
from nsqtw.protocol.frames import FRAME_ERROR, FRAME_RESPONSE, encode_frame

_I32 = struct.Struct(">i")


class _Zlib:
    def __init__(self, level=6):
        self.c = zlib.compressobj(level, zlib.DEFLATED, -15)
        self.d = zlib.decompressobj(-15)

    def encode(self, data):
        return self.c.compress(data) + self.c.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data):
        return self.d.decompress(data)


class _Snappy:
    """Server side of snappy framing with cramjam (reads whole chunks with the client's parser)."""

    def __init__(self):
        from nsqtw.client.core import SnappyCodec
        self.reader = SnappyCodec()
        import cramjam
        self.cramjam = cramjam

    def encode(self, data):
        return bytes(self.cramjam.snappy.compress(data))

    def decode(self, data):
        return self.reader.decode(data)


class ScriptedNsqd(Protocol):
    """Magic, IDENTIFY (answer + upgrades), optional AUTH, then PUB -> OK."""

    def __init__(self, factory):
        self.f = factory
        self.buf = b""
        self.magic = False
        self.codec = None
        self.identified = None

    def write(self, data):
        self.transport.write(self.codec.encode(data) if self.codec else data)

    def dataReceived(self, data):
        if self.codec:
            data = self.codec.decode(data)
        self.buf += data
        while True:
            if not self.magic:
                if len(self.buf) < 4:
                    return
                assert self.buf[:4] == b"  V2"
                self.buf = self.buf[4:]
                self.magic = True
            nl = self.buf.find(b"\n")
            if nl < 0:
                return
            line = self.buf[:nl]
            name = line.split(b" ")[0]
            if name in (b"IDENTIFY", b"AUTH", b"PUB"):
                if len(self.buf) < nl + 5:
                    return
                size = _I32.unpack_from(self.buf, nl + 1)[0]
                if len(self.buf) < nl + 5 + size:
                    return
                body = self.buf[nl + 5:nl + 5 + size]
                self.buf = self.buf[nl + 5 + size:]
                getattr(self, "on_" + name.decode())(body)
            else:
                self.buf = self.buf[nl + 1:]
                self.f.lines.append(line)

    def on_IDENTIFY(self, body):
        req = json.loads(body)
        self.identified = req
        self.f.identify.append(req)
        tls = self.f.tls is not None and req.get("tls_v1")
        deflate = self.f.deflate and req.get("deflate")
        snappy = self.f.snappy and req.get("snappy")
        answer = {"max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000, "msg_timeout": 60000,
                  "tls_v1": bool(tls), "deflate": bool(deflate), "deflate_level": req.get("deflate_level", 6),
                  "max_deflate_level": 6, "snappy": bool(snappy), "sample_rate": 0,
                  "auth_required": self.f.auth is not None, "output_buffer_size": 16384,
                  "output_buffer_timeout": 250}
        self.transport.write(encode_frame(FRAME_RESPONSE, json.dumps(answer).encode()))
        if tls:
            self.transport.startTLS(self.f.tls)
            self.transport.write(encode_frame(FRAME_RESPONSE, b"OK"))
        if deflate:
            self.codec = _Zlib(req.get("deflate_level", 6))
            self.write(encode_frame(FRAME_RESPONSE, b"OK"))
        elif snappy:
            self.codec = _Snappy()
            self.write(encode_frame(FRAME_RESPONSE, b"OK"))

    def on_AUTH(self, body):
        self.f.secrets.append(body)
        if body == self.f.auth:
            self.write(encode_frame(FRAME_RESPONSE, b'{"identity":"tester","identity_url":"","permission_count":1}'))
        else:
            self.write(encode_frame(FRAME_ERROR, b"E_UNAUTHORIZED AUTH no authorizations found"))
            self.transport.loseConnection()

    def on_PUB(self, body):
        self.f.published.append(body)
        self.write(encode_frame(FRAME_RESPONSE, b"OK"))


class ScriptedFactory(Factory):
    def __init__(self, tls=None, deflate=False, snappy=False, auth=None):
        self.tls, self.deflate, self.snappy, self.auth = tls, deflate, snappy, auth
        self.identify, self.secrets, self.published, self.lines = [], [], [], []

    def buildProtocol(self, addr):
        return ScriptedNsqd(self)


async def serve(factory):
    from twisted.internet import reactor
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    return port, f"127.0.0.1:{port.getHost().port}"


def make_cert(tmp_path, ip="127.0.0.1"):
    """A self-signed certificate for ``ip`` (SAN), as PEM files; returns (cert_path, key_path, server options)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from twisted.internet import ssl

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nsqtw test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    pair = ssl.PrivateCertificate.loadPEM(cert_pem + key_pem)
    # cryptography objects: pyOpenSSL deprecates passing its own X509 and PKey (what .options() passes)
    server = ssl.CertificateOptions(privateKey=pair.privateKey.original.to_cryptography_key(),
                                    certificate=pair.original.to_cryptography())
    return str(cert_path), str(key_path), server


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_deflate_round_trip():
    """deflate negotiated: the OK and PUB/OK travel raw-DEFLATE compressed; the level is sent."""
    f = ScriptedFactory(deflate=True)
    port, addr = await serve(f)
    try:
        p = Producer(addr, Config(deflate=True, deflate_level=3))
        await p.publish("t", b"compressed hello" * 10)
        assert f.published == [b"compressed hello" * 10]
        assert f.identify[0]["deflate"] is True and f.identify[0]["deflate_level"] == 3
        assert p.conn.core.compression == "deflate"
        await p.stop()
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_snappy_round_trip():
    """snappy negotiated: framing format both ways."""
    f = ScriptedFactory(snappy=True)
    port, addr = await serve(f)
    try:
        p = Producer(addr, Config(snappy=True))
        await defer.gatherResults([p.publish("t", b"s%d" % i) for i in range(50)])
        assert f.published == [b"s%d" % i for i in range(50)]
        assert p.conn.core.compression == "snappy"
        await p.stop()
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_tls_with_root_ca_then_deflate(tmp_path):
    """tls_v1 with tls_root_ca_file: startTLS right after the JSON answer, OK over TLS, deflate inside TLS."""
    cert, key, server = make_cert(tmp_path)
    f = ScriptedFactory(tls=server, deflate=True)
    port, addr = await serve(f)
    try:
        p = Producer(addr, Config(tls_v1=True, tls_root_ca_file=cert, deflate=True, tls_min_version="tls1.2"))
        await p.publish("t", b"secret")
        assert f.published == [b"secret"] and p.conn.core.tls and p.conn.core.compression == "deflate"
        await p.stop()
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_tls_insecure_skip_verify(tmp_path):
    """tls_insecure_skip_verify accepts a certificate nobody vouches for."""
    _, _, server = make_cert(tmp_path, ip="10.9.8.7")
    f = ScriptedFactory(tls=server)
    port, addr = await serve(f)
    try:
        p = Producer(addr, Config(tls_v1=True, tls_insecure_skip_verify=True))
        await p.publish("t", b"x")
        assert f.published == [b"x"]
        await p.stop()
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_tls_refuses_a_certificate_for_another_host(tmp_path):
    """Verification is on by default: a certificate for another IP fails the connection."""
    cert, _, server = make_cert(tmp_path, ip="10.9.8.7")
    f = ScriptedFactory(tls=server)
    port, addr = await serve(f)
    try:
        with pytest.raises(NotConnected):
            await Producer(addr, Config(tls_v1=True, tls_root_ca_file=cert)).publish("t", b"x")
        assert f.published == []
    finally:
        await port.stopListening()


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_auth_sent_when_required(tmp_path):
    """auth_required: AUTH carries auth_secret before any command; the identity is kept."""
    f = ScriptedFactory(snappy=True, auth=b"let-me-in")
    port, addr = await serve(f)
    try:
        conn = await connect(addr, Config(auth_secret="let-me-in", snappy=True))
        assert conn.core.auth_response["identity"] == "tester" and f.secrets == [b"let-me-in"]
        conn.close()
        await conn.closed
        with pytest.raises(Unauthorized):
            await connect(addr, Config(auth_secret="wrong"))
    finally:
        await port.stopListening()
