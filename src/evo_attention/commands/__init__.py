"""Subcommands of the evo-attention CLI beyond baseline/search/status/report (see cli.COMMAND_MODULES)."""
