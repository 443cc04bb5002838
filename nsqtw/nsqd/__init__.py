"""nsqd: its sans-IO core (:mod:`nsqtw.nsqd.core`), TCP and HTTP glue, stats, service, twistd plugin and embedding.
"""
