"""nsqd, nsqlookupd and nsqadmin in one process: ``twistd nsqtw`` (the all-in-one, above every component).
"""
