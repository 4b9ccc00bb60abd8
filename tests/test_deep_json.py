"""monitor.core.deep_json reads what `json.loads` reads, the same way, at any depth."""

from __future__ import annotations

import json
import math
import random

import pytest

from monitor.core.deep_json import loads

DOCUMENTS = [
    '{"a": [1, 2.5, -3e2, "x\\u00e9\\ud800", null, true, false, {}, [], {"b": {"c": [[]]}}]}',
    "[NaN, Infinity, -Infinity, -0, 0.5e-3, 1E+2]",
    ' [ 1 , [ 2 ] , { "k" : [ ] } ]\n',
    '{"a": 1, "a": 2}',
    '"s"',
    "12",
    "[[[[1]]], 2]",
]
MALFORMED = ["", "[", "[1,]", '{"a"}', '{"a": 1,}', "[1 2]", "01", "nul", "{1: 2}", '"\x01"',
             "[1]x", '{"a": 1', "]", "[}", '{"a": 1]', "[1]]"]  # fmt: skip


@pytest.mark.parametrize("document", DOCUMENTS)
def test_a_document_reads_as_json_loads_reads_it(document: str) -> None:
    assert json.dumps(loads(document)) == json.dumps(json.loads(document))


@pytest.mark.parametrize("document", MALFORMED)
def test_what_json_loads_refuses_is_refused(document: str) -> None:
    with pytest.raises(ValueError):
        json.loads(document)
    with pytest.raises(ValueError):
        loads(document)


def test_nesting_past_the_recursion_limit_is_read() -> None:
    depth = 200_000
    with pytest.raises(RecursionError):
        json.loads("[" * depth + "]" * depth)
    value = loads("[" * depth + '{"k": [1]}' + "]" * depth)
    for _ in range(depth):
        [value] = value
    assert value == {"k": [1]}
    value = loads('{"a":' * depth + "7" + "}" * depth)
    for _ in range(depth):
        value = value["a"]
    assert value == 7
    mixed = loads('[{"k\\"ey": ' * depth + "null" + "}]" * depth)  # an escaped key each
    for _ in range(depth):
        [mixed] = mixed
        mixed = mixed['k"ey']
    assert mixed is None
    assert loads("9" * 5000, parse_int=float) == math.inf


def random_value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.random()
    if depth > 5 or pick < 0.3:
        scalars = [None, True, False, 0, -1, 10**20, 1.5, -2e-5, math.inf, "", 'a"b\\\u00e9\ud800']
        return rng.choice(scalars)
    if pick < 0.65:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["a", "", "\ud800", "k k"]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_random_documents_and_their_mutations_read_alike() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        document = json.dumps(random_value(rng), indent=rng.choice([None, 2]))
        if rng.random() < 0.5:
            at = rng.randrange(len(document))
            cut = rng.random() < 0.5
            document = (
                document[:at] + ("" if cut else rng.choice('[]{},:"0 .e-')) + document[at + cut :]
            )
        try:
            expected = json.dumps(json.loads(document))
        except ValueError:
            with pytest.raises(ValueError):
                loads(document)
        else:
            assert json.dumps(loads(document)) == expected, document
