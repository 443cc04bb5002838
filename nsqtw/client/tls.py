"""
The client's TLS options, built from go-nsq's ``tls_*`` settings.

``tls_config`` wins when set (an ``IOpenSSLClientConnectionCreator``, or a
callable taking the host name and returning one).  Otherwise the options are
made from ``tls_root_ca_file`` (else the platform's trust store),
``tls_insecure_skip_verify``, ``tls_cert``/``tls_key`` (a client certificate)
and ``tls_min_version``.
"""

from __future__ import annotations

from typing import Any

from .config import Config

__all__ = ["client_tls_options"]

_VERSIONS = {"ssl3.0": "SSLv3", "tls1.0": "TLSv1_0", "tls1.1": "TLSv1_1", "tls1.2": "TLSv1_2", "tls1.3": "TLSv1_3"}


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def client_tls_options(config: Config, host: str) -> Any:
    from twisted.internet import interfaces, ssl

    custom = config.tls_config
    if custom is not None:
        if interfaces.IOpenSSLClientConnectionCreator.providedBy(custom) or not callable(custom):
            return custom
        return custom(host)
    minimum = None
    if config.tls_min_version:
        minimum = getattr(ssl.TLSVersion, _VERSIONS[config.tls_min_version])
    # the client certificate as cryptography objects: pyOpenSSL deprecates passing its own X509
    # and PKey (what Twisted's clientCertificate= would pass)
    extra: dict[str, Any] = {}
    if config.tls_cert and config.tls_key:
        client_cert = ssl.PrivateCertificate.loadPEM(_read(config.tls_cert) + b"\n" + _read(config.tls_key))
        extra["privateKey"] = client_cert.privateKey.original.to_cryptography_key()
        extra["certificate"] = client_cert.original.to_cryptography()
    if minimum is not None:
        extra["raiseMinimumTo"] = minimum
    if config.tls_insecure_skip_verify:
        return ssl.CertificateOptions(verify=False, **extra)
    if config.tls_root_ca_file:
        trust: Any = ssl.Certificate.loadPEM(_read(config.tls_root_ca_file))
    else:
        trust = ssl.platformTrust()
    return ssl.optionsForClientTLS(host, trustRoot=trust, extraCertificateOptions=extra or None)
