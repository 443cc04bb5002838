"""nsqd's broker state: topics, channels, clients, in-flight and deferred queues (sans-IO)."""
