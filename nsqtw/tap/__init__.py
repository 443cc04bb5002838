"""twistd adapters: command-line options generated from nsqtw.options, and makeService."""
