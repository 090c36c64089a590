"""loglake.node — the process that wires the services together (``loglake serve``, ``demo``)."""
