"""
Throwaway certificates for tests: a CA, and server/client certificates it signs.

Built with ``cryptography`` (already required by Twisted's TLS support), kept
in a directory of PEM files so they can be handed to nsqd's and the client's
``--tls-*`` options exactly as an operator would.
"""

from __future__ import annotations

import datetime
import ipaddress
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["make_certificates"]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certificates(directory: str, server_host: str = "127.0.0.1", client_cn: str = "client",
                      days: int = 2) -> dict[str, str]:
    """Write ``ca.pem``, ``server.pem``/``server.key`` (for ``server_host``) and
    ``client.pem``/``client.key`` (CN ``client_cn``); returns their paths by name."""
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("nsqtw test CA")).issuer_name(_name("nsqtw test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    paths = {"ca": _write(os.path.join(directory, "ca.pem"), ca.public_bytes(serialization.Encoding.PEM))}

    def leaf(kind: str, cn: str, san: x509.GeneralName | None) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([san]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        paths[kind] = _write(os.path.join(directory, f"{kind}.pem"), cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{kind}_key"] = _write(os.path.join(directory, f"{kind}.key"), _key_pem(key))

    try:
        server_san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(server_host))
    except ValueError:
        server_san = x509.DNSName(server_host)
    leaf("server", server_host, server_san)
    leaf("client", client_cn, None)
    return paths
