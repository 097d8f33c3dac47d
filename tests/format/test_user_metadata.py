"""The ``metadata=`` argument of a take (``snapshotkit._format.user_metadata``): what is stored for
it, and what is refused, naming the key path and what to do."""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from enum import IntEnum
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import torch

from snapshotkit._format.user_metadata import (
    MAX_USER_METADATA_BYTES,
    MAX_USER_METADATA_DEPTH,
    check_user_metadata,
)
from snapshotkit.errors import ConfigError, InvalidArgumentError


class Level(IntEnum):
    HIGH = 3


def test_none_is_empty() -> None:
    assert check_user_metadata(None) == {}


def test_json_values_are_stored_as_a_json_round_trip_gives_them() -> None:
    source: dict[str, Any] = {
        "z": 1,
        "a": [1, 2.5, "x", None, True, {"k": []}],
        "mapping": MappingProxyType({"inner": OrderedDict(b=2, a=1)}),
        "level": Level.HIGH,
        "numpy_float": np.float64(0.5),
        "neg_zero": -0.0,
        "big": 2**100,
    }
    stored = check_user_metadata(source)
    assert stored == {
        "z": 1,
        "a": [1, 2.5, "x", None, True, {"k": []}],
        "mapping": {"inner": {"b": 2, "a": 1}},
        "level": 3,
        "numpy_float": 0.5,
        "neg_zero": -0.0,
        "big": 2**100,
    }
    assert list(stored) == list(source)
    assert list(stored["mapping"]["inner"]) == ["b", "a"]
    assert type(stored["mapping"]["inner"]) is dict
    assert type(stored["level"]) is int
    assert type(stored["numpy_float"]) is float
    assert math.copysign(1.0, stored["neg_zero"]) == -1.0


def test_the_result_is_a_copy() -> None:
    source: dict[str, Any] = {"tags": ["a"]}
    stored = check_user_metadata(source)
    source["tags"].append("b")
    assert stored == {"tags": ["a"]}


@pytest.mark.parametrize("metadata", [[("step", 1)], "step=1", 3, torch.ones(1)], ids=["pairs", "str", "int", "tensor"])
def test_not_a_mapping_is_an_invalid_argument(metadata: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="metadata must be a dict") as info:
        check_user_metadata(metadata)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    ("metadata", "named", "advice"),
    [
        ({1: "x"}, "the key 1 of type int", "use str keys"),
        ({"a": {("t",): 1}}, "metadata['a'] has the key ('t',)", "use str keys"),
        ({"loss": math.nan}, "metadata['loss'] is nan", "finite float"),
        ({"a": [1, -math.inf]}, "metadata['a'][1] is -inf", "finite float"),
        ({"betas": (0.9, 0.99)}, "metadata['betas'] is a builtins.tuple", "convert it to a list"),
        ({"w": torch.ones(2)}, "metadata['w'] is a torch.Tensor", "app_state"),
        ({"s": {1, 2}}, "metadata['s'] is a builtins.set", "convert it"),
        ({"n": np.int64(3)}, "metadata['n'] is a numpy.int64", "convert it"),
        ({"b": b"raw"}, "metadata['b'] is a builtins.bytes", "convert it"),
        ({"text": "a\ud800b"}, "metadata['text'] holds a lone surrogate", "remove it"),
        ({"k\udc00": 1}, "holds a lone surrogate", "remove it"),
        ({"i": 2**2001}, "metadata['i'] is an int of 2002 bits", "as a string"),
    ],
)
def test_non_json_values_are_config_errors_naming_the_key_path(metadata: Any, named: str, advice: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_user_metadata(metadata)
    assert isinstance(info.value, ValueError)
    assert named in str(info.value)
    assert advice in str(info.value)


def test_too_deep_is_a_config_error_naming_where() -> None:
    ok: dict[str, Any] = {}
    node = ok
    for _ in range(MAX_USER_METADATA_DEPTH - 1):
        node["d"] = {}
        node = node["d"]
    assert check_user_metadata(ok)
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        node["d"] = [{}]
        node = node["d"][0]
    with pytest.raises(ConfigError, match=rf"metadata\['d'\]\[0\].* more than {MAX_USER_METADATA_DEPTH} levels"):
        check_user_metadata(deep)


def test_the_size_limit_counts_compact_utf8_json_and_names_the_largest_member() -> None:
    overhead = len('{"big":""}')
    at_limit = {"big": "x" * (MAX_USER_METADATA_BYTES - overhead)}
    assert len(json.dumps(check_user_metadata(at_limit), separators=(",", ":"))) == MAX_USER_METADATA_BYTES
    with pytest.raises(ConfigError) as info:
        check_user_metadata({"small": 1, "big": "\u00e9" * (MAX_USER_METADATA_BYTES // 2)})
    message = str(info.value)
    assert "metadata['big']" in message
    assert f"more than the {MAX_USER_METADATA_BYTES}" in message
    assert "app_state" in message
