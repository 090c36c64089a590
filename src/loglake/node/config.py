"""The node's configuration: one TOML file, every option also a flag and an env variable.

Why one table (``OPTIONS``): the TOML keys, the ``loglake node`` flags, the ``LOGLAKE_...``
variables, the defaults and the checks are the same list, so they cannot drift apart. A value
is taken from, in order: the flag, the environment, the file, the default. Everything is
checked at start and an error names the key and where the bad value came from::

    [http] port: expected an integer 0-65535, got 'eighty' (from LOGLAKE_HTTP_PORT)

Keys (section ``""`` is the top level): ``data_dir``, ``console``; ``[http]`` host, port,
metrics, metrics_public, metrics_consumers, send_timeout; ``[streams]`` enabled, host, port,
durability, segment_bytes, retention_interval, backend, replicas, nats_prefix, nats_creds,
nats_monitor, lease_ttl, seal_interval;
``[limits]`` the stream server's bounds on clients (``streams/limits.py``); ``[events]``
enabled, roles, namespaces; ``[archives]`` enabled, control, member, stream, channel, layout,
check_every, wait, trackers, max_archive_bytes, max_fetch_bytes, fetch_deadline; ``[sds]``
enabled, channel, participants, sync_interval; ``[jobs]`` enabled. docs/node.md has the table
with defaults.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

from loglake.clitools import MAX_RATE, MAX_SECONDS
from loglake.errors import PATH_CHARS, LoglakeError, cut, shown
from loglake.streams.limits import describe, limit_fields, parse_limit

ROLES = ("orchestrator", "broadcaster", "publisher", "subscriber")
CONSUMER_SERIES = 100
"""``[http] metrics_consumers``' default: the most behind consumers that get their own
``loglake_consumer_lag`` series (``node/metrics.py``). Why a bound: any client may save an index
under any id, and one series per index made 20,000 ids of 1 KB a 20 MB scrape."""
MAX_CONSUMER_SERIES = 100_000
LAYOUTS = ("spec", "status-go")
DURABILITIES = ("always", "batch", "none")


class ConfigError(LoglakeError):
    """The node's configuration is not valid; the message names the key."""


Check = Callable[[Any], Any]
"""Takes the raw value (TOML value, or a string from a flag/env) and returns the typed value,
or raises ``ValueError`` whose text says what was expected."""


def _int(lo: int, hi: int) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, str):
            try:
                v = int(v.strip())
            except ValueError:
                raise ValueError(f"expected an integer {lo}-{hi}") from None
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f"expected an integer {lo}-{hi}")
        return v

    return check


def _float(lo: float, hi: float = MAX_SECONDS) -> Check:
    """A number from ``lo`` to ``hi`` (a period or wait: at most ``clitools.MAX_SECONDS``, a
    year, as on the command line): ``inf`` or ``1e300`` stopped the node at start with an
    ``OverflowError`` traceback instead of naming the key."""
    expected = f"expected a number {lo:g}-{hi:.0f}"

    def check(v: Any) -> float:
        if isinstance(v, str):
            try:
                v = float(v.strip())
            except ValueError:
                raise ValueError(expected) from None
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise ValueError(expected)  # nan and inf too
        return float(v)

    return check


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("expected a non-empty string")
    return v


def _choice(*choices: str) -> Check:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return str(v)

    return check


def _names(allowed: tuple[str, ...] | None = None) -> Check:
    """A list of names: a TOML array, or comma-separated in a flag or env variable."""

    def check(v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) and x for x in v):
            raise ValueError("expected a list of names")
        if allowed is not None:
            bad = [x for x in v if x not in allowed]
            if bad:
                raise ValueError(f"{shown(bad[0])} is not one of {', '.join(allowed)}")
        if len(set(v)) != len(v):
            raise ValueError("names must not repeat")
        return tuple(v)

    return check


def _trackers(v: Any) -> tuple[str, ...]:
    """Tracker announce URLs: a TOML array, or comma-separated in a flag or env variable; an
    empty list means a torrent without trackers."""
    from loglake.archives.errors import ArchiveConfigError
    from loglake.archives.torrent import check_trackers

    if isinstance(v, str):
        v = [x.strip() for x in v.split(",") if x.strip()]
    try:
        return check_trackers(v)
    except ArchiveConfigError as e:
        raise ValueError(str(e)) from None


