"""The node's config (TOML + flags + env, errors naming the key) and its token file."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import stat
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from loglake.node.auth import TokenFileError, load_or_create_token
from loglake.node.command import command
from loglake.node.config import OPTIONS, ConfigError, load_config
from tests.conftest import require_peer


def _cfg(data: dict, env: dict | None = None, flags: dict | None = None):
    return load_config(data=data, env=env or {}, flags=flags)


def test_defaults_bind_loopback() -> None:
    cfg = _cfg({})
    assert cfg.http.host == "127.0.0.1" and cfg.streams.host == "127.0.0.1"
    assert (cfg.http.port, cfg.streams.port) == (8080, 4000)
    assert not cfg.events.enabled and cfg.console


def test_flag_beats_env_beats_file() -> None:
    data = {"http": {"port": 1000}}
    assert _cfg(data).http.port == 1000
    assert _cfg(data, env={"LOGLAKE_HTTP_PORT": "2000"}).http.port == 2000
    cfg = _cfg(data, env={"LOGLAKE_HTTP_PORT": "2000"}, flags={"http.port": "3000"})
    assert cfg.http.port == 3000 and cfg.source["http.port"] == "--http-port"


@pytest.mark.parametrize(
    "data, env, message",
    [
        ({"http": {"prot": 1}}, {}, "[http] prot: unknown key"),
        ({"colour": True}, {}, "colour: unknown key"),
        ({"http": 5}, {}, "[http]: expected a table"),
        ({"http": {"port": "eighty"}}, {}, "[http] port: expected an integer 0-65535"),
        ({}, {"LOGLAKE_HTTP_PORT": "70000"}, "(from LOGLAKE_HTTP_PORT)"),
        ({"streams": {"durability": "sometimes"}}, {}, "[streams] durability: expected one of"),
        ({"events": {"roles": ["king"]}}, {}, "[events] roles: 'king' is not one of"),
        ({"http": {"metrics": "maybe"}}, {}, "[http] metrics: expected true or false"),
        (
            {"events": {"enabled": True, "roles": ["publisher"]}},
            {},
            "[events] roles: the roles run in one in-process network",
        ),
        (
            {"streams": {"port": 9000}, "http": {"port": 9000}},
            {},
            "[streams] port: 127.0.0.1:9000 clashes with [http] 127.0.0.1:9000",
        ),
    ],
)
def test_config_errors_name_the_key(data: dict, env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _cfg(data, env)
    assert message in str(e.value)


def test_toml_file_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "loglake.toml"
    bad.write_text("[http]\nport = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})
    bad.write_text('[sds]\nparticipant = ["a"]\n')
    with pytest.raises(ConfigError, match=r"\[sds\] participant: unknown key \(.*loglake.toml\)"):
        load_config(bad, env={})


def test_every_option_is_a_flag_and_an_env_variable() -> None:
    help_text = " ".join(CliRunner().invoke(command, ["--help"], terminal_width=200).output.split())
    for o in OPTIONS:
        assert o.flag in help_text and o.env in help_text, o.name
    assert OPTIONS[0].env == "LOGLAKE_DATA_DIR"


def test_a_bad_flag_is_a_one_line_error_naming_the_key(tmp_path: Path) -> None:
    r = CliRunner().invoke(command, ["--data-dir", str(tmp_path), "--http-port", "x"])
    assert r.exit_code == 1 and "Error: [http] port: expected an integer" in r.output


def test_token_is_made_once_with_mode_0600(tmp_path: Path) -> None:
    first = load_or_create_token(tmp_path)
    assert first.created and len(first.value) >= 40
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    again = load_or_create_token(tmp_path)
    assert not again.created and again.value == first.value


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    os.chmod(token.path, 0o644)
    with pytest.raises(TokenFileError, match="readable by others"):
        load_or_create_token(tmp_path)


def test_a_token_shorter_than_the_minimum_is_refused_at_start(tmp_path: Path) -> None:
    """A one-character token file was taken: the API was then open to whoever tried a-z."""
    import socket

    _key_file(tmp_path, "node.token", b"x\n")
    config = tmp_path / "loglake.toml"
    with socket.socket() as taken:  # were the token taken, the start would stop on the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config.write_text(
            f'data_dir = "{tmp_path / "data"}"\nconsole = false\n'
            f"[http]\nport = {taken.getsockname()[1]}\n[streams]\nenabled = false\n"
        )
        r = CliRunner().invoke(command, ["--config", str(config)])
    out = r.output
    assert r.exit_code == 1 and len(out.splitlines()) == 1, out
    assert str(tmp_path / "data" / "node.token") in out
    assert "token of 1 characters, shorter than 16" in out
    _key_file(tmp_path, "node.token", b"0123456789abcde\n")  # 15
    with pytest.raises(TokenFileError, match="shorter than 16"):
        load_or_create_token(tmp_path / "data")


def test_tokens_the_node_makes_and_an_openssl_hex_token_pass_the_minimum(tmp_path: Path) -> None:
    made = load_or_create_token(tmp_path)
    assert made.created and len(made.value) >= 16
    assert load_or_create_token(tmp_path).value == made.value  # read back: taken
    own = secrets.token_hex(8)  # what `openssl rand -hex 8` prints: 16 characters
    _key_file(tmp_path, "node.token", own.encode() + b"\n")
    assert load_or_create_token(tmp_path / "data").value == own


def test_a_taken_port_is_a_readable_error_and_releases_the_data_dir(tmp_path: Path) -> None:
    import socket

    from loglake.node.runner import BackgroundNode, NodeStartError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        data = {"data_dir": str(tmp_path), "console": False, "streams": {"port": 0}}
        cfg = _cfg({**data, "http": {"port": taken}})
        with pytest.raises(NodeStartError, match=f"cannot listen on 127.0.0.1:{taken}"):
            BackgroundNode(cfg).start()
    with BackgroundNode(_cfg({**data, "http": {"port": 0}})) as node:  # the log lock was freed
        assert node.url.startswith("http://127.0.0.1:")


def test_the_banner_prints_the_token_on_first_start_only(tmp_path: Path) -> None:
    from loglake.node.runner import BackgroundNode, token_banner

    data = {"data_dir": str(tmp_path), "console": False, "http": {"port": 0}}
    cfg = _cfg({**data, "streams": {"enabled": False}})
    with BackgroundNode(cfg) as node:
        first, token = token_banner(node.node), node.token
    with BackgroundNode(cfg) as node:
        again = token_banner(node.node)
        assert node.token == token
    assert token in first and "printed once" in first
    assert token not in again and f"access token in {tmp_path / 'node.token'}" in again
    for banner in (first, again):  # a console link that logs in once, never the token
        [link] = [line for line in banner.splitlines() if "/console/#login=" in line]
        assert token not in link


def test_a_failed_first_start_leaves_no_token_so_the_next_start_prints_one(tmp_path: Path) -> None:
    """The token file used to survive a start that failed before its banner: every later start
    then said only "access token in ..." and never printed the token."""
    import socket

    from loglake.node.runner import BackgroundNode, NodeStartError, token_banner

    data = {"data_dir": str(tmp_path), "console": False, "streams": {"enabled": False}}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(NodeStartError):
            BackgroundNode(_cfg({**data, "http": {"port": taken}})).start()
    assert not (tmp_path / "node.token").exists()
    with BackgroundNode(_cfg({**data, "http": {"port": 0}})) as node:
        banner = token_banner(node.node)
        assert node.token in banner and "/console/#login=" in banner


def test_a_token_that_cannot_be_written_whole_is_not_left_behind(tmp_path: Path) -> None:
    """On a full disk the token file was created empty and every later start refused it."""
    from tests.tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "full", "64k") as full:
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        with pytest.raises(OSError):
            load_or_create_token(full)
        assert not (full / "node.token").exists()


def test_a_login_code_is_good_once_and_until_it_expires() -> None:
    from loglake.node.auth import MAX_LOGIN_CODES, LoginCodes

    now = [0.0]
    codes = LoginCodes(clock=lambda: now[0])
    a, b = codes.issue(), codes.issue(ttl_s=10)
    assert codes.redeem(a) and not codes.redeem(a)  # once
    assert not codes.redeem("made-up")
    now[0] = 11
    assert not codes.redeem(b)  # expired
    many = [codes.issue() for _ in range(MAX_LOGIN_CODES + 1)]
    assert not codes.redeem(many[0]) and codes.redeem(many[-1])  # the oldest went


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("sds", "sync_interval", "inf"),
        ("archives", "wait", "inf"),
        ("archives", "check_every", "1e300"),
        ("streams", "retention_interval", "-inf"),
        ("events", "replay_rate", "inf"),
        ("streams", "seal_interval", "nan"),
    ],
)
def test_an_infinite_or_huge_period_is_refused_naming_the_key(
    section: str, key: str, value: str, tmp_path: Path
) -> None:
    """TOML has inf and nan; the parts sleep on threads and count in integer nanoseconds, so
    `sync_interval = inf` passed the config and stopped the node with an OverflowError."""
    path = tmp_path / "loglake.toml"
    path.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=rf"\[{section}\] {key}: expected a number .*, got "):
        load_config(path, env={})
    with pytest.raises(ConfigError, match=rf"\[{section}\] {key}: .*LOGLAKE_"):
        load_config(env={f"LOGLAKE_{section.upper()}_{key.upper()}": value})


def _node_start_fails(tmp_path: Path, toml: str) -> str:
    """What ``loglake node`` prints when it refuses to start on a config of ``toml`` after a
    data dir under ``tmp_path``, no console, HTTP on any port and no stream service."""
    path = tmp_path / "loglake.toml"
    path.write_text(
        f'data_dir = "{tmp_path / "data"}"\nconsole = false\n[http]\nport = 0\n'
        "[streams]\nenabled = false\n" + toml
    )
    r = CliRunner().invoke(command, ["--config", str(path)])
    assert r.exit_code == 1, r.output + repr(r.exception)
    return r.output


def test_an_infinite_period_in_the_file_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    out = _node_start_fails(tmp_path, "[sds]\nenabled = true\nsync_interval = inf\n")
    assert out.startswith("Error: [sds] sync_interval: expected a number 0.1-31536000")
    assert len(out.splitlines()) == 1


HUGE = 5000
X, NINES, A_LOT_OF_A = "x" * HUGE, "9" * 4000, '"a",' * HUGE  # tomllib reads 4300 digits


@pytest.mark.parametrize(
    ("toml", "starts", "size"),
    [
        (f"[events]\nreplay_rate = {NINES}", "[events] replay_rate: expected", "4000 characters"),
        (f'[archives]\nlayout = "{X}"', "[archives] layout: expected one of", "5000 characters"),
        (f'[archives]\nstream = "{X}"', "[archives] stream: invalid stream", "5000 characters"),
        (f'[events]\nroles = ["{X}"]', "[events] roles: 'xxx", "5000 characters"),
        (f"[sds]\nparticipants = [{A_LOT_OF_A}]", "[sds] participants: names", "5000 items"),
        (f'[limits]\nframe_timeout = "{X}"', "[limits] frame_timeout", "5000 characters"),
        (f"[jobs]\n{X} = 1", "[jobs] xxx", "5000 characters"),
    ],
)
def test_a_huge_value_is_quoted_in_part(tmp_path: Path, toml: str, starts: str, size: str) -> None:
    """A 5000-character value made a 5000-character error line (twice that where the check's
    own words quote it too): the quote is cut at 80 characters, with the value's size."""
    out = _node_start_fails(tmp_path, toml + "\n")
    assert out.startswith(f"Error: {starts}"), out[:200]
    line = out.replace(str(tmp_path), "<tmp>")  # the file's name is the machine's
    assert len(out.splitlines()) == 1 and len(line) < 400, len(line)
    assert f"… ({size})" in out


