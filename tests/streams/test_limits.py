"""The stream server's limits: one table, read the same from flags, env and the node config."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from loglake.node.cli import command as serve_group
from loglake.node.config import ConfigError, load_config
from loglake.streams.limits import LimitError, ServerLimits, limit_fields


def test_every_limit_has_a_unit_a_range_and_help() -> None:
    for f in limit_fields():
        assert f.metadata["unit"] in ("bytes", "count", "seconds"), f.name
        assert f.metadata["help"].endswith("."), f.name
        assert f.metadata["min"] <= f.default <= f.metadata["max"], f.name
        if f.metadata["unit"] == "seconds":  # a timeout longer than a day bounds nothing
            assert f.metadata["max"] == 86400, f.name


# One out-of-range value per kind of limit, each just past its ceiling: the ceiling a wire or
# disk length field sets (a frame's 4-byte length, the consumer store's 2-byte client id
# length), the service's own partition cap, Linux's default descriptor ceiling, a budget's
# 1 TiB, a day for timeouts; and nan, inf and absurd numbers.
OUT_OF_RANGE = [
    ("max_frame", 2**32, "64-4294967295 bytes"),  # Ockam TCP frame length: u32
    ("max_frame", "4GiB", "64-4294967295 bytes"),
    ("max_client_id", 65536, "1-65535 bytes"),
    ("input_budget", "1025GiB", "65536-1099511627776 bytes"),
    ("output_budget", "9" * 5000, "65536-1099511627776 bytes"),
    ("connection_output", 2**63 - 1, "16384-1099511627776 bytes"),
    ("max_connections", 2**20 + 1, "whole number 1-1048576"),
    ("max_connections_per_peer", 10**12, "whole number 1-1048576"),
    ("max_open_partitions", 2**20 + 1, "whole number 0-1048576"),
    ("max_queued_requests", 2**24 + 1, "whole number 1-16777216"),
    ("max_partitions_per_stream", 4097, "whole number 1-4096"),  # the service's MAX_PARTITIONS
    ("max_partitions_total", 2**24 + 1, "whole number 1-16777216"),
    ("frame_timeout", 1e300, "seconds 0.1-86400"),
    ("idle_timeout", 86400.5, "seconds 0-86400"),
    ("version_timeout", float("inf"), "seconds 0.1-86400"),
    ("tls_handshake_timeout", float("nan"), "seconds 0.1-86400"),
    ("shutdown_timeout", "inf", "seconds 0-86400"),
    ("shutdown_timeout", "nan", "seconds 0-86400"),
    ("frame_timeout", "-inf", "seconds 0.1-86400"),
]


@pytest.mark.parametrize(("key", "value", "range_"), OUT_OF_RANGE)
def test_node_refuses_an_out_of_range_limit_naming_key_value_and_range(
    key: str, value: object, range_: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(data={"limits": {key: value}}, env={})
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"[limits] {key}: expected "), line
    assert range_ in line and f"got {value!r}"[:60] in line, line


@pytest.mark.parametrize("origin", ["env", "flag"])
def test_out_of_range_limits_are_refused_from_env_and_flags_too(origin: str) -> None:
    env = {"LOGLAKE_LIMITS_FRAME_TIMEOUT": "1e300"} if origin == "env" else {}
    flags = {"limits.frame_timeout": "1e300"} if origin == "flag" else {}
    with pytest.raises(ConfigError, match=r"frame_timeout: .* 0\.1-86400, got '1e300' \(from "):
        load_config(env=env, flags=flags)


def test_the_ceilings_themselves_are_taken() -> None:
    top = {f.name: f.metadata["max"] for f in limit_fields()}
    limits = ServerLimits.from_mapping(load_config(data={"limits": top}, env={}).limits.__dict__)
    assert limits.max_frame == 2**32 - 1 and limits.frame_timeout == 86400
    assert ServerLimits.from_mapping({"max_frame": "4294967295"}).max_frame == 2**32 - 1


def test_server_limits_refuse_out_of_range_values_built_in_code() -> None:
    with pytest.raises(LimitError, match=r"frame_timeout: expected .*0\.1-86400, got inf"):
        ServerLimits(frame_timeout=float("inf"))
    with pytest.raises(LimitError, match="max_frame: expected a size of 64-4294967295 bytes"):
        ServerLimits(max_frame=2**32)


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
    assert r.exit_code == 2, r.output
    [line] = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert line.startswith("Error: Invalid value for '--limits-max-connections'"), line
    assert "expected a whole number" in line, line


def test_serve_refuses_an_out_of_range_limit_in_one_line(tmp_path) -> None:
    cert = tmp_path / "cert.pem"  # --tls-cert alone: a usage error if the limit were taken,
    cert.write_text("")  # not a server started
    args = ["serve", "--data-dir", str(tmp_path), "--limits-frame-timeout", "1e300"]
    r = CliRunner().invoke(serve_group, [*args, "--tls-cert", str(cert)])
    assert r.exit_code == 2, r.output
    [line] = [x for x in r.output.splitlines() if x.startswith("Error:")]
    assert line.startswith("Error: Invalid value for '--limits-frame-timeout'"), line
    assert "expected a number of seconds 0.1-86400, got '1e300'" in line, line


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
        lo, hi = f.metadata["min"], f.metadata["max"]
        assert f"| {lo:g}-{hi:g} |" in line or f"| {lo}-{hi} |" in line, f.name