def _topics(v: Any) -> tuple[str, ...]:
    """The community's channel topics: a TOML array, or comma-separated in a flag or env
    variable; read by the layout (hex for status-go) and bounded in ``_check_rules``, which
    knows the layout."""
    if isinstance(v, str):
        v = [x.strip() for x in v.split(",") if x.strip()]
    if not isinstance(v, list | tuple) or not all(isinstance(x, str) and x for x in v):
        raise ValueError("expected a list of topics")
    if len(set(v)) != len(v):
        raise ValueError("topics must not repeat")
    return tuple(v)


def archive_topics(section: Any) -> tuple[bytes | str, ...] | None:
    """``[archives] topics`` read by ``[archives] layout`` and held to an archive's bounds
    (``archives.builder.check_topics``); a ``ConfigError`` names the key. None: unset."""
    from loglake.archives.builder import check_topics
    from loglake.archives.errors import ArchiveConfigError
    from loglake.archives.layout import get_layout

    if section.topics is None:
        return None
    layout = get_layout(section.layout)
    try:
        return check_topics(layout.parse_topic(t) for t in section.topics)
    except ArchiveConfigError as e:
        raise ConfigError(f"[archives] topics: {e}") from None


def _nats_url(v: Any) -> str:
    """``nats://h1:4222,h2:4222`` (``tls://`` too): the servers of one NATS cluster."""
    from loglake.streams.nats_url import check_url, split_servers

    url = _str(v).strip()
    split_servers(url)  # "no NATS server in ' , '"
    # the rule of every --backend (``notaurl`` was taken here and dialled as nats://notaurl),
    # with the scheme-less ``h1:4222,h2:4222`` this key has always taken
    try:
        return check_url(url, bare=True)
    except ValueError as e:  # the whole URL is named once, by the ", got ..." of the error
        raise ValueError(str(e).removeprefix(f"{url!r}: ")) from None


def _stream(prefix: str = "") -> Check:
    """A name the part keeps in the stream ``prefix + name`` (``[sds] channel`` → ``sds.<it>``),
    checked with the log's rule: a name the log refuses used to pass here and leave the part
    failing every round (archives, ICRC registration) with the node up, or stop it with an error
    that named no key."""

    def check(v: Any) -> str:
        from loglake.streams.api import check_stream_name

        name = _str(v)
        check_stream_name(prefix + name)  # InvalidStreamName is a ValueError
        return name

    return check


def _namespaces(v: Any) -> tuple[str, ...]:
    """ICRC namespaces: the orchestrator keeps each in the stream of its name
    (``events/orchestrator.py`` checks it on registration, too late for the config)."""
    names: tuple[str, ...] = _names()(v)
    for name in names:
        _stream()(name)
    return names


def _nats_prefix(v: Any) -> str:
    """What JetStreamLog accepts as a prefix (``streams.jetstream.check_prefix``), checked
    here so a bad one is the config's error, not a ValueError traceback as the log opens."""
    from loglake.streams.jetstream import check_prefix

    return check_prefix(_str(v))


def _nats_creds(v: Any) -> Path:
    """A NATS ``.creds`` file, and what reading it needs (``jetstream.check_creds_readable``:
    a missing one surfaced as a connect timeout naming something else)."""
    from loglake.streams.jetstream import check_creds_readable

    return check_creds_readable(_path(v))


def _monitor_urls(v: Any) -> tuple[str, ...]:
    """``http://h1:8222,http://h2:8222``: the NATS servers' monitoring endpoints (``-m``)."""
    if isinstance(v, str):
        v = [x.strip() for x in v.split(",") if x.strip()]
    if not isinstance(v, list | tuple) or not all(
        isinstance(x, str) and x.startswith(("http://", "https://")) for x in v
    ):
        raise ValueError("expected http://host:port[,http://host:port…] (the servers' -m ports)")
    return tuple(x.rstrip("/") for x in v)


def _path(v: Any) -> Path:
    return Path(_str(v)).expanduser()