def test_a_number_past_int_conversion_limit_is_one_line(tmp_path: Path) -> None:
    """tomllib raises int()'s ValueError past 4300 digits, not TOMLDecodeError: a traceback."""
    out = _node_start_fails(tmp_path, f"[events]\nreplay_rate = {'9' * HUGE}\n")
    assert out.startswith("Error: ") and "not a config file: Exceeds the limit" in out, out
    assert len(out.splitlines()) == 1 and "sys.set_int_max_str_digits" not in out


def test_a_huge_value_from_the_environment_is_quoted_in_part() -> None:
    with pytest.raises(ConfigError) as e:
        _cfg({"http": {"host": "h" * HUGE}, "streams": {"host": "h" * HUGE, "port": 8080}})
    assert str(e.value).startswith(f"[streams] port: {'h' * 80}… (5000 characters):8080 clashes")
    assert len(str(e.value)) < 300
    with pytest.raises(ConfigError) as e:
        _cfg({}, env={"LOGLAKE_HTTP_PORT": "8" * HUGE})
    assert str(e.value) == (
        f"[http] port: expected an integer 0-65535, got '{'8' * 79}… (5000 characters) "
        "(from LOGLAKE_HTTP_PORT)"
    )


def _key_file(tmp_path: Path, rel: str, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "data" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("rel", ["events/orchestrator.key", "archives/control.key"])
def test_a_binary_key_file_is_one_line_naming_it(tmp_path: Path, rel: str) -> None:
    """A key file that is not text stopped the node with a UnicodeDecodeError traceback."""
    path = _key_file(tmp_path, rel, b"\xff\xfe\x00")
    out = _node_start_fails(tmp_path, "[events]\nenabled = true\n[archives]\nenabled = true\n")
    assert out == f"Error: {path}: not a key (expected hex text)\n"


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    """Like the token: a private key in a file others can read was used as it was."""
    from loglake.node.api.archives import _control_key
    from loglake.node.api.events import _identity
    from loglake.node.keys import NodeKeyError

    seed = _key_file(tmp_path, "events/publisher.key", b"07" * 32 + b"\n", 0o644)
    with pytest.raises(NodeKeyError, match=rf"{seed} holds a private key and is readable"):
        _identity(seed.parent, "publisher")
    seed.chmod(0o600)
    assert _identity(seed.parent, "publisher").seed == bytes([7]) * 32
    control = _key_file(tmp_path, "archives/control.key", b"07" * 32, 0o640)
    with pytest.raises(NodeKeyError, match="mode 640"):
        _control_key(control.parent)


def test_a_short_control_key_is_refused_naming_the_file(tmp_path: Path) -> None:
    """coincurve padded "abcd" to the key 0x00…abcd: the community ran on a guessable key."""
    from loglake.node.api.archives import _control_key
    from loglake.node.keys import NodeKeyError

    control = _key_file(tmp_path, "archives/control.key", b"abcd\n")
    with pytest.raises(NodeKeyError, match=rf"control key in {control}: .*32 bytes"):
        _control_key(control.parent)


def test_a_binary_token_file_is_one_line_naming_it(tmp_path: Path) -> None:
    """A token file that is not text stopped the node with a UnicodeDecodeError traceback."""
    token = tmp_path / "data" / "node.token"
    token.parent.mkdir()
    token.write_bytes(b"\xff\xfe\n")
    token.chmod(0o600)
    r = CliRunner().invoke(
        command,
        ["--data-dir", str(token.parent), "--http-port", "0", "--no-streams-enabled"],
        env={},
    )
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output == (
        f"Error: {token} is not a token (expected text); delete it to have a new token generated\n"
    )


def test_events_ports_overlapping_the_stream_service_are_refused() -> None:
    events = {"enabled": True, "transport": "http", "http_port": 9000}
    with pytest.raises(
        ConfigError, match=r"http_port: the publisher's 127.0.0.1:9002 overlaps \[streams\]"
    ):
        _cfg({"streams": {"port": 9002}, "http": {"port": 0}, "events": events})
    assert _cfg({"streams": {"port": 9004}, "http": {"port": 0}, "events": events})
    off = {"port": 9002, "enabled": False}  # a disabled stream service holds no port
    assert _cfg({"streams": off, "http": {"port": 0}, "events": events})


def test_events_ports_are_one_per_role_run(tmp_path: Path) -> None:
    """The check refused any listener on http_port..+3 whatever the roles; a node running two
    roles binds two ports. A stream service on the third port, which the old rule refused,
    starts beside them, and the roles listen where the check says."""
    import socket

    from loglake.node.runner import BackgroundNode
    from tests.procs import free_consecutive_ports

    first = free_consecutive_ports(3)
    events = {
        "enabled": True,
        "transport": "http",
        "roles": ["orchestrator", "broadcaster"],
        "http_port": first,
    }
    data = {"data_dir": str(tmp_path), "console": False, "http": {"port": 0}, "events": events}
    cfg = _cfg({**data, "streams": {"port": first + 2}})
    with BackgroundNode(cfg) as node:
        r = httpx.get(f"{node.url}/api/events", headers={"Authorization": f"Bearer {node.token}"})
        assert r.json()["urls"] == {
            "orchestrator": f"http://127.0.0.1:{first}",
            "broadcaster": f"http://127.0.0.1:{first + 1}",
        }
        # the stream service holds the port past the roles'
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", first + 2))
    with pytest.raises(ConfigError, match=rf"the broadcaster's 127.0.0.1:{first + 1} overlaps"):
        _cfg({**data, "streams": {"port": first + 1}})


def test_events_ports_past_65535_are_refused_by_the_roles_run() -> None:
    """http_port was capped at 65532 for four roles; one role may listen on 65535, and four
    from 65534 are refused naming the key, not a bind's OverflowError."""
    events = {"enabled": True, "transport": "http", "http_port": 65535}
    from loglake.events import Identity

    broadcaster = Identity.generate().principal.to_str()
    one = {**events, "roles": ["orchestrator"], "broadcasters": [broadcaster]}
    assert _cfg({"http": {"port": 0}, "streams": {"port": 0}, "events": one}).events.http_port
    four = {**events, "http_port": 65534}
    with pytest.raises(ConfigError, match=r"http_port: 4 roles from 65534 need ports up to 65537"):
        _cfg({"http": {"port": 0}, "streams": {"port": 0}, "events": four})


def _os_refuses(http_host: str, streams_host: str) -> bool | None:
    """Whether the OS refuses the stream service's listener beside the HTTP API's on one port,
    each bound as the node binds it (``runner.bind``; ``StreamServer.start``: asyncio's
    ``create_server``); None if this machine cannot bind one of them alone (no IPv6)."""
    import asyncio
    import socket

    async def both() -> bool | None:
        try:
            http = socket.create_server((http_host, 0), reuse_port=False)
        except OSError:
            return None
        port = http.getsockname()[1]
        try:
            server = await asyncio.get_running_loop().create_server(
                asyncio.Protocol, streams_host, port
            )
        except OSError:
            http.close()
            try:  # alone, it binds: the clash was the two together
                server = await asyncio.get_running_loop().create_server(
                    asyncio.Protocol, streams_host, port
                )
            except OSError:
                return None
            server.close()
            return True
        server.close()
        http.close()
        return False

    return asyncio.run(both())


@pytest.mark.parametrize(
    ("http_host", "streams_host", "clash"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.1", "127.0.0.2", False),  # two loopback addresses: both bind
        ("0.0.0.0", "127.0.0.1", True),  # a wildcard clashes with every address of its family
        ("127.0.0.1", "0.0.0.0", True),
        ("127.0.0.1", "localhost", True),  # a name: what it resolves to
        ("127.0.0.1", "::1", False),  # another family
        ("0.0.0.0", "::", False),  # asyncio binds :: as IPv6 only
    ],
)
def test_role_ports_clash_as_the_os_says(http_host: str, streams_host: str, clash: bool) -> None:
    """The stream port was compared with the HTTP port alone: two listeners on different
    addresses with one port were refused though both bind."""
    os_says = _os_refuses(http_host, streams_host)
    require_peer(  # ::1 and :: need IPv6 on the loopback interface
        f"listening on {http_host} and {streams_host}", os_says is not None, "IPv6 loopback"
    )
    assert os_says is clash  # the expectation is the OS's
    data = {"http": {"host": http_host, "port": 9000}, "streams": {"host": streams_host}}
    data["streams"]["port"] = 9000
    if clash:
        with pytest.raises(ConfigError, match=r"\[streams\] port: .*:9000 clashes with \[http\]"):
            _cfg(data)
    else:
        assert _cfg(data).streams.host == streams_host


def test_port_0_never_clashes_and_events_ranges_compare_hosts_too() -> None:
    assert _cfg({"http": {"port": 0}, "streams": {"port": 0}})
    events = {"enabled": True, "transport": "http", "http_port": 9000}
    other = {**events, "http_host": "127.0.0.2"}
    assert _cfg({"streams": {"port": 9002}, "http": {"port": 9001}, "events": other})
    wild = {**events, "http_host": "0.0.0.0"}
    with pytest.raises(ConfigError, match=r"0.0.0.0:9001 overlaps \[http\] 127.0.0.1:9001"):
        _cfg({"streams": {"port": 0}, "http": {"port": 9001}, "events": wild})
    with pytest.raises(ConfigError, match=r"0.0.0.0:9003 overlaps \[streams\] 127.0.0.1:9003"):
        _cfg({"streams": {"port": 9003}, "http": {"port": 0}, "events": wild})


def test_a_taken_events_port_is_one_line_naming_the_key(tmp_path: Path) -> None:
    """An ICRC role port taken by another program stopped the node with an OSError
    traceback."""
    import socket

    from tests.procs import free_consecutive_ports

    first = free_consecutive_ports(4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", first + 1))  # the broadcaster's
        s.listen()
        r = CliRunner().invoke(
            command,
            ["--data-dir", str(tmp_path), "--http-port", "0", "--no-streams-enabled",
             "--no-console", "--events-enabled", "--events-transport", "http",
             "--events-http-port", str(first)],
        )  # fmt: skip
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output.startswith(
        f"Error: [events] http_port: cannot listen on 127.0.0.1:{first + 1} for the broadcaster"
    )
    assert len(r.output.splitlines()) == 1
    with socket.socket() as s:  # the orchestrator's port, bound before, was released
        s.bind(("127.0.0.1", first))


def test_a_second_node_on_a_data_dir_in_use_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two nodes on one data dir must not both write: the second is refused, in words an
    operator can act on (it used to be told to "open it with readonly=True"), and leaves the
    first one's token alone."""
    from loglake.node.runner import BackgroundNode

    data = {"data_dir": str(tmp_path), "console": False, "streams": {"enabled": False}}
    with BackgroundNode(_cfg({**data, "http": {"port": 0}})) as first:
        args = ["--data-dir", str(tmp_path), "--http-port", "0", "--no-streams-enabled"]
        r = CliRunner().invoke(command, args)
        assert r.exit_code == 1, r.output + repr(r.exception)
        assert r.output.startswith(f"Error: data_dir {tmp_path} is in use by another process")
        assert "readonly" not in r.output and len(r.output.splitlines()) == 1
        assert (tmp_path / "node.token").read_text().strip() == first.token


def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path) -> None:
    """TOML is UTF-8 (toml.io); a Latin-1 comment stopped the node with a UnicodeDecodeError
    traceback."""
    path = tmp_path / "loglake.toml"
    path.write_bytes("# café\n[http]\nport = 0\n".encode("latin-1"))
    r = CliRunner().invoke(command, ["--config", str(path)])
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output == f"Error: {path}: not valid TOML: not UTF-8 text (byte 5)\n"


def test_a_data_dir_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    """It used to say only "File exists: <path>", which reads as if all were well."""
    path = tmp_path / "data"
    path.write_text("not a folder")
    cfg = tmp_path / "loglake.toml"
    cfg.write_text(f'data_dir = "{path}"\n[http]\nport = 0\n[streams]\nenabled = false\n')
    r = CliRunner().invoke(command, ["--config", str(cfg)])
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output == f"Error: data_dir {path} is a file, not a directory\n"
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize(
    "toml, message",
    [
        ('[http]\nport = "80"\n', "[http] port: expected an integer (no quotes), got '80'"),
        ('[sds]\nenabled = "false"\n', "[sds] enabled: expected true or false (no quotes)"),
        ('[archives]\nwait = "5"\n', "[archives] wait: expected a number (no quotes), got '5'"),
        ('[http]\nport = "eighty"\n', "[http] port: expected an integer 0-65535, got 'eighty'"),
    ],
)
def test_a_quoted_number_or_boolean_in_the_file_is_refused(
    toml: str, message: str, tmp_path: Path
) -> None:
    """TOML types its values; a string where a number, boolean or array goes was parsed like
    a flag's text (`port = "80"` bound port 80, `enabled = "false"` read false), so a file
    could mean something else than it says. Flags and variables stay text."""
    path = tmp_path / "loglake.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as e:
        load_config(path, env={})
    assert str(e.value).startswith(message) and str(path) in str(e.value)
    assert load_config(env={"LOGLAKE_HTTP_PORT": "80"}).http.port == 80
    assert load_config(flags={"sds.enabled": "false"}, env={}).sds.enabled is False
    lists = tmp_path / "lists.toml"  # a list as one comma-separated string, as in a flag
    lists.write_text('[events]\nroles = "publisher,subscriber"\n')
    assert load_config(lists, env={}).events.roles == ("publisher", "subscriber")
    limits = tmp_path / "limits.toml"  # sizes are text by design there
    limits.write_text('[limits]\nmax_frame = "64KiB"\n')
    assert load_config(limits, env={}).limits.max_frame == 64 * 1024


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{bad", "not a JSON directory"),
        (b"\xff{}", "not a JSON directory"),
        (b'["http://127.0.0.1:1"]', "expected a JSON object"),
        (b'{"not-a-principal": "http://127.0.0.1:1"}', "'not-a-principal': "),
        (b'{"aaaaa-aa": 5}', "'aaaaa-aa': expected an http(s) URL, got 5"),
    ],
)
def test_a_bad_events_directory_is_the_configs_error(
    content: bytes, message: str, tmp_path: Path
) -> None:
    """The directory file was read only as the roles started: bad JSON stopped the node with a
    JSONDecodeError traceback, a number for a URL with an AttributeError."""
    directory = tmp_path / "directory.json"
    directory.write_bytes(content)
    events = {
        "enabled": True,
        "transport": "http",
        "roles": ["publisher"],
        "orchestrator": "aaaaa-aa",
        "directory": str(directory),
    }
    with pytest.raises(ConfigError) as e:
        _cfg({"events": events})
    assert str(e.value).startswith(f"[events] directory: {directory}: ")
    assert message in str(e.value)


