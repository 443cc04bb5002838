"""The shared runtime below every component (internal): reactor resolution, the spin reactor, the turn
batcher, the socket seam, process policy, listening, Go-style flags and logging, TLS, HTTP responses,
the upstream HTTP client and process memory figures.

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