@dataclass(frozen=True, slots=True)
class Option:
    section: str
    key: str
    check: Check
    default: Any
    help: str

    @property
    def name(self) -> str:
        """``section.key`` (``key`` at the top level): the attribute path on ``NodeConfig``."""
        return f"{self.section}.{self.key}" if self.section else self.key

    @property
    def flag(self) -> str:
        return "--" + self.name.replace(".", "-").replace("_", "-")

    @property
    def env(self) -> str:
        return "LOGLAKE_" + self.name.replace(".", "_").upper()

    @property
    def where(self) -> str:
        """How an error names the key: ``[http] port``, or ``data_dir`` at the top."""
        return f"[{self.section}] {self.key}" if self.section else self.key

    @property
    def is_bool(self) -> bool:
        return self.check is _bool

    @property
    def toml_type(self) -> str | None:
        """The TOML type a file must give (``port = 8080``), None where text is the value.

        Why: flags and variables are text, so the checks parse strings; a string in the file
        for a number, boolean or list (``port = "8080"``, ``enabled = "false"``) is an
        operator's mistake the checks would have quietly read, and a file should mean one
        thing. ``[limits]`` takes sizes as text (``"32MiB"``), so it is left out; a list may be
        one comma-separated string, as in a flag (``nats_monitor = "http://h1:8222,…"``, the
        form docs/operations.md shows and ``LocalNatsCluster.monitor_urls`` gives): it cannot
        be read as anything else."""
        if self.section == "limits":
            return None
        return _TOML_TYPES.get(type(self.default))


_TOML_TYPES = {
    bool: "true or false (no quotes)",
    int: "an integer (no quotes)",
    float: "a number (no quotes)",
}


