"""nsqlookupd: its sans-IO core (:mod:`nsqtw.lookupd.core`), options, TCP and HTTP glue, service, twistd plugin and embedding.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
