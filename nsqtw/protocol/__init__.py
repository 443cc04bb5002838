"""Wire codecs of NSQ's TCP protocols: frames, messages, names, IDENTIFY (sans-IO).

Internal: applications import the public face (``nsqtw.embed``, ``nsqtw.client``, ``nsqtw.testing``, ``nsqtw.options``, ``nsqtw.errors``).
"""
