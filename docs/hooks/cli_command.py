"""MkDocs hook: exposes gedp's command line as a click command for the CLI reference page.

mkdocs-click documents a click command named by module and attribute; gedp's command line is a typer
app, so this hook (loaded by mkdocs.yml's ``hooks``) converts it with ``typer.main.get_command`` and
registers itself as the module ``gedp_cli_reference``. The reference is therefore rebuilt from the
code on every build and never goes stale.
"""

import sys

import typer

from gedp.cli import app

command = typer.main.get_command(app)
sys.modules["gedp_cli_reference"] = sys.modules[__name__]
