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
