"""The `opd` command line (`opd.cli:main`): `entry` assembles the command modules, which
share `common` and never import `entry`."""

from opd.cli.entry import main

__all__ = ["main"]