@pytest.mark.parametrize("length", [300, 5000])
def test_an_events_directory_path_too_long_for_the_file_system_is_one_line_naming_the_key(
    tmp_path: Path, length: int
) -> None:
    """A file name longer than the file system takes (255 bytes: ``ENAMETOOLONG``). Before:
    ``Path.is_file`` raised its ``OSError`` through the config check, and the node said
    ``Error: File name too long: <the whole path>`` (5,000 characters), naming no setting."""
    path = str(tmp_path / ("d" * length)) + ".json"
    config = tmp_path / "loglake.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\nconsole = false\n[http]\nport = 0\n'
        '[streams]\nenabled = false\n[events]\nenabled = true\ntransport = "http"\n'
        f'roles = ["publisher"]\norchestrator = "aaaaa-aa"\ndirectory = "{path}"\n'
    )
    r = CliRunner().invoke(command, ["--config", str(config)])
    assert r.exit_code == 1, r.output + repr(r.exception)  # as every config error
    assert r.output.startswith("Error: [events] directory: ")
    assert r.output.endswith(": File name too long\n") and r.output.count("\n") == 1
    assert len(r.output) < 800 and "d" * 513 not in r.output  # cut as config errors cut paths
    if length == 5000:
        assert f"({len(path)} characters)" in r.output
    assert not (tmp_path / "data").exists()  # refused before the node touched anything


