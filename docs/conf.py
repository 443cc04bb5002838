"""Sphinx configuration: the guides (docs/guide/) and the API reference of the public face
(docs/api/), in the furo theme.

``make docs`` builds it with warnings as errors and in nitpicky mode, so every internal
reference (``:doc:``, ``:ref:``, ``:func:``, ``:class:``...) must resolve: that is the link check
of the site's own links.  The build never reaches for the network: intersphinx links to
Twisted's documentation only when a local copy of its inventory is given
(``NSQTW_TWISTED_INVENTORY`` or ``docs/_inventories/twisted.inv``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import nsqtw  # noqa: E402

project = "nsqtw"
author = "nsqtw's authors"
copyright = "nsqtw's authors, MIT licence"
release = version = nsqtw.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.intersphinx", "sphinx.ext.viewcode", "nsqtw_options"]
exclude_patterns = ["_build", "_inventories"]
templates_path: list[str] = []

html_theme = "furo"
html_title = f"nsqtw {release}"
html_static_path = ["_static"]
html_css_files = ["nsqtw.css"]
html_theme_options = {"navigation_with_keys": True}
pygments_style = "friendly"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# the public signatures' reactor/clock/HTTP-client types, shown by name (api/embed.rst says each)
autodoc_type_aliases = {name: name for name in ("ListeningReactor", "Clock", "TreqClient")}
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": True, "exclude-members": "__init__, __new__"}

# --- the link check of internal references -------------------------------------------------------
nitpicky = True
nitpick_ignore_regex = [
    # libraries this site does not document (no network, so no intersphinx by default)
    (r"py:.*", r"(twisted|zope|attr|attrs|treq|klein|OpenSSL|pytest|_pytest|pytest_twisted|collections|typing|"
               r"types|enum|datetime|socket|ssl|random|pathlib|os|io|json|asyncio|builtins)(\..*)?"),
    (r"py:.*", r"(Deferred|Failure|Clock|IReactorTime|IReactorTCP|IReactorCore|IPlugin|Service|MultiService|"
               r"Interface|Logger|Protocol|ITransport|IAddress|IListeningPort|Agent|Response|Request|TypeVar|T|"
               r"Callable|Awaitable|Iterator|Iterable|Sequence|Mapping|Any|Self|ClassVar|Literal|NOTHING|"
               r"nsqtw\.options\.T|CertificateOptions|TLSVersion|ContextFactory|IOpenSSLClientConnectionCreator|FixtureRequest)"),
    (r"py:.*", r"(int|str|bytes|float|bool|dict|list|tuple|set|frozenset|object|type|None|Exception|callable|"
               r"optional|iterable|BaseException|ValueError|OSError|KeyError|RuntimeError)"),
    # the components' internals, which the public face re-exports but the reference does not
    # document (type hints name them by their defining module)
    (r"py:.*", r"nsqtw\.(nsqd|lookupd|admin|allinone|runtime|backend|protocol|tools|cli|spark)(\..*)?"),
    (r"py:.*", r"(defer\.Deferred|Body|Registration|NsqdAddress|NsqdService|LookupdService|AdminService|Broker|RegistrationDB|History|Topic|Channel|"
               r"ClusterInfo|ListeningService|IBackendQueue|Upstream|PeerInfo|InProcessTransport)"),
]

# --- intersphinx: a local inventory or nothing --------------------------------------------------
_TWISTED_INV = os.environ.get("NSQTW_TWISTED_INVENTORY") or str(DOCS / "_inventories" / "twisted.inv")
intersphinx_mapping = (
    {"twisted": ("https://docs.twisted.org/en/stable/api/", _TWISTED_INV)} if os.path.exists(_TWISTED_INV) else {}
)
intersphinx_disabled_reftypes = ["*"]  # only explicit twisted: references go there
