"""Quiet by default (issue 31), the markup: your own Stop is a neutral "Stopped", a long
notice (a settings reload's list of tools) is one line that opens, each message action is
an icon button named by its label, a turn's usage is behind a small button."""

from __future__ import annotations

import uuid

from chat.render import fragment_seal
from tests.ui_helpers import block, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")


def chunk_of(kind: str, data: dict, *, role: str = "system", seq: int = 5):
    [wrapper] = top(fragment_seal(block(kind, data, role=role, turn_id=TURN, seq=seq)))
    [chunk] = wrapper.children
    return chunk


def by_class(node, name: str) -> list:
    return node.find_all(lambda n: name in n.classes)


def test_your_own_stop_is_a_neutral_stopped_and_a_caps_stop_says_so():
    own = chunk_of("system", {"kind": "cancelled", "text": "Stopped by the user."})
    assert "own-stop" in own.classes
    assert by_class(own, "sys-kind")[0].text == "Stopped"
    capped = chunk_of("system", {"kind": "cancelled", "text": "Stopped: the step limit."})
    assert "own-stop" not in capped.classes
    assert by_class(capped, "sys-kind")[0].text == "Stopped"


def test_a_settings_reload_is_one_line_that_opens_to_its_tools():
    text = "Tools changed: +mcp__everything__echo, +mcp__everything__add, -shell."
    chunk = chunk_of("system", {"kind": "config-reload", "text": text})
    [fold] = by_class(chunk, "sys-more")
    assert fold.tag == "details" and fold.get("open") is None
    [summary] = fold.children
    assert summary.tag == "summary" and summary.text == "Settings reloaded"
    # The text is the fold's sibling, which app.css shows once the fold is open.
    [shown] = [n for n in chunk.children if "sys-text" in n.classes]
    assert shown.text == text


def test_a_short_notice_stays_one_plain_line_and_a_long_one_folds():
    short = chunk_of("system", {"kind": "model-changed", "text": "Model changed to x."})
    assert by_class(short, "sys-more") == []
    long = chunk_of("system", {"kind": "notice", "text": "word " * 30})
    assert len(by_class(long, "sys-more")) == 1


def test_each_action_is_an_icon_named_by_its_label():
    chunk = chunk_of("text", {"text": "An answer."}, role="assistant")
    [row] = by_class(chunk, "acts")
    names = []
    for button in row.children:
        assert button.tag == "button" and "act" in button.classes
        kinds = [n.tag for n in button.children]
        assert kinds == ["svg", "span"], kinds
        [svg, label] = button.children
        assert svg.get("aria-hidden") == "true" and "act-label" in label.classes
        assert button.get("title")
        names.append(label.text)
    assert names == ["Copy", "Regenerate", "Branch from here", "Summarise up to here"]
