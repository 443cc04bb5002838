"""
nsqd's TLS configuration (``--tls-*``) as Twisted context factories.

``--tls-cert``/``--tls-key`` give the server identity for the ``tls_v1``
upgrade and the HTTPS listener; ``--tls-client-auth-policy=require`` asks for
any client certificate, ``require-verify`` also checks it against
``--tls-root-ca-file``; ``--tls-min-version`` raises the protocol floor.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from ..options import NsqdOptions

__all__ = ["server_context", "tls_details", "replication_contexts"]

# The TLS stack (pyOpenSSL, cryptography, Twisted's ssl) is imported by the calls that need it,
# never with this module: a daemon without TLS options runs without it (nsqtw.runtime.lean).


def _versions() -> dict[int, Any]:
    from twisted.internet.ssl import TLSVersion
    return {0x0301: TLSVersion.TLSv1_0, 0x0302: TLSVersion.TLSv1_1, 0x0303: TLSVersion.TLSv1_2,
            0x0304: TLSVersion.TLSv1_3}


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"failed to build TLS config - {flag} {path}: {e.strerror or e}") from None


@cache
def _any_client_certificate() -> type:
    """``require``: the client must present a certificate, any certificate (set on each
    server connection through the public ``IOpenSSLServerConnectionCreator`` method)."""
    from OpenSSL import SSL
    from twisted.internet import ssl

    class _AnyClientCertificate(ssl.CertificateOptions):
        def serverConnectionForTLS(self, protocol: Any) -> Any:
            conn = super().serverConnectionForTLS(protocol)
            conn.set_verify(SSL.VERIFY_PEER | SSL.VERIFY_FAIL_IF_NO_PEER_CERT, _accept_any)
            return conn

    return _AnyClientCertificate


def _accept_any(conn: Any, cert: Any, errno: int, depth: int, ok: int) -> bool:
    return True


def server_context(options: NsqdOptions) -> Any | None:
    """The server context factory, or None when no certificate is configured."""
    if not (options.tls_cert and options.tls_key):
        return None
    from twisted.internet import ssl
    from twisted.internet.ssl import TLSVersion
    try:
        pair = ssl.PrivateCertificate.loadPEM(_read(options.tls_cert, "--tls-cert") + b"\n"
                                              + _read(options.tls_key, "--tls-key"))
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"failed to build TLS config - {e}") from None
    # cryptography objects: pyOpenSSL deprecates its own X509/PKey in its APIs
    kwargs: dict = dict(privateKey=pair.privateKey.original.to_cryptography_key(),
                        certificate=pair.original.to_cryptography(),
                        raiseMinimumTo=_versions().get(options.tls_min_version, TLSVersion.TLSv1_0))
    policy = options.tls_client_auth_policy
    if policy == "require-verify":
        if not options.tls_root_ca_file:
            raise ValueError("--tls-client-auth-policy=require-verify needs --tls-root-ca-file")
        ca = ssl.Certificate.loadPEM(_read(options.tls_root_ca_file, "--tls-root-ca-file"))
        return ssl.CertificateOptions(verify=True, caCerts=[ca.original], requireCertificate=True, **kwargs)
    if policy == "require":
        return _any_client_certificate()(**kwargs)
    return ssl.CertificateOptions(**kwargs)


def tls_details(transport: Any) -> tuple[str, str, str]:
    """(version as Go names it, cipher, peer common name) of a TLS connection, or blanks."""
    from twisted.protocols.tls import TLSMemoryBIOProtocol
    conn = None
    # the TLS protocol's public getHandle (the OpenSSL connection): the transport itself behind
    # a TLS endpoint, the transport's protocol after startTLS
    for candidate in (transport, getattr(transport, "protocol", None)):
        if isinstance(candidate, TLSMemoryBIOProtocol):
            conn = candidate.getHandle()
            break
    if conn is None:
        return "", "", ""
    try:
        version = (conn.get_protocol_version_name() or "").replace("TLSv", "TLS")
        cipher = conn.get_cipher_name() or ""
        peer = conn.get_peer_certificate()
        cn = ""
        if peer is not None:
            cn = dict(peer.get_subject().get_components()).get(b"CN", b"").decode("utf-8", "replace")
        return version, cipher, cn
    except Exception:
        return "", "", ""


def replication_contexts(options: NsqdOptions) -> tuple[Any, Any] | None:
    """With ``--replication-tls``: ``(server, client)`` context factories for the replication
    links, both holding this node's ``--tls-cert``/``--tls-key`` (a node is the server of its
    origins' links and the client of its peers'), at least TLS 1.2.  With ``--tls-root-ca-file``
    the TLS is mutual: each end requires the other's certificate, signed by that CA (nodes are
    named by address, so the CA is the trust anchor, not a host name).  None without
    ``--replication-tls``; ``ValueError`` naming the flag for a missing or unreadable file."""
    if not options.replication_tls:
        return None
    if not (options.tls_cert and options.tls_key):
        raise ValueError("--replication-tls needs --tls-cert and --tls-key")
    from twisted.internet import ssl
    from twisted.internet.ssl import TLSVersion
    try:
        pair = ssl.PrivateCertificate.loadPEM(_read(options.tls_cert, "--tls-cert") + b"\n"
                                              + _read(options.tls_key, "--tls-key"))
        ca = (ssl.Certificate.loadPEM(_read(options.tls_root_ca_file, "--tls-root-ca-file"))
              if options.tls_root_ca_file else None)
    except ValueError:
        raise
    except Exception as e:
        raise ValueError(f"failed to build the replication TLS config - {e}") from None
    kwargs: dict = dict(privateKey=pair.privateKey.original.to_cryptography_key(),
                        certificate=pair.original.to_cryptography(), raiseMinimumTo=TLSVersion.TLSv1_2)
    if ca is None:
        return ssl.CertificateOptions(**kwargs), ssl.CertificateOptions(**kwargs)
    mutual: dict = dict(verify=True, caCerts=[ca.original], requireCertificate=True, **kwargs)
    return ssl.CertificateOptions(**mutual), ssl.CertificateOptions(**mutual)
