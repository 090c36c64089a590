"""What every loglake command group shares.

``TypedErrorGroup`` turns a ``LoglakeError`` (a typed error the user can act on: a bad option, a
missing stream, a peer that refused) into click's one-line ``Error: ...`` and exit status 1, so
no part shows a traceback for a mistake, whether it runs under ``loglake`` or alone with
``python -m loglake.<part>.cli``. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import click

from loglake.errors import LoglakeError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


class TypedErrorGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LoglakeError as e:
            raise click.ClickException(str(e)) from e
