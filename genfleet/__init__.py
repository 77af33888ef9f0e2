"""The ``genfleet`` command line; each subcommand imports only what it needs."""
