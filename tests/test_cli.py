"""The `loglake` command: every command and subcommand answers --help, errors are readable."""

from __future__ import annotations

import click
from click.testing import CliRunner

from loglake import __version__
from loglake.cli import main


def _walk(cmd: click.Command, path: tuple[str, ...] = ()):
    yield path, cmd
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, (path, name)
            yield from _walk(sub, (*path, name))


PARTS = {"serve", "demo", "node", "log", "stream", "events", "cardinal", "archives", "sds", "job"}


def test_every_part_is_mounted():
    assert set(main.list_commands(click.Context(main))) == PARTS


def test_the_lazy_table_mounts_every_command_its_modules_define():
    """A command added to a flat-mounted group (`loglake.node.cli`, `loglake.pipeline.cli`) must
    be in the table too, or it would silently never be reachable."""
    import importlib

    from loglake.cli import PART_COMMANDS

    flat: dict[str, set[str]] = {}
    for name, (module, sub) in PART_COMMANDS.items():
        obj = importlib.import_module(module).command
        if sub is None:
            assert isinstance(obj, click.Command), module
        else:
            assert isinstance(obj, click.Group) and sub == name, (module, sub)
            flat.setdefault(module, set()).add(sub)
    for module, mounted in flat.items():
        assert set(importlib.import_module(module).command.commands) == mounted, module


