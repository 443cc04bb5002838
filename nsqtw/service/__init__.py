"""Service trees: the one composition root per daemon, shared by twistd, the CLIs and embedding."""
