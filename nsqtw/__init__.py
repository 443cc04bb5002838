"""
nsqtw: NSQ, the realtime distributed message queue, on Twisted.

A wire-compatible nsqd and nsqlookupd (TCP protocol V2 and V1, the HTTP APIs,
the on-disk formats), an nsqadmin-style web UI, a Twisted client library and
NSQ's utilities, running in one reactor: under ``twistd``, or embedded in any
Twisted application or test suite.
"""

__version__ = "0.1.0"

#: the NSQ release whose behaviour nsqtw reproduces (reported in /info, /stats, IDENTIFY)
NSQ_VERSION = "1.3.0"

__all__ = ["__version__", "NSQ_VERSION"]
