"""Wire codecs of NSQ's TCP protocols: frames, messages, names, IDENTIFY (sans-IO).
"""
