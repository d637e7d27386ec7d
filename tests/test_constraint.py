"""Constraint specs (no model): what is checked before any vocabulary is needed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgespec.core.rowpass import rows
from edgespec.errors import ConfigError
from edgespec.runtime.constraint import Constraint, check
from edgespec.runtime.engine import make_constraint


def test_a_schema_keeps_its_properties_order():
    # the order of properties is the order the model writes them in
    schema = {"type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}}}
    assert list(json.loads(Constraint.json_schema(schema).text)["properties"]) == ["zeta", "alpha"]
    assert list(Constraint.json_schema(json.dumps(schema)).schema["properties"]) == ["zeta", "alpha"]


@pytest.mark.parametrize("make, message", [
    (lambda: Constraint.json_schema("[1, 2]"), "must be a JSON object"),
    (lambda: Constraint.json_schema("{nope"), "not valid JSON"),
    (lambda: check(Constraint.json_schema({"type": "nonsense"})), "bad JSON schema"),
    (lambda: check(Constraint.grammar("root ::= missing")), "bad grammar"),
    (lambda: Constraint.grammar("  "), "empty"),
    (lambda: make_constraint(json_schema={}, json_object=True), "one constraint"),
])
def test_bad_constraints_are_config_errors(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def test_good_constraints_compile():
    for c in (Constraint.json_object(), Constraint.json_schema({"type": "array"}),
              Constraint.grammar('root ::= "yes" | "no"'), Constraint.lark('start: "a"+')):
        assert check(c)


@pytest.mark.skipif(rows() is None, reason="compiled row passes not built")
@pytest.mark.parametrize("words", ["random", "whole", "empty"])
def test_the_compiled_mask_pass_keeps_exactly_the_allowed_tokens(words):
    rng = np.random.default_rng(0)
    n = 32 * 40 + 7  # a partial last word
    x = rng.standard_normal(n).astype(np.float32)
    bits = {"random": rng.integers(-2**31, 2**31 - 1, 41, dtype=np.int32),
            "whole": np.full(41, -1, np.int32), "empty": np.zeros(41, np.int32)}[words]
    bits[1] = 0b1011  # one mixed word in each
    out = np.empty(n + 5, np.float32)  # wider than x: the columns past it are refused
    kept = rows().masked(x, bits, out)
    allowed = np.unpackbits(bits.view(np.uint8), bitorder="little")[:n].astype(bool)
    assert kept == allowed.sum()
    assert np.array_equal(out[:n], np.where(allowed, x, -np.inf).astype(np.float32))
    assert np.all(out[n:] == -np.inf)
