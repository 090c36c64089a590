"""``loglake serve`` and ``loglake demo`` as processes/commands."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from loglake.cli import main
from loglake.node.cli import command
from loglake.streams.client import StreamClient
from tests.procs import process


def test_help() -> None:
    runner = CliRunner()
    for sub in ("serve", "demo"):
        r = runner.invoke(command, [sub, "--help"])
        assert r.exit_code == 0 and "Usage" in r.output
    assert "4000" in runner.invoke(command, ["serve", "--help"]).output  # default port shown


def test_demo_walks_through_the_protocol() -> None:
    r = CliRunner().invoke(command, ["demo", "--no-spark"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    for text in ("created stream", "3 partitions", "pushed", "pulled", "billing"):
        assert text in r.output
    assert "saved index 1: ['order 4']" in " ".join(r.output.split())


@pytest.mark.slow
@pytest.mark.spark
def test_demo_process_ends_with_the_stream_read_by_spark() -> None:
    """What `make run` runs: the whole demo in its own process, Spark step included."""
    r = subprocess.run(
        [sys.executable, "-m", "loglake.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "read(spark, data_dir, 'demo.orders')" in out
    # six orders pushed round-robin over three partitions: two records each
    for p in range(3):
        assert re.search(rf"│ {p}\s+│ 2\s+│", r.stdout), r.stdout
    assert "demo done" in out


def serve_cmd(data_dir, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "loglake.cli", "serve", "--data-dir", str(data_dir),
        "--port", str(port), *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_serve_process_serves_and_stops(tmp_path, port) -> None:
    with process(serve_cmd(tmp_path, port), port) as proc, StreamClient(port=port) as c:
        c.create_stream("p", 2)
        assert c.push("p", b"x", 1) == 0
    assert proc.returncode == 0  # SIGTERM is a clean stop
    assert (tmp_path).exists() and any(tmp_path.iterdir())


def test_serve_on_a_taken_port_is_a_readable_error(tmp_path) -> None:
    import socket

    from loglake.node.cli import ServeError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        args = ["serve", "--data-dir", str(tmp_path), "--port", str(taken)]
        r = CliRunner().invoke(command, args)
    assert isinstance(r.exception, ServeError)
    assert f"cannot listen on 127.0.0.1:{taken}" in str(r.exception)


@pytest.mark.slow
def test_serve_applies_retention_and_sealed_history_stays_readable(tmp_path, port) -> None:
    """Retention set on `serve` trims live segments of streams created over the protocol, on
    the server's own timer; pulls from index 0 are still answered from the lake."""
    extra = ["--segment-bytes", "4096", "--retention-records", "20", "--retention-interval", "0.2"]
    payloads = [bytes([i % 256]) * 200 for i in range(300)]
    with process(serve_cmd(tmp_path, port, *extra), port) as proc, StreamClient(port=port) as c:
        c.create_stream("r", 1)
        c.push_many("r", payloads)
        segs = lambda: sorted(tmp_path.rglob("*.seg"))  # noqa: E731
        # The pushes fill at least this many 4 KB segments; fewer on disk means retention ran
        # (it may already have run before the first look, so no "before" count is taken).
        written = sum(map(len, payloads)) // 4096
        deadline = time.monotonic() + 60
        while len(segs()) >= written and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(segs()) < written, "retention never removed a segment"
        got = []
        while len(got) < len(payloads):
            batch = c.pull("r", len(got), 1000)
            assert batch, f"history stops at {len(got)}"
            got += batch
        assert [m.index for m in got] == list(range(len(payloads)))
        assert [m.data for m in got] == payloads
    assert proc.returncode == 0


