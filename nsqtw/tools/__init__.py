"""
NSQ's bundled apps and drop-in daemons, on nsqtw's Twisted client library.

========================  ===========================================
command                   module (``main(argv=None) -> int``)
========================  ===========================================
``nsq_tail``              :mod:`nsqtw.tools.tail`
``to_nsq``                :mod:`nsqtw.tools.to_nsq`
``nsq_to_file``           :mod:`nsqtw.tools.to_file`
``nsq_to_http``           :mod:`nsqtw.tools.to_http`
``nsq_to_nsq``            :mod:`nsqtw.tools.nsq_to_nsq`
``nsq_stat``              :mod:`nsqtw.tools.stat`
``nsqd``                  :mod:`nsqtw.tools.nsqd` (:mod:`nsqtw.cli`)
``nsqlookupd``            :mod:`nsqtw.tools.nsqlookupd`
``nsqadmin``              :mod:`nsqtw.tools.nsqadmin`
========================  ===========================================

Each app takes NSQ's flags in Go's syntax and is an object with ``start()``,
``stop()`` and ``done`` (see :mod:`nsqtw.tools._runtime`), so tests run it in
their own reactor; only ``main()`` runs a reactor.  Each is also
``python -m nsqtw.tools.<module>``.  This package imports nothing heavy.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
