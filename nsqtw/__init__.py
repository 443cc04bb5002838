"""
nsqtw: NSQ, the realtime distributed message queue, on Twisted.

A wire-compatible nsqd and nsqlookupd (TCP protocol V2 and V1, the HTTP APIs,
the on-disk formats), an nsqadmin-style web UI, a Twisted client library and
NSQ's utilities, running in one reactor: under ``twistd``, or embedded in any
Twisted application or test suite.

The public face, what applications and test suites import:

* :mod:`nsqtw.embed` -- ``start_nsqd``, ``start_nsqlookupd``, ``start_nsqadmin`` and their handles;
* :mod:`nsqtw.client` -- the Twisted client library (``Producer``, ``Consumer``, ``Config``...);
* :mod:`nsqtw.testing` -- raw protocol helpers and the pytest plugin's fixtures;
* :mod:`nsqtw.options` -- ``NsqdOptions`` and NSQ's duration syntax;
* :mod:`nsqtw.errors` -- NSQ's ``E_*`` errors as values;
* the Spark jobs, through their commands (``nsqtw-stats``, ``nsqtw-replay``).

Everything else (each daemon's package ``nsqd``, ``lookupd``, ``admin``, the all-in-one, the shared
``runtime``, ``protocol`` and ``backend``) is internal and may change without notice.
"""

__version__ = "0.1.0"

#: the NSQ release whose behaviour nsqtw reproduces (reported in /info, /stats, IDENTIFY)
NSQ_VERSION = "1.3.0"

#: what Go's binaries print as "built w/go1.19.8": one token without spaces, so the version line
#: matches what harnesses parse (``^[a-z]+ v\d+\.\d+\.\d+(-[a-z]+)? \(built w/[a-z0-9.-]+\)``)
BUILT_WITH = f"nsqtw-{__version__}"


def version_line(prog: str) -> str:
    """``nsqd v1.3.0 (built w/nsqtw-0.1.0)``: Go's ``version.String(prog)`` shape."""
    return f"{prog} v{NSQ_VERSION} (built w/{BUILT_WITH})"


__all__ = ["__version__", "NSQ_VERSION", "BUILT_WITH", "version_line"]
