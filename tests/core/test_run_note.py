"""The MLflow run's description: sections written in any order, read in one, each once."""

from __future__ import annotations

import pytest

from tabletune.core.run_note import plain, sections_of, with_section


def test_sections_come_out_in_one_order_whatever_order_the_steps_wrote_them():
    note = with_section("", "Run", "Acceptance refresh.")
    note = with_section(note, "Gate", "**Passed**")
    note = with_section(note, "Outcome", "**Finished**: promoted version 2")
    note = with_section(note, "Candidate table", "| 1–7 | 2 |")
    assert [line for line in note.splitlines() if line.startswith("#### ")] == [
        "#### Outcome", "#### Run", "#### Candidate table", "#### Gate"]
    assert sections_of(note)[1]["Outcome"] == "**Finished**: promoted version 2"


def test_a_section_written_again_replaces_the_old_one():
    # A retried task, or a callback correcting an ending the orphan closer wrote.
    note = with_section("", "Outcome", "**Killed**: orphaned: its DAG run ended without closing it")
    note = with_section(note, "Run", "Re-profile.")
    again = with_section(note, "Outcome", "**Failed**: DAG run failed at task profile")
    assert again.count("#### Outcome") == 1 and "orphaned" not in again
    assert with_section(again, "Run", "Re-profile.") == again


def test_what_a_person_wrote_above_the_sections_stays_on_top():
    note = with_section("Checked by the on-call: the drafter was swapped on Monday.\n",
                        "Outcome", "**Finished**: promoted version 3")
    preamble, sections = sections_of(with_section(note, "Run", "Acceptance refresh."))
    assert preamble == "Checked by the on-call: the drafter was swapped on Monday."
    assert list(sections) == ["Outcome", "Run"]


@pytest.mark.parametrize("heading", ["", " Outcome", "Out\ncome"])
def test_a_heading_is_one_line(heading):
    with pytest.raises(ValueError, match="one line"):
        with_section("", heading, "x")


def test_plain_text_is_not_read_as_markup():
    assert plain("edge k=2 moved *40 %* | see [docs]") == \
        "edge k=2 moved \\*40 %\\* \\| see \\[docs\\]"
    assert plain("task measure_acceptance") == "task measure\\_acceptance"
