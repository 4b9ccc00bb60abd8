"""One way to read JSON: the stream's frames, the server's answers and the plugin's questions
give the same values, so a call's arguments give one signature whichever path they came by."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monitor.core.frames import FrameError, decode_frame, json_int, loads
from monitor.core.plugin_protocol import PluginCall, read_body
from monitor.core.signature import canonical_signature

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_loads_reads_what_json_loads_reads_but_integers_past_64_bits(value):
    text = json.dumps(value)
    assert loads(text) == json.loads(text, parse_int=json_int)
    assert loads(text.encode()) == loads(text)


@pytest.mark.parametrize(
    ("digits", "value"),
    [
        ("9223372036854775807", 2**63 - 1),
        ("18446744073709551615", 2**64 - 1),
        ("-9223372036854775808", -(2**63)),
        ("18446744073709551616", 1.8446744073709552e19),
        ("-9223372036854775809", -9.223372036854776e18),
        ("1" * 5000, math.inf),  # past what `int` converts
    ],
)
def test_an_integer_is_an_int_within_64_bits_a_float_past_them(digits, value):
    assert json_int(digits) == value
    assert type(json_int(digits)) is type(value)
    assert decode_frame(f'{{"n": {digits}}}') == {"n": value}


@pytest.mark.parametrize(
    ("data", "value"),
    [
        ('{"x": NaN}', None),  # orjson refuses what json.loads takes: the same answer
        ('{"x": 1e400}', math.inf),
        ('{"x": "\\ud800"}', "\ud800"),
        (" {} ", None),
    ],
)
def test_what_orjson_refuses_is_read_as_json_loads_reads_it(data, value):
    decoded = decode_frame(data)
    assert decoded == json.loads(data) or math.isnan(decoded["x"])
    if value is not None:
        assert decoded["x"] == value


@pytest.mark.parametrize("data", ["{", '{"a": 1} x', "\ufeff{}", "[" * 100_000])
def test_what_neither_reads_is_a_frame_error(data):
    with pytest.raises(FrameError):
        decode_frame(data)


def test_a_huge_integer_argument_gives_one_signature_on_the_stream_and_from_the_plugin():
    args = '{"line": 123456789012345678901234567890}'
    from_stream = decode_frame(args)
    asked = read_body(f'{{"session_id": "ses_a", "tool": "read", "args": {args}}}'.encode())
    assert isinstance(asked, PluginCall)
    assert canonical_signature("read", asked.args) == canonical_signature("read", from_stream)
