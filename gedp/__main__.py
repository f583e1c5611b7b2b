"""``python -m gedp`` runs the command line."""

from gedp.entry import command

command()
