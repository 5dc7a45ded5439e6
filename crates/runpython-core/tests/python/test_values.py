"""Tests of runpython's tagged JSON (`src/child/python/runpython_values.py`), with plain `python3` (3.10+) and the stdlib only.

    python3 -m unittest discover -s crates/runpython-core/tests/python -t crates/runpython-core/tests/python

Every value goes through real JSON text (`json.dumps` then `json.loads`) between `encode` and `decode`,
as it does between the child and the host.
"""

import collections
import dataclasses
import datetime
import decimal
import importlib.util
import json
import pathlib
import sys
import typing
import unittest
import uuid

_SPEC = importlib.util.spec_from_file_location(
    "runpython_values",
    pathlib.Path(__file__).resolve().parents[2] / "src" / "child" / "python" / "runpython_values.py")
values = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(values)


@dataclasses.dataclass
class Point:
    x: int
    y: object = None
    hidden: int = dataclasses.field(default=7, init=False)


class Pair(typing.NamedTuple):
    a: int
    b: str


BUILT = []


@dataclasses.dataclass
class Loud:
    v: int

    def __post_init__(self):
        BUILT.append(self.v)


class Subclassed(Pair):
    def __new__(cls, *args):
        BUILT.append("new")
        return super().__new__(cls, *args)


def across(value, **kwargs):
    encoded, _ = values.encode(value)
    return values.decode(json.loads(json.dumps(encoded)), **kwargs)


