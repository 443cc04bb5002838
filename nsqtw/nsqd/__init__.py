"""nsqd: its sans-IO core (:mod:`nsqtw.nsqd.core`), TCP and HTTP glue, stats, service, twistd plugin and embedding.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
