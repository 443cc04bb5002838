"""Twisted Protocol glue between sockets and the sans-IO cores; the only code touching transports."""
