"""The size check `make lint` runs (lint/sizes.py): functions over 80 lines and classes over
400 in app code fail it, each listed with its file, line and length."""

from __future__ import annotations

import pytest

from lint import sizes


def function(name: str, lines: int, indent: str = "") -> str:
    """A function `lines` long, its `def` line included."""
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}():\n{body}"


def klass(name: str, lines: int) -> str:
    """A class `lines` long of short methods, its `class` line included."""
    body = "".join(function(f"m{i}", 2, "    ") for i in range((lines - 1) // 2))
    body += "    x = 0\n" * ((lines - 1) % 2)
    return f"class {name}:\n{body}"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        (function("f", 80), []),
        (function("f", 81), ["m.py:1: function f is 81 lines (at most 80)"]),
        ("async " + function("f", 81), ["m.py:1: function f is 81 lines (at most 80)"]),
        (klass("C", 400), []),
        (klass("C", 401), ["m.py:1: class C is 401 lines (at most 400)"]),
        (
            "class C:\n" + function("m", 81, "    "),
            ["m.py:2: function C.m is 81 lines (at most 80)"],
        ),
        (
            "def outer():\n" + function("inner", 81, "    ") + "    return inner\n",
            [
                "m.py:1: function outer is 83 lines (at most 80)",
                "m.py:2: function outer.inner is 81 lines (at most 80)",
            ],
        ),
        (
            "if True:\n" + function("f", 81, "    "),
            ["m.py:2: function f is 81 lines (at most 80)"],
        ),
        # Decorators sit above the `def` line and do not count.
        ("@staticmethod\n" * 3 + function("f", 80), []),
    ],
    ids=[
        "80-line function",
        "81-line function",
        "81-line async function",
        "400-line class",
        "401-line class",
        "81-line method",
        "nested function",
        "function under an if",
        "decorators",
    ],
)
def test_it_lists_what_is_over_the_limits(source, found):
    assert sizes.oversized(source, "m.py") == found


def test_it_checks_app_code_and_not_migrations_or_tests(tmp_path):
    long = function("f", 81)
    for path in ("chat/a.py", "bench/b.py", "chat/migrations/0001_x.py", "tests/test_c.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(long)
    (tmp_path / "dispatch").mkdir()
    (tmp_path / "dispatch" / "d.py").write_text(function("g", 80))
    assert sizes.check(tmp_path) == [
        "bench/b.py:1: function f is 81 lines (at most 80)",
        "chat/a.py:1: function f is 81 lines (at most 80)",
    ]


def test_the_helpers_make_what_they_say():
    assert len(function("f", 81).splitlines()) == 81
    assert len(klass("C", 401).splitlines()) == 401
    assert len(klass("C", 400).splitlines()) == 400
