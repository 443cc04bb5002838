"""nsqd, nsqlookupd and nsqadmin in one process: ``twistd nsqtw`` (the all-in-one, above every component).

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