OPTIONS: tuple[Option, ...] = (
    Option("", "data_dir", _path, None, "Data dir (log, lake, token, part state)."),
    Option("", "console", _bool, True, "Serve the web console at /console/."),
    Option("http", "host", _str, "127.0.0.1", "HTTP API address (loopback by default)."),
    Option("http", "port", _int(0, 65535), 8080, "HTTP API port (0: any free port)."),
    Option("http", "metrics", _bool, True, "Serve /metrics (and count pushes and pulls)."),
    Option("http", "metrics_public", _bool, False, "/metrics without the bearer token."),
    Option(
        "http",
        "metrics_consumers",
        _int(0, MAX_CONSUMER_SERIES),
        CONSUMER_SERIES,
        "Consumers with their own loglake_consumer_lag series in /metrics: the most behind "
        "(every consumer is counted in the loglake_consumers* aggregates).",
    ),
    Option(
        "http",
        "send_timeout",
        _float(0.1, 86400.0),
        30.0,
        "Period (s) of the answers' clock: a client taking none for 4 of them is dropped.",
    ),
    Option("streams", "enabled", _bool, True, "Run the Ockam stream service (TCP)."),
    Option("streams", "host", _str, "127.0.0.1", "Stream service address."),
    Option("streams", "port", _int(0, 65535), 4000, "Stream service port (0: any)."),
    Option("streams", "durability", _choice(*DURABILITIES), "batch", "fsync policy, new streams."),
    Option("streams", "segment_bytes", _int(4096, 2**40), 64 * 1024 * 1024, "Segment roll size."),
    Option("streams", "retention_interval", _float(0.1), 60.0, "Seconds between retention runs."),
    Option(
        "streams",
        "backend",
        _nats_url,
        None,
        "Keep every part's streams in NATS JetStream, nats://h1:4222,h2:4222,h3:4222; the data "
        "dir then keeps only the sealed lake and caches (default: the embedded log there).",
    ),
    Option("streams", "replicas", _int(1, 5), 1, "With backend: replicas of each stream created."),
    Option(
        "streams",
        "nats_prefix",
        _nats_prefix,
        "loglake",
        "With backend: namespace of stream names.",
    ),
    Option("streams", "nats_creds", _nats_creds, None, "With backend: a NATS .creds file."),
    Option(
        "streams",
        "lease_ttl",
        _int(1, 3600),
        5,
        "With backend: seconds a dead node keeps once-only work (the sealer, retention, the "
        "ICRC journal, the archives control node) before another node takes it over.",
    ),
    Option(
        "streams",
        "nats_monitor",
        _monitor_urls,
        (),
        "With backend: the NATS servers' monitoring URLs (http://h1:8222,…), read for the "
        "cluster's meta leader and peers (/api/cluster, /metrics); none: stream groups only.",
    ),
    Option(
        "streams",
        "seal_interval",
        _float(0.1),
        60.0,
        "With backend: seconds between copies of JetStream history into the data dir's lake.",
    ),
    Option("events", "enabled", _bool, False, "Run ICRC-72/77 roles in this process."),
    Option("events", "roles", _names(ROLES), ROLES, "Which roles (comma-separated)."),
    Option("events", "namespaces", _namespaces, (), "Namespaces the publisher registers."),
    Option(
        "events",
        "transport",
        _choice("inprocess", "http"),
        "inprocess",
        "inprocess: the roles on one in-process network; http: each role served over HTTP "
        "(any subset; others reached through the directory).",
    ),
    Option(
        "events",
        "replay_rate",
        _float(0.0, MAX_RATE),
        0.0,
        "Events a second one replay is sent at, at most (0: no limit); spares the node and "
        "slow subscribers.",
    ),
    Option("events", "http_host", _str, "127.0.0.1", "(http) address the roles listen on."),
    Option("events", "http_port", _int(0, 65535), 0, "(http) first role port (0: any)."),
    Option("events", "directory", _path, None, "(http) JSON {principal: url} of other roles."),
    Option("events", "orchestrator", _str, None, "(http) principal of a remote orchestrator."),
    Option("events", "broadcasters", _names(), (), "(http) principals of remote broadcasters."),
    Option("archives", "enabled", _bool, False, "Run the Status archives loops."),
    Option("archives", "control", _bool, True, "Run the control node loop (build, seed)."),
    Option("archives", "member", _bool, True, "Run a member loop (follow, fetch)."),
    Option("archives", "stream", _stream(), "community", "Community stream."),
    Option("archives", "channel", _stream(), "community-archives", "Special channel stream."),
    Option("archives", "layout", _choice(*LAYOUTS), "spec", "Archive byte layout."),
    Option(
        "archives",
        "topics",
        _topics,
        None,
        "The community's channel topics (hex for status-go): only messages on them are "
        "archived, and every archive lists them all (the spec's rule). Unset: each archive "
        "lists the topics its messages carry, at most 100 of at most 256 bytes, which anyone "
        "who can post to the stream picks.",
    ),
    Option("archives", "check_every", _float(0.1), 60.0, "Control loop period, s."),
    Option("archives", "wait", _float(0.0), 20.0, "Member quiet period after a magnet, s."),
    Option(
        "archives",
        "max_archive_bytes",
        _int(1, 2**62),
        None,
        "The member refuses a fetch whose index names a missing archive bigger than this "
        "(default: 128 MiB, loglake.archives' MAX_FETCHED_ARCHIVE_BYTES).",
    ),
    Option(
        "archives",
        "max_fetch_bytes",
        _int(1, 2**62),
        None,
        "Bytes of archives the member downloads in one fetch at most: the newest windows that "
        "fit, the older ones left for a later fetch (default: 1 GiB, loglake.archives.member's "
        "MAX_FETCH_BYTES).",
    ),
    Option(
        "archives",
        "fetch_deadline",
        _float(0.1),
        None,
        "Seconds a member's fetch may wait on peers in all (metadata, index, every archive) "
        "before it fails and is retried after the quiet period (default: 600).",
    ),
    Option(
        "archives",
        "trackers",
        _trackers,
        None,
        "Tracker URLs put in the torrent and magnet (an empty list: none; the layout's: "
        "status-go's two UDP trackers for status-go, none for spec).",
    ),
    Option("sds", "enabled", _bool, False, "Run SDS participants on a channel stream."),
    Option(
        "sds", "channel", _stream("sds."), "chat", "SDS channel id (its stream: sds.<channel>)."
    ),
    Option("sds", "participants", _names(), ("alice", "bob"), "Participant ids."),
    Option(
        "sds",
        "sync_interval",
        _float(0.1),
        2.0,
        "Seconds between a participant's periodic syncs, sent only while a peer lacks something "
        "(unacknowledged messages, missing dependencies, acks owed): a settled channel is quiet.",
    ),
    Option("jobs", "enabled", _bool, False, "Allow Spark jobs through the API (needs Java)."),
    *(  # the stream server's bounds on clients: one table, streams/limits.py
        Option("limits", f.name, functools.partial(parse_limit, f), f.default, describe(f))
        for f in limit_fields()
    ),
)
SECTIONS = {o.section for o in OPTIONS if o.section}


