"""loglake keeps the history of message streams and gives it back to whoever missed it."""

__version__ = "0.1.0"