def test_serve_says_stopped_only_after_it_served(tmp_path) -> None:
    """A bind error used to be followed by "stopped", read as if the service had run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        args = ["serve", "--data-dir", str(tmp_path), "--port", str(taken)]
        r = subprocess.run(
            [sys.executable, "-m", "loglake.cli", *args], capture_output=True, text=True, timeout=60
        )
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{taken}" in r.stderr
    assert "stopped" not in r.stderr + r.stdout


def test_serve_on_a_data_dir_in_use_names_the_flag(tmp_path) -> None:
    from loglake.log import open_log

    with open_log(tmp_path):  # another writer holds the data dir
        r = CliRunner().invoke(command, ["serve", "--data-dir", str(tmp_path), "--port", "0"])
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert r.output.startswith(f"Error: --data-dir {tmp_path} is in use by another process")
    assert "readonly" not in r.output


def test_serve_with_a_bad_nats_prefix_is_a_usage_error(tmp_path) -> None:
    args = ["serve", "--data-dir", str(tmp_path), "--port", "0", "--backend", "nats://x:1"]
    r = CliRunner().invoke(command, [*args, "--nats-prefix", "a.b"])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "Invalid value for '--nats-prefix': prefix must be [A-Za-z0-9_]+" in r.output


@pytest.mark.parametrize("length", [300, 5000])
def test_serve_with_a_nats_creds_path_too_long_names_the_option_and_cuts_it(
    tmp_path, length: int
) -> None:
    """``ENAMETOOLONG``: click's ``Path(exists=True)`` said the file "does not exist" and quoted
    the whole path (5,000 characters on one line); now ``--nats-creds`` with why, the path cut
    as config errors cut it."""
    path = str(tmp_path / ("c" * length)) + ".creds"
    args = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"]
    r = CliRunner().invoke(command, [*args, "--backend", "nats://x:1", "--nats-creds", path])
    assert r.exit_code == 2, r.output + repr(r.exception)
    error = [line for line in r.output.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and error[0].startswith("Error: Invalid value for '--nats-creds': ")
    assert error[0].endswith(": File name too long") and len(error[0]) < 600
    assert r.output.count("c" * 513) == 0


def test_serve_with_nats_creds_but_no_nkeys_says_what_to_install(tmp_path, monkeypatch) -> None:
    """nats-py needs nkeys for a .creds file; serve failed 5 s later naming a connect error."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nkeys" else real(name, *a)
    )
    creds = tmp_path / "user.creds"
    creds.write_text("creds")
    args = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0"]
    r = CliRunner().invoke(command, [*args, "--backend", "nats://x:1", "--nats-creds", str(creds)])
    assert r.exit_code == 2, r.output + repr(r.exception)
    assert "Invalid value for '--nats-creds': a .creds file needs the nkeys package" in r.output


def test_serve_with_a_backend_that_is_no_url_is_a_usage_error(tmp_path) -> None:
    """Found from outside: ``--backend notaurl`` was dialled as ``nats://notaurl`` for 5 s and
    then reported ``TimeoutError()``."""
    for bad in ("notaurl", "http://h:4222", "nats://:4222", "nats://h:99999"):
        t0 = time.monotonic()
        args = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--backend", bad]
        r = CliRunner().invoke(command, args)
        assert r.exit_code == 2, r.output + repr(r.exception)
        assert "Invalid value for '--backend'" in r.output and "expected nats://" in r.output
        assert time.monotonic() - t0 < 2 and not (tmp_path / "d").exists()


def test_serve_with_an_unreachable_backend_says_why_not_timeout(tmp_path) -> None:
    """The last connect attempt's error (connection refused), not the deadline's
    ``TimeoutError()``; and the data dir the failed start made is not left behind."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"nats://127.0.0.1:{s.getsockname()[1]}"
    args = ["serve", "--data-dir", str(tmp_path / "d"), "--port", "0", "--backend", url]
    r = CliRunner().invoke(main, args)  # the typed error as the `loglake` command prints it
    assert r.exit_code == 1, r.output + repr(r.exception)
    assert "last attempt: Connection refused" in r.output and "TimeoutError" not in r.output
    assert not (tmp_path / "d").exists()


def test_serve_on_a_busy_port_leaves_no_new_data_dir(tmp_path) -> None:
    """Found from outside: the failed start left LOCK, consumers.* and streams/ in the new
    folder (and its parents); an existing data dir is kept as it was."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = str(busy.getsockname()[1])
        new = tmp_path / "new" / "d"
        r = CliRunner().invoke(main, ["serve", "--data-dir", str(new), "--port", port])
        assert r.exit_code == 1 and "cannot listen on" in r.output, r.output
        assert not (tmp_path / "new").exists()
        old = tmp_path / "old"
        old.mkdir()
        r = CliRunner().invoke(main, ["serve", "--data-dir", str(old), "--port", port])
        assert r.exit_code == 1 and (old / "streams").is_dir()
