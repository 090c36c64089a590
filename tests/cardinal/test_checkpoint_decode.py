"""A stored checkpoint that does not decode is a typed CheckpointError, never another exception
(a consumer restarting on a damaged checkpoint must get a readable error)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loglake.cardinal.errors import CheckpointError
from loglake.cardinal.ordering import ZERO_HASH, Checkpoint

H = "ab" * 32


def _cp(**over) -> bytes:
    d = {"chain": [[5, H, H, "7"]], "offsets": {"t:0": 3}, "reorgs": [], "reverted": []}
    d.update(over)
    return json.dumps(d).encode()


def test_round_trip_of_a_real_checkpoint():
    cp = Checkpoint.starting_at(-1, ZERO_HASH, 0, offsets={"t:0": 4})
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"not json",
        b"[]",
        _cp(chain=[[5, "ab", H, "7"]]),  # hash not 32 bytes
        _cp(chain=[[5, "zz" * 32, H, "7"]]),  # not hex
        _cp(chain=[[-2, H, H, "7"]]),  # below the -1 sentinel
        _cp(chain=[[5.5, H, H, "7"]]),  # float number
        _cp(chain=[[True, H, H, "7"]]),  # bool is not a number here
        _cp(chain=[[5, H, H, 7]]),  # weight must be a decimal string
        _cp(chain=[[5, H, H, "-7"]]),
        _cp(chain=[[5, H, H, "9" * 79]]),  # wider than 256 bits can be
        _cp(chain=[[5, H, H]]),  # short row
        _cp(offsets={"t:0": -2}),
        _cp(offsets={"t:0": "3"}),
        _cp(offsets=[1, 2]),
        b'{"chain": [[1e400, "' + H.encode() + b'", "' + H.encode() + b'", "1"]], "offsets": {}}',
    ],
)
def test_malformed_checkpoint_is_a_checkpoint_error(bad: bytes):
    with pytest.raises(CheckpointError):
        Checkpoint.from_bytes(bad)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_checkpoint_error(data: bytes):
    with contextlib.suppress(CheckpointError):
        Checkpoint.from_bytes(data)


@pytest.mark.parametrize(
    "done",
    [
        [[-1, H]],  # a block number is >= 0
        [[1, "ab"]],  # hash not 32 bytes
        [[1]],
        [[1, H, 2]],
        "ab",
        {"ab": 1},
        [[1.5, H]],
        [[True, H]],
    ],
)
def test_malformed_done_blocks_are_a_checkpoint_error(done):
    with pytest.raises(CheckpointError):
        Checkpoint.from_bytes(_cp(done=done))


def test_done_blocks_round_trip_and_older_checkpoints_have_none():
    cp = Checkpoint.from_bytes(_cp(done=[[3, H], [0, "cd" * 32]]))
    assert cp.done == ((3, bytes.fromhex(H)), (0, bytes.fromhex("cd" * 32)))
    assert Checkpoint.from_bytes(cp.to_bytes()) == cp
    assert Checkpoint.from_bytes(_cp()).done == ()
