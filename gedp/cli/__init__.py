"""The gedp command line: one module per group of commands, each command a mapping from its flags to
one library call and a printout.

* ``command_line``: the typer app, its consoles, one-line error reports (exit status 2 for a refused
  input, config, budget or path, 1 when a computation failed), progress bars, the entry points;
* ``defaults``: option defaults written out so that ``gedp --help`` imports no library;
* ``release_commands``: run, synth, plan, protect;
* ``table_commands``: tabulate, serve, implicates, report, interval;
* ``evaluation_commands``: evaluate, suppress, audit;
* ``ledger_commands``: ledger show, ledger clear.

Importing the package registers every command (in the order of ``gedp --help``) and imports no
numerical library: each command imports what it calls when it runs.
"""

import importlib

from gedp.cli.command_line import StepsColumn, app, command, main

#: The modules of commands, imported (and so registered) in the order ``gedp --help`` lists them.
COMMAND_MODULES = ("release_commands", "table_commands", "evaluation_commands", "ledger_commands")
for _module in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["StepsColumn", "app", "command", "main"]
