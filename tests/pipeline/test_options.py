"""Bad input gets a typed error naming the option and the value (issue 7, "Bad input") — these
checks run on the driver, before Spark is involved."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.pipeline.errors import BadOption
from loglake.pipeline.options import parse_offsets_json, parse_options, resolve_stream

from .helpers import write_lake


def test_missing_data_dir_names_option_and_value(tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(BadOption) as e:
        parse_options({"data_dir": missing, "stream": "s"})
    assert e.value.option == "data_dir" and e.value.value == missing
    assert missing in str(e.value) and "data_dir" in str(e.value)


def test_data_dir_is_required(tmp_path):
    with pytest.raises(BadOption, match="data_dir"):
        parse_options({"stream": "s"})


def test_unknown_stream_names_option_value_and_known_streams(tmp_path):
    write_lake(tmp_path, "orders", 0, 0, 9)
    with pytest.raises(BadOption) as e:
        resolve_stream(parse_options({"data_dir": str(tmp_path), "stream": "ordres"}))
    assert e.value.option == "stream" and e.value.value == "ordres"
    assert "orders" in str(e.value)


def test_invalid_stream_name(tmp_path):
    with pytest.raises(BadOption, match="stream"):
        parse_options({"data_dir": str(tmp_path), "stream": "a/b"})


def test_unknown_partition_is_rejected(tmp_path):
    write_lake(tmp_path, "s", 0, 0, 9)
    with pytest.raises(BadOption, match="partitions"):
        resolve_stream(parse_options({"data_dir": str(tmp_path), "stream": "s", "partitions": "3"}))


@pytest.mark.parametrize(
    "text",
    ['{"0": 1', "[1, 2]", "{}", '{"x": 1}', '{"0": "1"}', '{"0": -3}', '{"0": true}', "earliset"],
)
def test_malformed_starting_offsets(tmp_path, text):
    with pytest.raises(BadOption) as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", "startingOffsets": text})
    assert e.value.option == "startingOffsets" and e.value.value == text


def test_offsets_json_accepts_kafka_sentinels():
    assert parse_offsets_json('{"0": 5, "1": -2, "2": -1}') == {0: 5, 1: -2, 2: -1}


@pytest.mark.parametrize(
    ("name", "value"),
    [("startIndex", "x"), ("endIndex", "-1"), ("splitRecords", "0"), ("partitionBy", "hash")],
)
def test_bad_numbers_and_choices(tmp_path, name, value):
    with pytest.raises(BadOption) as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", name: value})
    assert e.value.option == name


NUMBER_OPTIONS = (
    "startIndex",
    "endIndex",
    "splitRecords",
    "maxRecordsPerTrigger",
    "driverTailRecords",
    "partitionCount",
)


@pytest.mark.parametrize("name", NUMBER_OPTIONS)
@pytest.mark.parametrize("value", [" 5", "5 ", "1_000", "+5", "\u0665", "\uff15", "5.0", "0x5"])
def test_a_number_option_is_ascii_digits_alone(tmp_path, name, value):
    # int() read " 5", "1_000", "+5" and any script's digits ("٥", "５") as numbers: a typo
    # or a pasted value silently became an index; only 0-9 are digits in an option
    with pytest.raises(BadOption, match="ASCII digits") as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", name: value})
    assert e.value.option == name


@pytest.mark.parametrize("name", NUMBER_OPTIONS)
def test_a_negative_number_option_says_its_minimum(tmp_path, name):
    with pytest.raises(BadOption, match="must be >= ") as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", name: "-1"})
    assert e.value.option == name


def test_plain_digits_still_pass(tmp_path):
    opts = parse_options(
        {"data_dir": str(tmp_path), "stream": "s", "startIndex": "0012", "partitions": "2, 0"}
    )
    assert opts.start_index == 12 and opts.partitions == (0, 2)


@pytest.mark.parametrize(
    ("value", "why"), [("0,1_0", "like 0,2"), ("\u0661", "like 0,2"), ("0,-1", ">= 0")]
)
def test_partitions_are_ascii_digits_alone(tmp_path, value, why):
    with pytest.raises(BadOption, match=why) as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", "partitions": value})
    assert e.value.option == "partitions"


@pytest.mark.parametrize(
    ("name", "hint"), [("start_index", "startIndex"), ("endindx", "endIndex"), ("foo", None)]
)
def test_an_unknown_option_is_rejected_not_ignored(tmp_path, name, hint):
    # a misspelt range option was ignored: the whole stream was read instead of the range
    with pytest.raises(BadOption) as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", name: "90"})
    assert e.value.option == name and "unknown option" in e.value.reason
    assert (f"did you mean {hint}?" in e.value.reason) if hint else "did you mean" not in str(e)


def test_option_names_are_case_insensitive_as_spark_passes_them(tmp_path):
    write_lake(tmp_path, "s", 0, 0, 9)
    opts = parse_options({"DATA_DIR": str(tmp_path), "Stream": "s", "startindex": "3"})
    assert opts.start_index == 3


@pytest.mark.parametrize("value", [" ", ",", " , "])
def test_partitions_that_name_none_are_rejected(tmp_path, value):
    # "partitions= " read no partition at all: an empty DataFrame, no error
    with pytest.raises(BadOption) as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", "partitions": value})
    assert e.value.option == "partitions"


def test_end_below_start(tmp_path):
    with pytest.raises(BadOption, match="endIndex"):
        parse_options(
            {"data_dir": str(tmp_path), "stream": "s", "startIndex": "5", "endIndex": "4"}
        )


def test_bad_url(tmp_path):
    with pytest.raises(BadOption, match="url"):
        parse_options({"url": "http://x", "stream": "s"})


@given(st.text(max_size=40) | st.from_regex(r'\{"\d":\s?-?\d{1,3}\}', fullmatch=True))
def test_any_offsets_text_is_parsed_or_rejected_with_bad_option(text):
    try:
        parsed = parse_offsets_json(text)
    except BadOption as e:
        assert e.option == "startingOffsets" and e.value == text
    else:
        assert parsed and all(isinstance(k, int) and v >= -2 for k, v in parsed.items())


def test_a_data_dir_is_parsed_without_the_nats_client_stack(tmp_path):
    """Every Spark process that parses a ``data_dir`` option (the driver, the data source's
    planners, the tasks) looks for the sealer's note; naming the note imported the sealer's
    module and with it nats, aiohttp and asyncio (~180 modules, ~1 s of CPU a process here).
    Parsing and resolving a stream of a plain data dir imports none of them."""
    import subprocess
    import sys

    from loglake.log import open_log

    log = open_log(tmp_path / "d")
    log.create_stream("s")
    log.close()
    code = (
        "import sys; import loglake.pipeline.datasource; "
        "from loglake.pipeline.options import parse_options, resolve_stream; "
        f"resolve_stream(parse_options({{'data_dir': {str(tmp_path / 'd')!r}, 'stream': 's'}})); "
        "print(sorted(m for m in ('nats', 'aiohttp', 'pandas', 'loglake.streams.jetstream_seal') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    ("value", "expected"), [(None, True), ("true", True), ("false", False), ("False", False)]
)
def test_fail_on_data_loss_is_kafkas_boolean_default_true(tmp_path, value, expected):
    # Spark's Kafka source: failOnDataLoss, "true" or "false" in any case, default true
    given = {} if value is None else {"failOnDataLoss": value}
    opts = parse_options({"data_dir": str(tmp_path), "stream": "s", **given})
    assert opts.fail_on_data_loss is expected


@pytest.mark.parametrize("value", ["no", "0", "1", "yes", "flase", " false"])
def test_fail_on_data_loss_that_is_not_a_boolean_is_rejected(tmp_path, value):
    with pytest.raises(BadOption, match="expected true or false") as e:
        parse_options({"data_dir": str(tmp_path), "stream": "s", "failondataloss": value})
    assert e.value.option == "failOnDataLoss" and e.value.value == value
