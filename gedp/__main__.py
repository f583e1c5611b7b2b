"""``python -m gedp`` runs the command line."""

from gedp.cli import command

command()
