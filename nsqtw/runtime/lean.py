"""
Lean imports: what a daemon of nsqtw's own leaves out of its process when it does not use it.

Most of an idle daemon's memory is the code it imported, and most of that is not nsqtw's: the
TLS stack alone (pyOpenSSL, cryptography's compiled bindings, service_identity), which Twisted
imports with its reactor whether or not anything speaks TLS, is about a quarter of an idle
nsqd.  A drop-in command (``nsqd``, ``nsqlookupd``; :mod:`nsqtw.cli`) owns its process, so
before it imports Twisted it applies :func:`apply_lean_imports`:

* **no TLS stack without TLS**: when the daemon's options ask for no TLS at all (for nsqd: no
  ``--tls-cert``/``--tls-key``, no ``--tls-required``, no ``--replication-tls``, no ``https://``
  auth server; nsqlookupd has no TLS), importing ``OpenSSL`` raises ``ImportError`` for the
  rest of the process.  Twisted was written for that case (pyOpenSSL is an optional dependency
  of it): its TCP transport then has no ``startTLS`` and its endpoints no TLS wrapper, neither
  of which such a daemon calls;
* **deferred modules**: a few standard modules that Twisted imports at start for names no
  daemon uses (``http.cookiejar`` and, through it, ``urllib.request``, ``http.client`` and the
  ``email`` package, kept for a deprecated alias in ``twisted.python.compat``) are loaded
  lazily (:class:`importlib.util.LazyLoader`): their code runs the first time one of their
  attributes is used, if ever.

Library code (``start_nsqd`` and the other embedding calls, the service trees, the pytest
fixtures) never calls this: an application embedding nsqtw imports what it imports.
``NSQTW_LEAN_IMPORTS=0`` in the environment turns both off.

This module imports nothing of Twisted's: it must run before the first Twisted import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["apply_lean_imports", "tls_wanted", "DEFERRED_MODULES", "TLS_STACK", "LeanImportFinder"]

#: standard modules loaded only when first used (Twisted imports them for names nsqtw never uses)
DEFERRED_MODULES = frozenset({"http.cookiejar"})

#: the top-level packages refused when the daemon asks for no TLS
TLS_STACK = frozenset({"OpenSSL"})


class LeanImportFinder(importlib.abc.MetaPathFinder):
    """A finder first on ``sys.meta_path``: refuses the ``refused`` packages (and their
    submodules) and hands the ``deferred`` modules to the next finders wrapped in a
    :class:`importlib.util.LazyLoader`."""

    def __init__(self, deferred: frozenset[str], refused: frozenset[str]) -> None:
        self.deferred = deferred
        self.refused = refused
        #: the names being looked up through the other finders now (one that asks back is answered None)
        self._finding: set[str] = set()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(f"{fullname} is left out of this process: no TLS is configured",
                                      name=fullname)
        if fullname not in self.deferred or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = importlib.util.LazyLoader(spec.loader)
                    return spec
            return None
        finally:
            self._finding.discard(fullname)


def tls_wanted(options: Any) -> bool:
    """Whether a daemon with these options may ever use TLS (certificate, TLS-only ports,
    replication over TLS, an ``https://`` server it calls); options without these fields (nsqlookupd)
    never do."""
    if getattr(options, "tls_cert", "") or getattr(options, "tls_key", ""):
        return True
    if getattr(options, "tls_required", 0) or getattr(options, "replication_tls", False):
        return True
    if getattr(options, "https_address", "") and getattr(options, "tls_cert", ""):
        return True
    for address in [*(getattr(options, "auth_http_addresses", ()) or ()),
                    *(getattr(options, "etcd_endpoints", ()) or ())]:
        if str(address).lower().startswith("https"):
            return True
    return False


def apply_lean_imports(options: Any = None, *, tls: bool | None = None) -> LeanImportFinder | None:
    """Install the finder for a daemon of nsqtw's own (see the module's docstring), once.

    ``tls`` (default: :func:`tls_wanted` of ``options``) keeps the TLS stack importable; a TLS
    stack already imported is left as it is.  Returns the finder installed, or None when
    ``NSQTW_LEAN_IMPORTS=0`` turns it off."""
    if os.environ.get("NSQTW_LEAN_IMPORTS", "1") == "0":
        return None
    if tls is None:
        tls = options is not None and tls_wanted(options)
    refused = frozenset() if tls or any(name in sys.modules for name in TLS_STACK) else TLS_STACK
    deferred = frozenset(name for name in DEFERRED_MODULES if name not in sys.modules)
    for finder in sys.meta_path:
        if isinstance(finder, LeanImportFinder):
            finder.deferred |= deferred
            finder.refused = finder.refused & refused if refused else frozenset()
            return finder
    finder = LeanImportFinder(deferred, refused)
    sys.meta_path.insert(0, finder)
    return finder
