"""The root of loglake's exception tree.

Every typed error in loglake derives from ``LoglakeError`` so a CLI or a server can turn any of
them into a readable message without catching bare ``Exception``. Parts define their own
subclasses next to the code that raises them; this module only holds the roots, split by whose
fault it is (the h11 model: the caller asked for something illegal, or the peer sent it).

Each error also says whether trying again can succeed (aiokafka's ``retriable``): a caller
retries by that attribute, never by a list of classes of its own, so a new transient failure
is retried everywhere the day its class says so.
"""

import builtins
import importlib
import re
from typing import ClassVar


class LoglakeError(Exception):
    """Base class of every error loglake raises on purpose."""

    retriable: ClassVar[bool] = False
    """Whether the same request may succeed later unchanged (the peer or the disk recovers):
    a caller may back off and retry. False means retrying cannot help without a change."""


class Unavailable(LoglakeError, ConnectionError):
    """The service cannot be reached now: the connection was refused, lost or timed out. The
    request may or may not have been carried out (a lost reply), so only an idempotent request,
    or one whose repeat the caller tolerates, is retried blindly."""

    retriable = True


class DecodeError(LoglakeError, ValueError):
    """Bytes from outside (a file, a socket, a peer) do not decode as the format requires."""


class LocalProtocolError(LoglakeError):
    """The caller asked for something the protocol forbids."""


class RemoteProtocolError(LoglakeError):
    """The peer sent something the protocol forbids."""


def task_error(e: BaseException) -> Exception | None:
    """The typed error a Spark task raised, rebuilt on the driver from the wrapper Spark raised
    instead (``PythonException``, ``Py4JJavaError``, ``StreamingQueryException``), or None.

    Why: a task's ``LoglakeError`` (``LiveHistoryGone`` from a live range read in an executor,
    a job's own refusal) reaches the driver only as text, the Python traceback inside Spark's
    message; a caller catching the typed error, and the CLI printing it as one line, would see
    instead a wrapper and a hundred lines of JVM and worker stack. Spark keeps no exception
    object to unpickle, so the traceback's last exception line is read back: a class of
    ``loglake`` deriving from ``LoglakeError`` is rebuilt with that message (its own
    attributes, set by its ``__init__``, are not: the message already names what they hold);
    an ``OSError`` written ``[Errno N] reason: 'path'`` is rebuilt as one (the CLI names the
    path). Spark's own Parquet reader failing on a damaged file (no Python traceback at all) is
    the storage engine's ``CorruptSegment`` naming the file (``_damaged_parquet_line``).
    Anything else (a bug in a task, Spark's own failure) is None: the wrapper stands."""
    if not type(e).__module__.startswith(("pyspark", "py4j")):
        return None
    try:
        text = str(e)  # a Py4JJavaError asks the JVM, which may be gone
    except Exception:
        return None
    line = _last_exception_line(text) or _damaged_parquet_line(text)
    if line is None:
        return None
    name, _, message = line.partition(": ")
    if "." in name:
        module, _, qual = name.rpartition(".")
        if module != "loglake" and not module.startswith("loglake."):
            return None
        try:
            cls = getattr(importlib.import_module(module), qual)
        except (ImportError, AttributeError):
            return None
        if not (isinstance(cls, type) and issubclass(cls, LoglakeError)):
            return None
        err = cls.__new__(cls)
        Exception.__init__(err, message)
        return err
    cls = getattr(builtins, name, None)
    found = re.fullmatch(r"\[Errno (\d+)\] (.*?)(?:: '(.*)')?", message)
    if not (isinstance(cls, type) and issubclass(cls, OSError) and found):
        return None
    return OSError(int(found[1]), found[2], found[3])  # OSError picks the errno's subclass


_FAILED_READ_FILE = re.compile(
    r"\[FAILED_READ_FILE\.\w+\] Encountered error while reading file (\S+?)\.?\s"
)
"""Spark's error class for a file its reader could not read, naming the file (SQLSTATE KD001)."""
_DAMAGE_CAUSES = (
    "org.apache.parquet.",  # ParquetDecodingException: a page's CRC, a value that does not decode
    "shaded.parquet.org.apache.thrift.",  # a page header that does not parse
    "java.io.IOException: can not read class org.apache.parquet.format.",
    "java.io.EOFException",  # a page header's sizes past the column chunk
    "com.github.luben.zstd.",  # a page that does not decompress
)
"""``Caused by:`` lines of a ``FAILED_READ_FILE`` that mean the file's bytes are damaged. Not
a ``FileNotFoundException`` (a compaction or retention removed the file: not damage) nor a
disk's ``IOException`` (the file may be whole), which keep Spark's wrapper."""


def _damaged_parquet_line(text: str) -> str | None:
    """Where Spark's own Parquet reader (``read()``'s native half, ``compact``) failed on a
    file's damaged bytes — a page whose CRC does not match (``parquet.page.verify-checksum
    .enabled``), a page header that does not parse — the exception line of the storage
    engine's ``CorruptSegment`` naming the file, as pyarrow's reads in a task raise it
    (``log.lake.typed_lake_errors``). There is no Python traceback in that text, only the JVM's:
    the file is named by Spark's ``FAILED_READ_FILE`` and the damage by its first ``Caused by:``
    line that says so. The class is named, not imported: this module imports no part."""
    found = _FAILED_READ_FILE.search(text)
    if found is None:
        return None
    causes = [
        ln.strip().removeprefix("Caused by: ")
        for ln in text.splitlines()
        if ln.strip().startswith("Caused by: ")
    ]
    reason = next((c for c in causes if c.startswith(_DAMAGE_CAUSES)), None)
    if reason is None:
        return None
    path = found[1]
    if path.startswith("file:"):  # Spark names a local file by its URI (``%20`` for a blank)
        from urllib.parse import unquote, urlsplit

        path = unquote(urlsplit(path).path)
    message = f"{path}: corrupt record at byte 0: unreadable Parquet: {reason[:300]}"
    return f"loglake.log.api.CorruptSegment: {message}"


def _last_exception_line(text: str) -> str | None:
    """The exception line (``module.Class: message``) closing the last Python traceback in
    ``text``: the first line after ``Traceback (most recent call last):`` that is not indented
    (the frames are). The last traceback is the one raised last (a chained one comes after the
    exception it was raised while handling)."""
    lines = text.splitlines()
    found = None
    i = 0
    while i < len(lines):
        if lines[i].endswith("Traceback (most recent call last):"):
            i += 1
            while i < len(lines) and lines[i].startswith(" "):
                i += 1
            if i < len(lines):
                found = lines[i]
        i += 1
    return found


SHOWN_CHARS = 80
"""How much of a value from outside an error message quotes."""


PATH_CHARS = 512
"""How much of a path an error names: more than of other values (``SHOWN_CHARS``), as a
path's end names the file and real ones pass 80 characters (a pytest worker's tmp dir does)."""


def cut(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text``, or its first ``limit`` characters, an ellipsis and its length. Why: messages
    quote what the user gave (a config value, a stream name), and a 5000-character value made
    a 5000-character error line that hid the words saying what was wrong."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` as an error message quotes it, cut as ``cut`` does; the length given is
    the value's own (characters of a string, items of a list), which says more than its
    repr's."""
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<?>"
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        size = f"{len(value)} characters"
    elif isinstance(value, list | tuple | dict | set | frozenset):
        size = f"{len(value)} item{'s' if len(value) != 1 else ''}"
    else:
        size = f"{len(text)} characters"
    return f"{text[:limit]}… ({size})"