class Section:
    """One TOML section's typed values, as attributes (``config.http.port``)."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # for mypy: the keys are OPTIONS'
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"Section({self.__dict__})"


@dataclass(frozen=True)
class NodeConfig:
    data_dir: Path
    console: bool
    http: Section
    streams: Section
    events: Section
    archives: Section
    sds: Section
    jobs: Section
    limits: Section
    source: dict[str, str]
    """``section.key`` → where its value came from (flag, env, file, default)."""


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("loglake"))


MAX_CONFIG_BYTES = 1024 * 1024
"""A node's config is a few KiB; reading stops past this. Why a bound: ``--config /dev/zero``
(or a log file named by mistake) was read whole into memory until a MemoryError traceback."""


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_CONFIG_BYTES + 1)  # a pipe (--config <(...)) reads as well
        if len(text) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: not a config file: larger than {MAX_CONFIG_BYTES} bytes")
        return tomllib.loads(text.decode())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text (byte {e.start})") from None
    except ValueError as e:  # tomllib lets int()'s limit through: 4300 digits (the part before
        # its "; use sys.set_int_max_str_digits()" is for programmers)
        raise ConfigError(f"{path}: not a config file: {str(e).split(';')[0]}") from None


def load_config(
    path: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    data: Mapping[str, Any] | None = None,
) -> NodeConfig:
    """The node's config from ``path`` (or ``data``, an already-read TOML table), ``env``
    (default ``os.environ``) and ``flags`` (``Option.name`` → value; None = not given)."""
    file = dict(data) if data is not None else (read_toml(path) if path is not None else {})
    env = os.environ if env is None else env
    flags = flags or {}
    where = str(path) if path is not None else "config"
    _reject_unknown(file, where)
    values: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    top: dict[str, Any] = {}
    source: dict[str, str] = {}
    for o in OPTIONS:
        raw, origin = o.default, "default"
        table = file.get(o.section, {}) if o.section else file
        if o.key in table:
            raw, origin = table[o.key], where
        if o.env in env:
            raw, origin = env[o.env], o.env
        if flags.get(o.name) is not None:
            raw, origin = flags[o.name], o.flag
        if raw is None:
            value = None
        else:
            try:
                value = o.check(raw)
                if origin == where and isinstance(raw, str) and o.toml_type is not None:
                    raise ValueError(f"expected {o.toml_type}")
            except ValueError as e:
                raise ConfigError(f"{o.where}: {e}, got {shown(raw)} (from {origin})") from None
        source[o.name] = origin
        (values[o.section] if o.section else top)[o.key] = value
    cfg = NodeConfig(
        data_dir=top["data_dir"] or default_data_dir(),
        console=top["console"],
        source=source,
        **{s: Section(v) for s, v in values.items()},
    )
    _check_together(cfg)
    return cfg


OTHER_VARIABLES = frozenset(
    {
        "LOGLAKE_CONFIG",  # `loglake node --config`
        "LOGLAKE_ARCHIVES_KEY",  # `loglake archives`' control key
        "LOGLAKE_EVENTS_KEY",  # `loglake events`' key and role URL
        "LOGLAKE_EVENTS_URL",
        "LOGLAKE_EVENT_LOOP",  # streams/eventloop.py
        "LOGLAKE_SPARK_MASTER",
        "LOGLAKE_TLS_CA",
        "LOGLAKE_TLS_CERT",
        "LOGLAKE_TLS_KEY",
    }
)
"""``LOGLAKE_*`` variables other commands read: not the node's, not typos."""


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """A warning per ``LOGLAKE_*`` variable that looks like a node setting but names none
    (``LOGLAKE_HTTP_PROT``): the environment is shared with other programs, so this warns
    where an unknown key in the file stops the node; either way a typo is not silently
    ignored. Looks like a setting: a section's prefix (``LOGLAKE_HTTP_``), or close to a
    setting's name."""
    import difflib

    env = os.environ if env is None else env
    known = [o.env for o in OPTIONS]
    prefixes = tuple(f"LOGLAKE_{s.upper()}_" for s in SECTIONS)
    out = []
    for name in sorted(env):
        if not name.startswith("LOGLAKE_") or name in known or name in OTHER_VARIABLES:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close or name.startswith(prefixes):
            hint = f"; did you mean {close[0]}?" if close else ""
            out.append(f"warning: {name} is not a node setting and is ignored{hint}")
    return out