@pytest.mark.parametrize("prefix", ["a.b", "a b", "*", "café", "a-b"])
def test_a_nats_prefix_jetstream_cannot_use_is_the_configs_error(prefix: str) -> None:
    """It was checked only as JetStreamLog opened: a ValueError traceback at start. NATS names
    a KV bucket [a-zA-Z0-9_-]+ and the log joins prefix and stream with '-'."""
    backend = {"backend": "nats://127.0.0.1:4222", "nats_prefix": prefix}
    with pytest.raises(ConfigError, match=r"\[streams\] nats_prefix: prefix must be"):
        _cfg({"streams": backend})
    assert _cfg({"streams": {**backend, "nats_prefix": "team_1"}}).streams.nats_prefix == "team_1"


def test_a_missing_nats_creds_file_is_the_configs_error(tmp_path: Path) -> None:
    """A missing .creds file surfaced only after the 5 s connect timeout, as an error about
    something else."""
    missing = tmp_path / "nope.creds"
    backend = {"backend": "nats://127.0.0.1:4222", "nats_creds": str(missing)}
    with pytest.raises(ConfigError, match=rf"\[streams\] nats_creds: {missing} is not a file"):
        _cfg({"streams": backend})
    missing.write_text("creds")
    if importlib.util.find_spec("nkeys") is not None:
        assert _cfg({"streams": backend}).streams.nats_creds == missing


