"""Broker statistics: the ``/stats`` document, process memory figures, and exporters."""