def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (datetime.datetime, datetime.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.tzname() == b.tzname()
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    return a == b


class RoundTrips(unittest.TestCase):
    def test_every_type_comes_back_as_itself(self):
        utc5 = datetime.timezone(datetime.timedelta(hours=5), "FIVE")
        cases = [
            None, True, 0, -(2**300), 1.25, float("nan"), float("-inf"), "text", [1, [2]],
            {"a": 1}, {"$rp": "x"}, {1: 2, None: 3, (1, "a"): 4, frozenset({1}): 5}, (1, (2,)),
            set(), {1, "a"}, frozenset({2}), b"\x00\x01", bytearray(b"x"), 3 - 4j,
            datetime.date(1, 1, 1), datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
            datetime.datetime(2024, 1, 1, tzinfo=utc5), datetime.time(0, 0, tzinfo=datetime.timezone.utc),
            datetime.timedelta(days=-5, microseconds=1), decimal.Decimal("NaN"), decimal.Decimal("1E+3"),
            uuid.UUID(int=1), pathlib.PurePosixPath("/a"), pathlib.PureWindowsPath("C:/x"),
            Point(1, (2, 3)), Pair(1, "b"), [Point(2, {3}), Pair(0, "")],
        ]
        for value in cases:
            with self.subTest(value=value):
                self.assertTrue(same(across(value), value), (across(value), value))

    def test_zoned_datetimes_keep_their_zone_and_fold(self):
        try:
            import zoneinfo

            zone = zoneinfo.ZoneInfo("America/New_York")
        except Exception:
            self.skipTest("no zone data on this machine")
        for fold in (0, 1):
            value = datetime.datetime(2021, 11, 7, 1, 30, tzinfo=zone, fold=fold)
            back = across(value)
            self.assertTrue(same(back, value))
            self.assertEqual(back.utcoffset(), value.utcoffset())

    def test_plain_json_carries_no_tag(self):
        for value in [1, "a", [1, {"b": None}], {"k": [1.5]}]:
            self.assertEqual(values.encode(value), (value, False))
        self.assertTrue(values.encode([1, (2,)])[1])

    def test_subclasses_of_json_types_go_as_their_base(self):
        ordered = collections.OrderedDict(b=1, a=2)
        self.assertEqual(across(ordered), {"b": 1, "a": 2})
        self.assertIs(type(across(True)), bool)


class Classes(unittest.TestCase):
    def test_a_loaded_class_is_built_without_running_its_code(self):
        BUILT.clear()
        loud, sub = Loud(1), Subclassed(1, "x")
        BUILT.clear()
        back = across([loud, sub])
        self.assertEqual(BUILT, [])  # neither __post_init__ nor __new__ ran
        self.assertIs(type(back[0]), Loud)
        self.assertIs(type(back[1]), Subclassed)
        self.assertEqual(back[1], (1, "x"))

    def test_a_class_that_finalizes_is_never_built_from_the_other_sides_fields(self):
        deleted = []

        @dataclasses.dataclass
        class Scratch:
            path: str

            def __del__(self):
                deleted.append(self.path)  # a host class that cleans up the path it holds

        class Child(Scratch):
            pass

        for cls in (Scratch, Child):
            globals()[cls.__name__] = cls
            cls.__qualname__ = cls.__name__
        try:
            tagged = {"$rp": "dataclass", "cls": __name__ + ":Child", "v": {"path": "/etc/important"}}
            self.assertEqual(values.decode(tagged), {"__class__": __name__ + ".Child", "path": "/etc/important"})
            import gc

            gc.collect()
            self.assertEqual(deleted, [])
        finally:
            del globals()["Scratch"], globals()["Child"]

    def test_init_false_fields_are_carried(self):
        p = Point(1)
        p.hidden = 9
        self.assertEqual(across(p).hidden, 9)

    def test_an_unloaded_class_is_a_dict_or_a_stand_in(self):
        tagged = {"$rp": "dataclass", "cls": "nowhere.module:Thing", "v": {"a": 1, "b": {"$rp": "tuple", "v": []}}}
        self.assertEqual(values.decode(tagged), {"__class__": "nowhere.module.Thing", "a": 1, "b": ()})
        made = values.decode(tagged, stand_ins=True)
        self.assertEqual((made.a, made.b), (1, ()))
        self.assertEqual((type(made).__module__, type(made).__qualname__), ("nowhere.module", "Thing"))
        again, _ = values.encode(made)
        self.assertEqual(again["cls"], "nowhere.module:Thing")  # returning it names the original
        row = values.decode({"$rp": "namedtuple", "cls": "m:Row", "v": {"n": 1}}, stand_ins=True)
        self.assertEqual(row, (1,))
        self.assertEqual(row.n, 1)

    def test_a_class_name_never_imports_anything(self):
        name = "runpython_values_test_never_imported"
        self.assertNotIn(name, sys.modules)
        tagged = {"$rp": "dataclass", "cls": name + ":X", "v": {}}
        self.assertEqual(values.decode(tagged), {"__class__": name + ".X"})
        self.assertNotIn(name, sys.modules)

    def test_a_name_that_is_not_a_dataclass_is_not_built(self):
        for cls in ["os:system", "builtins:object", "sys:modules", "collections:OrderedDict"]:
            with self.subTest(cls=cls):
                back = values.decode({"$rp": "dataclass", "cls": cls, "v": {}})
                self.assertIsInstance(back, dict)

    def test_field_names_that_cannot_be_fields_get_no_stand_in(self):
        tagged = {"$rp": "dataclass", "cls": "m:T", "v": {"not valid": 1, "__class__": 2}}
        self.assertIsInstance(values.decode(tagged, stand_ins=True), dict)


class Refusals(unittest.TestCase):
    def test_depth_is_bounded_both_ways(self):
        deep = 0
        for _ in range(values.MAX_DEPTH + 5):
            deep = [deep]
        with self.assertRaises(values.TooDeep):
            values.encode(deep)
        with self.assertRaises(values.TooDeep):
            values.decode(deep)
        cyclic = []
        cyclic.append(cyclic)
        with self.assertRaises(values.TooDeep):
            values.encode(cyclic)

    def test_no_form_is_unencodable_unless_default_converts(self):
        with self.assertRaises(values.Unencodable):
            values.encode(object())
        self.assertEqual(values.encode(object(), default=lambda o: "converted"), ("converted", False))

    def test_malformed_tags_are_clear_errors(self):
        bad = [
            {"$rp": "nope"}, {"$rp": "tuple", "v": 1}, {"$rp": "dict", "v": [[1]]}, {"$rp": "dict", "v": [[[1], 2]]},
            {"$rp": "set", "v": [[1]]}, {"$rp": "bytes", "v": "!!"}, {"$rp": "bytes", "v": 3},
            {"$rp": "datetime", "v": "x"}, {"$rp": "timedelta", "v": [1, 2]}, {"$rp": "timedelta", "v": ["a", 1, 2]},
            {"$rp": "decimal", "v": "x"}, {"$rp": "uuid", "v": "x"}, {"$rp": "complex", "v": [1]},
            {"$rp": "float", "v": "1"}, {"$rp": "dataclass", "cls": 3, "v": {}}, {"$rp": "dataclass", "cls": "a:b", "v": []},
            {"$rp": "path", "v": 3}, {"$rp": 5},
        ]
        for tagged in bad:
            with self.subTest(tagged=tagged):
                with self.assertRaises(values.Malformed):
                    values.decode(tagged)


if __name__ == "__main__":
    unittest.main()