@pytest.mark.parametrize("length", [300, 5000])
def test_a_nats_creds_path_too_long_for_the_file_system_is_one_line_naming_the_key(
    tmp_path: Path, length: int
) -> None:
    """A file name longer than the file system takes (255 bytes: ``ENAMETOOLONG``). Before:
    ``Path.is_file`` raised its ``OSError`` through the config, and the node printed
    ``Error: File name too long: <the whole path>``, naming no setting."""
    path = str(tmp_path / ("c" * length)) + ".creds"
    backend = {"backend": "nats://127.0.0.1:4222", "nats_creds": path}
    with pytest.raises(ConfigError) as e:
        _cfg({"streams": backend})
    msg = str(e.value)
    assert msg.startswith("[streams] nats_creds: ") and "\n" not in msg
    assert "File name too long" in msg
    assert len(msg) < 800  # the path cut (512 characters, then its length), as config errors do
    if length == 5000:
        assert f"({len(path)} characters)" in msg


def test_nats_creds_without_nkeys_is_the_configs_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nats-py reads a .creds file with nkeys, an extra loglake does not install: the node
    failed 5 s later with "NATS JetStream unavailable … ModuleNotFoundError('nkeys')"."""
    creds = tmp_path / "user.creds"
    creds.write_text("creds")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nkeys" else real(name, *a)
    )
    backend = {"backend": "nats://127.0.0.1:4222", "nats_creds": str(creds)}
    with pytest.raises(ConfigError, match=r"\[streams\] nats_creds: .*nats-py\[nkeys\]"):
        _cfg({"streams": backend})


def test_a_misspelt_variable_is_warned_about_not_silently_ignored(tmp_path: Path) -> None:
    """An unknown key in the file stops the node; LOGLAKE_HTTP_PROT=9000 was ignored without a
    word, and the node came up on 8080. The environment is shared, so it is a warning, and
    variables other commands read are not named."""
    path = tmp_path / "data"
    path.write_text("a file, so the node stops right after the warnings")
    env = {
        "LOGLAKE_HTTP_PROT": "9000",
        "LOGLAKE_SDS_NONSENSE": "1",
        "LOGLAKE_ARCHIVES_KEY": "07" * 32,  # `loglake archives`'
        "LOGLAKE_HTTP_PORT": "0",
    }
    r = CliRunner().invoke(command, ["--data-dir", str(path)], env=env)
    assert r.exit_code == 1, r.output + repr(r.exception)
    lines = r.output.splitlines()
    assert lines[:2] == [
        "warning: LOGLAKE_HTTP_PROT is not a node setting and is ignored; did you mean "
        "LOGLAKE_HTTP_PORT?",
        "warning: LOGLAKE_SDS_NONSENSE is not a node setting and is ignored",
    ]
    assert lines[2].startswith("Error: data_dir") and len(lines) == 3


def test_a_key_that_cannot_be_written_whole_is_not_left_behind(tmp_path: Path) -> None:
    """On a full disk the archives control key was created empty, the start failed with "No
    space left on device" naming no file, and every later start refused the empty key."""
    import errno

    from loglake.node.api.archives import _control_key
    from tests.tmpfs import small_tmpfs

    with small_tmpfs(tmp_path / "full", "64k") as full:
        (full / "archives").mkdir()
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * 4096):
                pass
        os.close(fd)
        with pytest.raises(OSError) as e:
            _control_key(full / "archives")
        assert e.value.errno == errno.ENOSPC
        assert e.value.filename == str(full / "archives" / "control.key")
        assert not (full / "archives" / "control.key").exists()
        (full / "filler").unlink()
        assert len(_control_key(full / "archives").to_hex()) == 64  # the next start makes one