def _reject_unknown(file: Mapping[str, Any], where: str) -> None:
    known_top = {o.key for o in OPTIONS if not o.section}
    for key, value in file.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"[{key}]: expected a table, got {shown(value)} ({where})")
            known = {o.key for o in OPTIONS if o.section == key}
            for k in value:
                if k not in known:
                    raise ConfigError(
                        f"[{key}] {cut(k)}: unknown key ({where}); "
                        f"known: {', '.join(sorted(known))}"
                    )
        elif key not in known_top:
            raise ConfigError(
                f"{cut(key)}: unknown key ({where}); "
                f"top-level keys: {', '.join(sorted(known_top))}, "
                f"sections: {', '.join(sorted(SECTIONS))}"
            )


def _check_together(cfg: NodeConfig) -> None:
    """Rules across keys, each naming the key to change."""
    if cfg.events.enabled and cfg.events.transport == "http":
        _check_events_http(cfg)
    elif cfg.events.enabled:
        roles = set(cfg.events.roles)
        if not roles:
            raise ConfigError("[events] roles: at least one role when [events] enabled")
        if roles - {"orchestrator"} and "orchestrator" not in roles:
            raise ConfigError(
                "[events] roles: the roles run in one in-process network, so they need the "
                "orchestrator (add 'orchestrator', or set [events] transport = \"http\" to "
                "reach one elsewhere)"
            )
        if "orchestrator" in roles and "broadcaster" not in roles:
            raise ConfigError("[events] roles: the orchestrator needs a 'broadcaster'")
        if cfg.events.namespaces and "publisher" not in roles:
            raise ConfigError("[events] namespaces: registering namespaces needs 'publisher'")
    if cfg.archives.enabled and not (cfg.archives.control or cfg.archives.member):
        raise ConfigError("[archives] control: enable the control loop, the member, or both")
    if cfg.archives.topics is not None:
        archive_topics(cfg.archives)  # ConfigError naming the key, before the node starts
    if cfg.sds.enabled and len(cfg.sds.participants) < 1:
        raise ConfigError("[sds] participants: at least one participant")
    if cfg.streams.replicas > 1 and not cfg.streams.backend:
        raise ConfigError("[streams] replicas: replicas are JetStream's; set [streams] backend")
    http = (cfg.http.host, cfg.http.port)
    if cfg.streams.enabled and _clash((cfg.streams.host, cfg.streams.port), http):
        raise ConfigError(
            f"[streams] port: {cut(cfg.streams.host)}:{cfg.streams.port} clashes with [http] "
            f"{cut(cfg.http.host)}:{cfg.http.port} (one address, or a wildcard and any of its "
            "family)"
        )


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _addresses(host: str) -> set[Address] | None:
    """The addresses a listener on ``host`` binds: a literal as it is, a name as it resolves
    (``localhost`` → 127.0.0.1), as the node's binds resolve it; None if it does not resolve
    (the bind will say so; until then the names themselves are compared)."""
    try:
        return {ipaddress.ip_address(host)}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, ValueError):  # gaierror; a NUL byte, a label over 63 characters
        return None
    return {ipaddress.ip_address(info[4][0]) for info in infos}


def _clash(a: tuple[str, int], b: tuple[str, int]) -> bool:
    """Whether listeners on ``a`` and ``b`` (``(host, port)``) cannot both bind, as Linux
    decides: the same port, not 0 (any free port never clashes), and the same address, or a
    wildcard (``0.0.0.0``, ``::``) and any address of its family. Other families never
    clash: the node's listeners bind IPv4 only, or IPv6 only (asyncio's ``create_server``
    sets ``IPV6_V6ONLY``). Why not the ports alone: two roles on different interfaces with one
    port bind side by side, and were refused."""
    (host_a, port_a), (host_b, port_b) = a, b
    if not port_a or port_a != port_b:
        return False
    addrs_a, addrs_b = _addresses(host_a), _addresses(host_b)
    if addrs_a is None or addrs_b is None:
        return host_a == host_b
    return any(
        x.version == y.version and (x == y or x.is_unspecified or y.is_unspecified)
        for x in addrs_a
        for y in addrs_b
    )


