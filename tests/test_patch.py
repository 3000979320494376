"""Patches of train.py: diffs that apply exactly or not at all, change hashes, three-way merges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node import wire
from node.agent.errors import AgentError, PatchError
from node.agent.patch import (
    apply_diff,
    change_hash,
    check_source,
    diff_hash,
    make_diff,
    merge,
    normalise_diff,
)
from node.errors import SwarmError
from node.trainer import BASELINE_TRAIN_PY

BASELINE = BASELINE_TRAIN_PY.read_text()
NARROW = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 3 ")
FOUR_STEPS = BASELINE.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
BOTH = NARROW.replace("def orthogonalize(G, steps=5):", "def orthogonalize(G, steps=4):")
NARROW_HUNK = make_diff(BASELINE, NARROW).splitlines()[2]  # "@@ -L,7 +L,7 @@", L where MLP_RATIO is


def test_a_diff_turns_the_parent_into_the_child():
    diff = make_diff(BASELINE, BOTH)
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n@@ ")
    assert apply_diff(BASELINE, diff) == BOTH


def test_equal_files_give_an_empty_diff_and_an_empty_diff_is_refused():
    assert make_diff(BASELINE, BASELINE) == ""
    with pytest.raises(PatchError, match="no hunks"):
        apply_diff(BASELINE, "")


def test_a_diff_that_does_not_match_the_parent_is_refused_and_names_the_line():
    other_parent = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 6 ")
    with pytest.raises(PatchError, match="hunk 1 of 1.*MLP_RATIO = 4") as caught:
        apply_diff(other_parent, make_diff(BASELINE, NARROW))
    assert isinstance(caught.value, AgentError) and isinstance(caught.value, SwarmError)


def test_a_hunk_with_wrong_line_numbers_still_applies_where_its_lines_match():
    diff = make_diff(BASELINE, NARROW).replace(NARROW_HUNK, "@@ -80,6 +80,6 @@")
    assert apply_diff(BASELINE, diff) == NARROW


def test_a_blank_context_line_without_its_space_still_applies():
    diff = make_diff(BASELINE, FOUR_STEPS).replace("\n \n", "\n\n")
    assert apply_diff(BASELINE, diff) == FOUR_STEPS


def test_a_diff_of_two_files_is_refused():
    diff = make_diff(BASELINE, NARROW)
    with pytest.raises(PatchError, match="more than one file"):
        apply_diff(BASELINE, diff + diff.replace("train.py", "harness.py"))


def test_a_diff_over_the_wire_limit_is_refused_before_it_is_read():
    huge = "--- a/train.py\n+++ b/train.py\n@@ -1,1 +1,1 @@\n" + "+x\n" * wire.MAX_DIFF_SIZE
    with pytest.raises(PatchError, match="over the limit"):
        apply_diff(BASELINE, huge)
    with pytest.raises(PatchError, match="over the limit"):
        make_diff(BASELINE, BASELINE + "x = 1\n" * (wire.MAX_DIFF_SIZE // 6))


def test_the_missing_final_newline_survives_a_round_trip():
    for parent, child in (("a\nb", "a\nc"), ("a\nb", "a\nb\n"), ("a\nb\n", "a\nb"), ("", "x\n")):
        assert apply_diff(parent, make_diff(parent, child)) == child


def test_a_trailing_blank_context_line_anchors_its_hunk():
    assert apply_diff("\n", make_diff("\n", "a = 1\n\n")) == "a = 1\n\n"


def test_context_lines_are_taken_from_the_parent_as_it_has_them():
    parent = "x = 1   \ny = 2\n"  # trailing spaces a model would drop in its context
    diff = "--- a/train.py\n+++ b/train.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n"
    assert apply_diff(parent, diff) == "x = 1   \ny = 3\n"


def test_the_same_change_hashes_the_same_whatever_the_headers_and_trailing_spaces():
    diff = make_diff(BASELINE, NARROW)
    other_tool = (
        diff.replace(
            "--- a/train.py\n+++ b/train.py\n",
            "diff --git a/train.py b/train.py\nindex 1234567..89abcde 100644\n"
            "--- train.py\t2026-11-30 06:00:00.000000000 +0000\n"
            "+++ train.py\t2026-11-30 06:01:00.000000000 +0000\n",
        )
        .replace(NARROW_HUNK, NARROW_HUNK + " DEPTH, MODEL_DIM")
        .replace("\n", "  \n")
    )
    assert diff_hash(other_tool) == diff_hash(diff) == change_hash(BASELINE, NARROW)
    assert normalise_diff(diff) == diff  # make_diff already writes the canonical spelling
    assert diff_hash(make_diff(BASELINE, FOUR_STEPS)) != diff_hash(diff)


def test_independent_changes_merge_into_both():
    assert merge(BASELINE, NARROW, FOUR_STEPS) == BOTH


def test_changes_of_neighbouring_lines_merge_and_of_one_line_conflict():
    """Two constants on adjacent lines, each changed on one side: both changes, though no
    unchanged line parts them (merge3 alone calls that a conflict). A side that changes both
    lines, one of them as the other side does, merges too; one that changes a line otherwise,
    or adds a line inside the region, does not."""
    base = "A = 1\nB = 2\nC = 3\n"
    assert merge(base, "A = 1\nB = 5\nC = 3\n", "A = 1\nB = 2\nC = 7\n") == "A = 1\nB = 5\nC = 7\n"
    assert merge(base, "A = 9\nB = 5\nC = 3\n", "A = 1\nB = 5\nC = 7\n") == "A = 9\nB = 5\nC = 7\n"
    assert merge(base, "A = 1\nB = 5\nC = 3\n", "A = 1\nB = 6\nC = 7\n") is None
    assert merge(base, "A = 1\nB = 5\nC = 3\n", "A = 1\nB = 2\nX = 0\nC = 7\n") is None


def test_changes_of_the_same_line_conflict():
    wide = BASELINE.replace("MLP_RATIO = 4 ", "MLP_RATIO = 5 ")
    assert merge(BASELINE, NARROW, wide) is None
    assert merge(BASELINE, NARROW, NARROW) == NARROW  # the same change twice is no conflict


def test_a_train_py_that_does_not_compile_is_refused_with_its_line():
    with pytest.raises(PatchError, match="does not compile at line 2"):
        check_source("x = 1\ny = (\n")


_lines = st.lists(st.sampled_from(["a = 1", "b = 2", "", "  c", "# d", "e = f(x)"]), max_size=12)


@settings(max_examples=150, deadline=None)
@given(_lines, _lines, st.booleans(), st.booleans())
def test_any_diff_applies_back_to_its_child(parent_lines, child_lines, parent_nl, child_nl):
    parent = "\n".join(parent_lines) + ("\n" if parent_nl and parent_lines else "")
    child = "\n".join(child_lines) + ("\n" if child_nl and child_lines else "")
    diff = make_diff(parent, child)
    if parent == child:
        assert diff == ""
    else:
        assert apply_diff(parent, diff) == child
        assert diff_hash(normalise_diff(diff)) == diff_hash(diff)
