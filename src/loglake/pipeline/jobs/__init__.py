"""Named Spark jobs run by ``loglake job NAME``: one module per job (``compact``,
``archives_build``, ``cardinal_blocks``, ``sds_audit``, ``replay``), its click command beside it
(``<name>_cli.py``), mounted by ``loglake.pipeline.cli``."""
