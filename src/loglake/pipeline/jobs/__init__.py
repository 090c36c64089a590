"""Named Spark jobs run by ``loglake job NAME``. One module per job; ``JOBS`` maps the name the
CLI takes to the module's click command (``compact`` now; the protocol issues add theirs)."""

from __future__ import annotations

JOBS = ("compact",)
