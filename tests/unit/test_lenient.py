"""What a newer client adds is dropped with a debug log naming it; what is malformed still fails, naming the field."""

from __future__ import annotations

import logging

import msgspec
import pytest

from frontend_proc.http.lenient import decode


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    a: int


class Outer(msgspec.Struct, forbid_unknown_fields=True):
    items: list[Inner]
    by_name: dict[str, Inner] = {}


def test_unknown_fields_are_dropped_at_any_depth_and_logged(caplog):
    value = {"items": [{"a": 1}, {"a": 2, "new": [1]}], "by_name": {"x": {"a": 3, "newer": 1}}, "top": None}
    with caplog.at_level(logging.DEBUG, logger="cllm.frontend"):
        out = decode(value, Outer)
    assert out == Outer([Inner(1), Inner(2)], {"x": Inner(3)})
    seen = sorted((r.fields["field"], r.fields["at"]) for r in caplog.records)
    # msgspec writes any dict key as [...]
    assert seen == [("new", "$.items[1]"), ("newer", "$.by_name[...]"), ("top", "$")]


def test_a_bad_value_is_still_an_error_naming_it():
    with pytest.raises(msgspec.ValidationError, match=r"Expected `int`, got `str` - at `\$.items\[0\].a`"):
        decode({"items": [{"a": "1", "new": 1}], "new": 2}, Outer)
    with pytest.raises(msgspec.ValidationError, match="Object missing required field `items`"):
        decode({"new": 1}, Outer)


def test_a_field_name_may_hold_any_character():
    for name in ("a`b", "x` - at `$.items", "\U000f1a4b`(", ""):
        assert decode({"items": [{"a": 1, name: 1}], name: [name]}, Outer) == Outer([Inner(1)])
