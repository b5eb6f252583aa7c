"""Stop-string matching on text fed piece by piece (pure text, no model)."""

from __future__ import annotations

import pytest

from frontend_proc.core.generation import StopMatcher


def run(stops, pieces):
    m = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, hit = m.feed(piece)
        out.append(text)
        if hit:
            return out, True
    out.append(m.flush())
    return out, False


def test_stop_inside_one_piece():
    assert run(["END"], ["hello END world"]) == (["hello "], True)


def test_stop_split_across_pieces_is_held_back_then_cut():
    out, hit = run(["</s>"], ["abc<", "/", "s", ">tail"])
    assert hit and out == ["abc", "", "", ""]


def test_false_start_is_released():
    out, hit = run(["STOP"], ["go ST", "ART now"])
    assert not hit and "".join(out) == "go START now"
    assert out[0] == "go "  # only "ST" was held


def test_earliest_of_several_stops_wins():
    assert run(["world", "lo w"], ["hello world"]) == (["hel"], True)


def test_held_tail_is_flushed_at_the_end():
    assert run(["xyz"], ["abc x"]) == (["abc ", "x"], False)


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_any_split_gives_the_same_text(size):
    text = "The cat sat. The dog ran. The end."
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    out, hit = run([". The d", "zzz"], pieces)
    assert hit and "".join(out) == "The cat sat"