def _check_events_http(cfg: NodeConfig) -> None:
    from loglake.events.identity import PrincipalError, principal_from_text

    ev = cfg.events
    roles = set(ev.roles)
    if not roles:
        raise ConfigError("[events] roles: at least one role when [events] enabled")
    for key in ("orchestrator", *(["broadcasters"] if ev.broadcasters else [])):
        values = [ev.orchestrator] if key == "orchestrator" else list(ev.broadcasters)
        for v in values:
            if v is None:
                continue
            try:
                principal_from_text(v)
            except PrincipalError as e:
                raise ConfigError(f"[events] {key}: {e}") from None
    if "orchestrator" not in roles:
        if not ev.orchestrator:
            raise ConfigError(
                "[events] orchestrator: the principal of the orchestrator these roles use "
                "(this node runs none)"
            )
        if not ev.directory:
            raise ConfigError("[events] directory: where the remote orchestrator listens")
    elif "broadcaster" not in roles and not ev.broadcasters:
        raise ConfigError("[events] broadcasters: the orchestrator needs a broadcaster")
    if ev.directory is not None:  # read at start too: a bad file is the config's error
        from loglake.events.server import DirectoryError, load_directory

        path = cut(str(ev.directory), PATH_CHARS)
        try:
            if not Path(ev.directory).is_file():
                raise ConfigError(f"[events] directory: {path} is not a file")
            load_directory(ev.directory)
        except DirectoryError as e:
            raise ConfigError(f"[events] directory: {e}") from None
        except OSError as e:
            # is_file answers False only for a missing file or folder: a name longer than the
            # file system takes (ENAMETOOLONG) raised, and the node said "File name too long:"
            # and the whole path, naming no setting (as jetstream.check_creds_readable)
            raise ConfigError(f"[events] directory: {path}: {e.strerror or e}") from None
    ports = role_ports(ev.roles, ev.http_port)
    last = max(ports.values())
    if last > 65535:
        raise ConfigError(
            f"[events] http_port: {len(ports)} roles from {ev.http_port} need ports up to "
            f"{last}, past 65535"
        )
    others = {"[http]": (cfg.http.host, cfg.http.port)}
    if cfg.streams.enabled:
        others["[streams]"] = (cfg.streams.host, cfg.streams.port)
    for name, (host, port) in others.items():
        for role, role_port in ports.items():
            if _clash((ev.http_host, role_port), (host, port)):
                raise ConfigError(
                    f"[events] http_port: the {role}'s {cut(ev.http_host)}:{role_port} overlaps "
                    f"{name} {cut(host)}:{port}"
                )


def role_ports(roles: tuple[str, ...], base: int) -> dict[str, int]:
    """The port each ICRC role the node runs listens on with ``transport = "http"``, in the
    order of ``ROLES``: ``base``, ``base + 1``, … one per role configured (all 0, any free port,
    when ``base`` is 0). The config's clash check and the node's binds (``api/events_http.py``)
    both read it: the check assumed four ports whatever the roles, and refused a listener on a
    port the node never binds."""
    ordered = [r for r in ROLES if r in roles]
    return {r: (base + i if base else 0) for i, r in enumerate(ordered)}


def embedded_default(
    data_dir: Path, http_port: int = 0, streams: Mapping[str, Any] | None = None
) -> NodeConfig:
    """Every part on, any free ports: the walkthrough's node (``loglake node walkthrough``);
    ``streams`` adds ``[streams]`` keys (a JetStream ``backend``)."""
    return load_config(
        data={
            "data_dir": str(data_dir),
            "http": {"port": http_port},
            "streams": {"port": 0, **(streams or {})},
            "events": {"enabled": True, "namespaces": ["demo.events"]},
            "archives": {"enabled": True, "wait": 0.0, "check_every": 1.0},
            "sds": {"enabled": True},
        },
        env={},
    )
