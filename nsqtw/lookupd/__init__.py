"""nsqlookupd: its sans-IO core (:mod:`nsqtw.lookupd.core`), options, TCP and HTTP glue, service, twistd plugin and embedding.
"""
