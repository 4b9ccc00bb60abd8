import json

from hypothesis import given
from hypothesis import strategies as st

from monitor.core.signature import canonical_signature, signature_digest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


def test_exact_form():
    assert canonical_signature("read", {"b": 1, "a": [2, {"d": "x", "c": None}]}) == (
        'read\x00{"a":[2,{"d":"x"}],"b":1}'
    )


def test_key_order_does_not_matter_at_any_depth():
    one = {"a": {"x": 1, "y": [1, 2]}, "b": "s"}
    two = {"b": "s", "a": {"y": [1, 2], "x": 1}}
    assert canonical_signature("edit", one) == canonical_signature("edit", two)


def test_array_order_matters():
    assert canonical_signature("t", [1, 2]) != canonical_signature("t", [2, 1])


def test_strings_kept_exactly():
    variants = ["ls -la", "ls  -la", "LS -la", " ls -la", "ls -la\n"]
    signatures = {canonical_signature("bash", {"command": v}) for v in variants}
    assert len(signatures) == len(variants)


def test_non_ascii_kept_as_is():
    assert canonical_signature("read", {"p": "café ✓"}) == 'read\x00{"p":"café ✓"}'


def test_null_valued_key_counts_as_absent():
    assert canonical_signature("read", {"p": "a", "limit": None}) == canonical_signature(
        "read", {"p": "a"}
    )
    assert canonical_signature("t", [None]) == "t\x00[null]"


def test_tool_name_is_part_of_the_signature():
    assert canonical_signature("read", {}) != canonical_signature("write", {})


def test_deep_nesting_that_json_accepts_does_not_raise():
    depth = 50_000
    nested: object = "leaf"
    for _ in range(depth):
        nested = {"k": [nested]}
    signature = canonical_signature("t", nested)
    assert signature.endswith('"leaf"' + "]}" * depth)


def test_large_strings():
    big = "x" * 5_000_000
    assert canonical_signature("write", {"content": big}) == 'write\x00{"content":"' + big + '"}'


def test_lone_surrogates_can_be_digested():
    signature = canonical_signature("t", json.loads('"\\ud800"'))
    assert isinstance(signature_digest(signature), int)


@given(json_values)
def test_matches_json_dumps_for_values_without_null_keys(value):
    def drop_null_keys(v):
        if isinstance(v, dict):
            return {k: drop_null_keys(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [drop_null_keys(x) for x in v]
        return v

    expected = json.dumps(
        drop_null_keys(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert canonical_signature("t", value) == "t\x00" + expected


@given(json_values)
def test_deterministic_and_digest_fixed_size(value):
    signature = canonical_signature("t", value)
    assert signature == canonical_signature("t", json.loads(json.dumps(value)))
    digest = signature_digest(signature)
    assert -(2**63) <= digest < 2**63


# Any character, lone surrogates, controls and astral ones included; integers past 64 bits.
flat_args = st.dictionaries(
    st.text(st.characters(), max_size=6),
    st.text(st.characters(), max_size=12) | st.integers() | st.booleans(),
    max_size=5,
)


@given(flat_args)
def test_a_flat_object_is_written_as_the_walk_writes_it(args):
    # A null member is dropped, and sends the object to the walk: both ways give one text.
    walked = canonical_signature("t", {**args, "\x00null": None})
    assert canonical_signature("t", args) == walked
    assert isinstance(signature_digest(walked), int)


def test_the_flat_forms_orjson_refuses_are_walked():
    assert canonical_signature("t", {"n": 2**70, "s": "\ud800"}) == (
        't\x00{"n":1180591620717411303424,"s":"\ud800"}'
    )
