"""``neonic`` subcommands, one module each (see :mod:`host.cli`)."""
