"""nsqd's broker state: topics, channels, clients, in-flight and deferred queues, protocol V2 (sans-IO)."""
