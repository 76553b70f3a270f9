"""The text report of a table document (what ``show``, ``build`` and ``tune`` print) and of a
tune's serving calibration, called directly; tests/cli/test_cli.py runs it through ``show``."""

from __future__ import annotations

import dataclasses
import json

import pytest
from factories import make_acceptance, make_profile

from tabletune.core.contracts import GoodputBlock, TableDocument
from tabletune.core.document import build_document
from tabletune.core.errors import ContractError
from tabletune.report.text import _batch_size_runs, describe_calibration, describe_document


@pytest.fixture
def doc() -> TableDocument:
    return build_document(make_profile(), make_acceptance()).document


def test_the_report_gives_the_table_the_vllm_option_and_the_losses(doc):
    text = describe_document(doc)
    lines = text.splitlines()
    assert lines[0] == "draft-length table:"
    option = next(line for line in lines if line.startswith("  --speculative-config '"))
    config = json.loads(option.split("'")[1])
    assert config == {"num_speculative_tokens": doc.num_speculative_tokens,
                      "num_speculative_tokens_per_batch_size": doc.table.to_vllm()}
    assert "  this table (modelled, in-sample): " in text
    for k in doc.goodput.lengths:
        assert f"  fixed k={k}: " in text
    assert "nan" not in text


def test_a_goodput_block_of_the_wrong_shape_is_named_not_a_key_error(doc):
    # The block is checked where it is parsed, so no report ever gets one of the wrong shape.
    goodput = {**doc.goodput.to_dict(), "chosen": list(doc.goodput.chosen[:-1])}
    with pytest.raises(ContractError, match=r"^table\.goodput\.chosen: "):
        GoodputBlock.from_dict(goodput)


def test_an_all_zero_goodput_block_has_no_loss_to_report(doc):
    goodput = {**doc.goodput.to_dict(),
               "tokens_per_s": [[0.0] * len(row) for row in doc.goodput.tokens_per_s]}
    text = describe_document(dataclasses.replace(doc, goodput=GoodputBlock.from_dict(goodput)))
    assert text.endswith("  none to report: the goodput block is zero at every batch size")


def test_consecutive_batch_sizes_of_one_kind_are_one_run():
    assert _batch_size_runs([1, 2, 3, 5, 6, 8], {5, 6}) == ["1–3", "5–6 (interpolated)", "8"]


def test_the_calibration_is_one_line_per_measured_batch_size():
    profile = make_profile(max_k=1)
    meta = {"serving_calibration": {
        "measured": [{"batch_size": 8}, {"batch_size": 2}, {"batch_size": 8}],
        "factors": [{"batch_size": b, "k": k, "factor": 1 + b / 100 + k / 10}
                    for b in (2, 8) for k in (0, 1)]}}
    text = describe_calibration(dataclasses.replace(profile, meta=meta))
    assert text.splitlines() == [
        "serving step time / reject-all profile (measured at B [2, 8]; interpolated in log B "
        "between them):",
        "  B=2: k=0 1.020, k=1 1.120",
        "  B=8: k=0 1.080, k=1 1.180",
    ]


def test_an_edge_put_back_from_where_its_lead_cleared_the_noise_says_both(doc):
    first = doc.goodput.edges[0]
    assert first.cleared_at == first.batch_size  # the factory's repeats agree exactly
    moved = dataclasses.replace(first, cleared_at=first.batch_size + 4, gain=0.031,
                                uncertainty=0.024)
    g = dataclasses.replace(doc.goodput, edges=(moved,) + doc.goodput.edges[1:])
    lines = describe_document(dataclasses.replace(doc, goodput=g)).splitlines()
    assert f"  B=25: k {first.from_k} → {first.to_k}, ahead from here; by 3.1% at B=29 " \
           "(uncertainty 2.4%)" in lines
    assert f"  B=25: k {first.from_k} → {first.to_k} by " in "\n".join(
        describe_document(doc).splitlines())


def test_an_edge_between_far_apart_profiled_sizes_says_it_was_placed_by_interpolation(doc):
    # The factory's profile times B = 1, 2, 4, .., 128; its table changes length at 25, 39
    # and 55, each between two profiled sizes twice apart.
    assert [e.batch_size for e in doc.goodput.edges] == [25, 39, 55]
    lines = describe_document(doc).splitlines()
    at = lines.index(next(line for line in lines if line.startswith("  B=25: k 3 → 2 by ")))
    assert lines[at + 1] == ("    placed by interpolation: nothing was profiled between B=16 "
                             "and 32; add a batch size between them (e.g. 23) to --batch-sizes "
                             "to time where the length changes")
    assert sum("placed by interpolation" in line for line in lines) == 3
    # Profiled at every batch size, no edge is placed by interpolation.
    goodput = {**doc.goodput.to_dict(), "interpolated_batch_sizes": []}
    dense = describe_document(dataclasses.replace(doc, goodput=GoodputBlock.from_dict(goodput)))
    assert "  B=25: k 3 → 2 by " in dense and "placed by interpolation" not in dense


def test_the_resolve_pass_names_what_it_timed_again_and_what_it_never_reached():
    """h100-v033-t1-tune: nine sizes in question, the 45 s reached five; B = 128, one of the
    other four, kept a length a paired referee then found 4.7 % behind."""
    from tabletune.report.text import describe_resolve

    profile = make_profile(max_k=3)
    assert describe_resolve(profile) == []  # no pass: nothing said
    resolved = {"240": {"lengths": [0, 1, 2, 3], "loops": 1, "turns": 2, "settled": False},
                "128": {"lengths": [1, 2, 3], "loops": 0, "turns": 0, "settled": False},
                "32": {"lengths": [1, 2, 3], "loops": 2, "turns": 6, "settled": True},
                "16": {"lengths": [1, 2, 3], "loops": 0, "turns": 0, "settled": False}}
    meta = {"serving_calibration": {"plan": {"resolve_s": 45.0}, "resolved": resolved}}
    assert describe_resolve(dataclasses.replace(profile, meta=meta)) == [
        "resolve pass: 4 serving sizes in question after the first loops, 45 s of loops:",
        "  timed again: B=32 (k 1/2/3: 2 loops, 6 turns, settled), "
        "B=240 (k 0/1/2/3: 1 loop, 2 turns)",
        "  no loop before the time ran out: B = 16 (k 1/2/3), 128 (k 1/2/3); the table there "
        "rests on the first loops' windows alone (a longer --serving-resolve times them)",
    ]
    # Since each size is owed its loop: the ones that came after the budget are named.
    resolved["128"] = {"lengths": [1, 2, 3], "loops": 1, "turns": 3, "settled": False,
                       "past_budget": 1}
    resolved["16"] = {"lengths": [1, 2, 3], "loops": 1, "turns": 3, "settled": True,
                      "past_budget": 1}
    assert describe_resolve(dataclasses.replace(profile, meta=meta)) == [
        "resolve pass: 4 serving sizes in question after the first loops, 45 s of loops:",
        "  timed again: B=16 (k 1/2/3: 1 loop, 3 turns, settled), "
        "B=32 (k 1/2/3: 2 loops, 6 turns, settled), B=128 (k 1/2/3: 1 loop, 3 turns), "
        "B=240 (k 0/1/2/3: 1 loop, 2 turns)",
        "  owed a loop the time left could not hold: B = 16, 128; one loop each, unsettled ones "
        "no more (a longer --serving-resolve gives them more)",
    ]
