"""The stream server's limits: one table, read the same from flags, env and the node config."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from loglake.node.cli import command as serve_group
from loglake.node.config import ConfigError, load_config
from loglake.streams.limits import LimitError, ServerLimits, limit_fields


def test_every_limit_has_a_unit_a_floor_and_help() -> None:
    for f in limit_fields():
        assert f.metadata["unit"] in ("bytes", "count", "seconds"), f.name
        assert f.metadata["help"].endswith("."), f.name
        assert f.default >= f.metadata["min"], f.name


def test_sizes_are_read_with_units_and_checked() -> None:
    got = ServerLimits.from_mapping({"max_frame": "1MiB", "frame_timeout": "2.5"})
    assert got.max_frame == 1024 * 1024 and got.frame_timeout == 2.5
    with pytest.raises(LimitError, match="max_frame"):
        ServerLimits.from_mapping({"max_frame": "12 parsecs"})
    with pytest.raises(LimitError, match="max_connections"):
        ServerLimits(max_connections=0)
    with pytest.raises(LimitError, match="idle_timeout"):
        ServerLimits.from_mapping({"idle_timeout": "-1"})


def test_node_config_has_a_limits_section_from_file_env_and_flags() -> None:
    cfg = load_config(
        data={"limits": {"max_connections": 10, "input_budget": "1MiB"}},
        env={"LOGLAKE_LIMITS_IDLE_TIMEOUT": "7"},
        flags={"limits.max_frame": "4096"},
    )
    limits = ServerLimits.from_mapping(vars(cfg.limits))
    assert (limits.max_connections, limits.input_budget) == (10, 1024 * 1024)
    assert (limits.idle_timeout, limits.max_frame) == (7.0, 4096)
    assert limits.output_budget == ServerLimits().output_budget
    with pytest.raises(ConfigError, match=r"\[limits\] max_frame"):
        load_config(data={"limits": {"max_frame": "huge"}}, env={})


def test_serve_help_lists_every_limit_with_its_env_variable() -> None:
    out = CliRunner().invoke(serve_group, ["serve", "--help"], terminal_width=200).output
    text = " ".join(out.split())
    for f in dataclasses.fields(ServerLimits):
        flag = "--limits-" + f.name.replace("_", "-")
        assert flag in text and "LOGLAKE_LIMITS_" + f.name.upper() in text, f.name


def test_serve_refuses_a_bad_limit_in_one_line(tmp_path) -> None:
    r = CliRunner().invoke(
        serve_group, ["serve", "--data-dir", str(tmp_path), "--limits-max-connections", "none"]
    )
    assert r.exit_code == 2 and "max_connections: expected a whole number" in r.output


def test_docs_security_lists_every_limit_with_its_default() -> None:
    from pathlib import Path

    from loglake.streams.limits import describe

    doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    for f in limit_fields():
        default = describe(f).rsplit(" Default ", 1)[1].rstrip(".")
        row = f"| `{f.name}` | `--limits-{f.name.replace('_', '-')}` | "
        assert row in doc, f.name
        line = doc[doc.index(row) :].split("\n", 1)[0]
        assert f"| {default} |" in line and f.metadata["help"] in line, f.name
