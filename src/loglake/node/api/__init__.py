"""The node's HTTP API, one router per part (``streams``, ``events``, ``archives``, ``sds``,
``jobs``). Every router reads the running node from ``request.app.state.node``
(``NodeContext``) and speaks JSON only; errors are ``{"error", "message", "status"}``."""