def test_a_command_imports_only_its_own_part():
    import subprocess
    import sys

    probe = (
        "import sys; from loglake.cli import main\n"
        "try: main(['sds', '--help'])\n"
        "except SystemExit: pass\n"
        "print(sorted(m for m in ('loglake.pipeline.read', 'loglake.streams.jetstream', "
        "'pyspark', 'loglake.events.broadcaster') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_command_answers_help_with_a_description():
    runner = CliRunner()
    for path, cmd in _walk(main):
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output
        assert cmd.help and cmd.help.strip(), f"`loglake {' '.join(path)}` has no help text"
        assert cmd.help.split("\n")[0].strip()[:20] in " ".join(result.output.split())


def test_every_option_has_help():
    missing = [
        f"loglake {' '.join(path)} {p.opts[0]}"
        for path, cmd in _walk(main)
        for p in cmd.params
        if isinstance(p, click.Option) and not (p.help or "").strip()
    ]
    assert missing == []


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_unknown_command_is_a_usage_error():
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_typed_error_is_one_readable_line_and_a_bug_keeps_its_traceback():
    from loglake.clitools import TypedErrorGroup
    from loglake.errors import LoglakeError

    @click.group(cls=TypedErrorGroup)
    def g():
        """A group."""

    @g.command()
    def typed():
        """Fails on purpose."""
        raise LoglakeError("stream 'x' does not exist")

    @g.command()
    def bug():
        """Fails like a bug."""
        raise KeyError("oops")

    r = CliRunner().invoke(g, ["typed"])
    assert r.exit_code == 1
    assert r.output == "Error: stream 'x' does not exist\n"
    r = CliRunner().invoke(g, ["bug"])
    assert isinstance(r.exception, KeyError)


def test_a_part_run_alone_reports_typed_errors_readably(tmp_path):
    from loglake.events.cli import command as events

    r = CliRunner().invoke(events, ["whoami", "--key", str(tmp_path / "missing.key")])
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "Traceback" not in r.output


def test_every_port_option_takes_only_0_to_65535():
    """A port outside the range used to wrap (70000 listened on 4464) or reach the resolver."""
    from loglake.clitools import PORT

    ports = [
        (path, p.opts[0])
        for path, cmd in _walk(main)
        for p in cmd.params
        if isinstance(p, click.Option) and p.opts[0].endswith("-port")
    ]
    assert len(ports) >= 8, ports
    assert [(path, o) for path, typ, o in _port_types() if typ is not PORT] == []


def _port_types():
    """``loglake node``'s flags are its config keys, range-checked by ``node/config.py``."""
    for path, cmd in _walk(main):
        if path == ("node",):
            continue
        for p in cmd.params:
            if isinstance(p, click.Option) and p.opts[0].endswith("-port"):
                yield path, p.type, p.opts[0]


def test_an_out_of_range_port_is_a_usage_error_before_anything_starts(tmp_path):
    runner = CliRunner()
    for args in (
        ["serve", "--port", "70000", "--data-dir", str(tmp_path)],
        ["serve", "--port", "-1", "--data-dir", str(tmp_path)],
        ["stream", "--port", "69536", "list"],
        ["archives", "seed", "--port", "70000", str(tmp_path)],
    ):
        r = runner.invoke(main, args)
        assert r.exit_code == 2, (args, r.output)
        assert "is not in the range 0<=x<=65535" in r.output, (args, r.output)


def test_a_file_system_refusal_is_one_line_naming_the_path(tmp_path):
    from loglake.clitools import TypedErrorGroup

    @click.group(cls=TypedErrorGroup)
    def g():
        """A group."""

    @g.command()
    def write():
        """Writes under a file, as a data dir that is a file would."""
        (tmp_path / "file").write_text("x")
        (tmp_path / "file" / "node.token").write_text("y")

    r = CliRunner().invoke(g, ["write"])
    assert r.exit_code == 1
    assert r.output == f"Error: Not a directory: {tmp_path / 'file' / 'node.token'}\n"


def test_every_flag_docs_node_md_names_exists():
    """docs/node.md documented ``--metrics-public``; the flag is ``--http-metrics-public``."""
    import re
    from pathlib import Path

    flags = {o for _, cmd in _walk(main) for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    docs = Path(__file__).resolve().parents[1] / "docs"
    # the node's key table lives on the operations page, its API on the node page
    doc = (docs / "node.md").read_text() + (docs / "operations.md").read_text()
    named = {
        f
        for span in re.findall(r"`([^`]*)`", doc)
        if "benchmarks/" not in span
        for f in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?![\w.-])", span)
    }
    assert len(named) > 10
    assert sorted(named - flags - {"--help", "--version"}) == []


def test_renamed_options_keep_their_old_spelling_working_but_hidden():
    """One vocabulary: --key-file, --stream, --from, --peer; the old names still parse."""
    from loglake.clitools import Renamed

    renamed = {
        (path, p.opts[0]): p.old
        for path, cmd in _walk(main)
        for p in cmd.params
        if isinstance(p, Renamed)
    }
    assert renamed[(("events", "replay"), "--key-file")] == {"--key"}
    assert renamed[(("archives", "seed"), "--peer")] == {"--connect"}
    assert renamed[(("job", "archives-build"), "--stream")] == {"--streams"}
    assert renamed[(("stream", "pull"), "--from")] == {"--index"}
    runner = CliRunner()
    for (path, new), old in renamed.items():
        shown = runner.invoke(main, [*path, "--help"]).output
        assert new in shown and not any(f"{o} " in shown or f"{o}," in shown for o in old), path


def test_stream_connection_options_go_before_or_after_the_subcommand(tmp_path):
    """``loglake stream --port N pull`` and ``loglake stream pull --port N`` are the same."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: the error names it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = CliRunner()
    before = runner.invoke(main, ["stream", "--port", str(port), "pull", "s"])
    after = runner.invoke(main, ["stream", "pull", "s", "--port", str(port), "--from", "3"])
    old = runner.invoke(main, ["stream", "pull", "s", "--port", str(port), "--index", "3"])
    for r in (before, after, old):
        assert r.exit_code == 1 and str(port) in r.output, r.output


def test_job_compact_on_a_file_says_it_is_not_a_directory(tmp_path):
    """``--data-dir /etc/passwd`` said "no such directory"."""
    f = tmp_path / "file"
    f.write_text("x")
    r = CliRunner().invoke(main, ["job", "compact", "--data-dir", str(f), "--stream", "orders"])
    assert r.exit_code == 1 and r.output == (
        f"Error: option --data-dir={str(f)!r}: not a directory\n"
    ), r.output
    r = CliRunner().invoke(
        main, ["job", "compact", "--data-dir", str(tmp_path / "no"), "--stream", "orders"]
    )
    assert r.exit_code == 1 and "no such directory" in r.output


def test_job_compact_of_a_stream_with_nothing_sealed_is_nothing_to_do(tmp_path):
    """The README's ``job compact`` on a new stream failed "no lake folder for it", exit 1;
    a stream the log does not know still fails (a typo), and no Spark starts for either."""
    from loglake.log import StreamConfig, open_log

    with open_log(tmp_path / "d") as log:
        log.create_stream("orders", StreamConfig(partitions=2))
        log.append("orders", b"x")
    args = ["job", "compact", "--data-dir", str(tmp_path / "d")]
    r = CliRunner().invoke(main, [*args, "--stream", "orders"])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert r.output == "stream 'orders' has nothing sealed to compact yet\n"
    assert not (tmp_path / "d" / "lake").exists()
    r = CliRunner().invoke(main, [*args, "--stream", "typo"])
    assert r.exit_code == 1 and "no lake folder for it" in r.output


def test_docs_say_what_make_run_runs():
    """docs/streams.md said ``make run`` = ``loglake demo``; it runs ``loglake node
    walkthrough`` (the Makefile, the README)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    recipe = (root / "Makefile").read_text().split("\nrun:", 1)[1].splitlines()[1]
    runs = re.search(r"loglake ([a-z ]+?)\s*(\$|$)", recipe)
    assert runs is not None, recipe
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            # "make run   # = loglake X: ...", "`make run` starts a loglake node (`loglake X`)"
            said = re.search(
                r"make run`?\s+(?:# = |starts a loglake node \(`)loglake ([a-z ]+)", line
            )
            if said:
                assert said.group(1).strip() == runs.group(1), f"{doc.name}: {line}"


def test_every_backend_option_refuses_what_is_no_nats_url_before_it_starts(tmp_path):
    """Found from outside: only ``serve`` checked ``--backend``; ``job seal --backend notaurl``
    and ``cardinal consume --backend notaurl`` dialled ``nats://notaurl`` for 5 s and then
    reported ``TimeoutError()``. Every command with the option is walked, so a new one is held
    to the same rule (a usage error, exit 2, before anything is dialled)."""
    found = []
    for path, cmd in _walk(main):
        if not any("--backend" in p.opts for p in cmd.params):
            continue
        found.append(" ".join(path))
        for bad in ("notaurl", "nats://h:99999"):
            r = CliRunner().invoke(main, [*path, "--backend", bad])
            # 2: click's usage error; 1: the node's ConfigError naming the option (``node``)
            assert r.exit_code in (1, 2), (path, bad, r.output, repr(r.exception))
            assert "backend" in r.output and "expected nats://" in r.output, (path, r.output)
            assert "unavailable" not in r.output, (path, r.output)  # not dialled
    assert {"serve", "job seal", "cardinal consume"} <= set(found), found