def test_a_config_path_that_never_ends_is_refused_not_read_whole(tmp_path: Path) -> None:
    """`--config /dev/zero` (or a big log named by mistake) was read whole into memory until a
    MemoryError; a config is read up to 1 MiB."""
    r = CliRunner().invoke(command, ["--config", "/dev/zero"])
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output == "Error: /dev/zero: not a config file: larger than 1048576 bytes\n"
    small = tmp_path / "loglake.toml"  # a usual one still reads
    small.write_text("# " + "x" * 1000 + "\n[http]\nport = 0\n")
    assert load_config(small, env={}).http.port == 0


@pytest.mark.parametrize(
    "data, message",
    [
        ({"archives": {"stream": "../../etc"}}, "[archives] stream: invalid stream name"),
        ({"archives": {"channel": "a b"}}, "[archives] channel: invalid stream name"),
        ({"sds": {"channel": "bad/chan"}}, "[sds] channel: invalid stream name 'sds.bad/chan'"),
        ({"events": {"namespaces": ["ok.ns", "../x"]}}, "[events] namespaces: invalid stream"),
    ],
)
def test_a_stream_name_the_log_refuses_is_the_configs_error(data: dict, message: str) -> None:
    """These passed the config: the node came up with its archives rounds failing every time
    or the publisher's namespace never registered (the orchestrator checks it as a stream name),
    and a bad SDS channel stopped the node with an error that named no key."""
    with pytest.raises(ConfigError) as e:
        _cfg(data)
    assert str(e.value).startswith(message)
    assert _cfg({"sds": {"channel": "team:chat-1"}}).sds.channel == "team:chat-1"
