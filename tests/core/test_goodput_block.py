"""The goodput block of a table document: parsed and checked once, written back as it was."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from factories import make_acceptance, make_profile

from tabletune.core.contracts import GoodputBlock, TableDocument, load_json, save_json
from tabletune.core.document import build_document
from tabletune.core.errors import ContractError
from tabletune.core.goodput_block import GoodputEdge, OutOfSample
from tabletune.core.tables import DOCS_TABLE

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


@pytest.fixture(scope="module")
def built() -> TableDocument:
    return build_document(make_profile(), make_acceptance()).document


@pytest.fixture
def block(built) -> dict:
    """A built document's block as JSON, with every optional part."""
    return copy.deepcopy(built.goodput.to_dict())


def test_a_built_block_has_every_field_typed(built):
    g = built.goodput
    assert g.unit == "tokens/s" and g.rates == (0.8, 0.6, 0.45) and g.tie_margin == 0.005
    assert g.lengths == (0, 1, 2, 3) and g.batch_sizes == tuple(range(1, 129))
    assert len(g.tokens_per_s) == 128 and all(len(row) == 4 for row in g.tokens_per_s)
    assert g.chosen == tuple(built.table.k_for(b) for b in g.batch_sizes)
    assert g.edges and all(isinstance(e, GoodputEdge) for e in g.edges)
    assert g.held_by_noise_batch_sizes == () and g.allowed_lengths is None
    assert isinstance(g.out_of_sample, OutOfSample) and g.out_of_sample.folds == 3
    assert g.extra == {}


def test_the_block_round_trips_through_json_unchanged(built, block):
    again = GoodputBlock.from_dict(json.loads(json.dumps(block)))
    assert again == built.goodput
    assert json.dumps(again.to_dict()) == json.dumps(block)
    assert GoodputBlock.from_dict(again.to_dict()) == again


def test_the_empty_block_is_a_table_made_by_hand():
    assert GoodputBlock.from_dict({}) == GoodputBlock()
    assert GoodputBlock().to_dict() == {}
    doc = TableDocument(DOCS_TABLE, 3, {"by": "hand"})
    assert doc.goodput == GoodputBlock() and doc.to_dict()["goodput"] == {}


def test_optional_fields_stay_absent(block):
    # As in documents older than the edges, the held batch sizes and the held-out figure.
    for key in ("edges", "held_by_noise_batch_sizes", "out_of_sample"):
        del block[key]
    g = GoodputBlock.from_dict(block)
    assert g.edges is None and g.held_by_noise_batch_sizes is None and g.out_of_sample is None
    assert g.to_dict() == block


def test_an_edge_from_before_its_clearing_point_was_recorded_reads_and_writes_back(block):
    edge = block["edges"][0]
    assert edge["cleared_at"] >= edge["batch_size"]
    del edge["cleared_at"]
    g = GoodputBlock.from_dict(block)
    assert g.edges[0].cleared_at is None and g.edges[0].extra == {}
    assert g.to_dict() == block


def test_unknown_keys_are_kept_at_every_level_and_written_back(block):
    block["note"] = {"by": "hand"}
    block["edges"][0]["why"] = "measured"
    block["out_of_sample"]["seed"] = 7
    g = GoodputBlock.from_dict(block)
    assert g.extra == {"note": {"by": "hand"}}
    assert g.edges[0].extra == {"why": "measured"} and g.out_of_sample.extra == {"seed": 7}
    assert g.to_dict() == block


@pytest.mark.parametrize(("change", "message"), [
    (lambda g: g["chosen"].__setitem__(3, 7),
     r"^table\.goodput\.chosen\[3\]: 7 is not one of table\.goodput\.lengths \[0, 1, 2, 3\]$"),
    (lambda g: g["chosen"].__setitem__(3, "1"),
     r"^table\.goodput\.chosen\[3\]: '1' is not an integer$"),
    (lambda g: g.update(unit=5), r"^table\.goodput\.unit: 5 is not a string$"),
    (lambda g: g.update(rates=[0.5, 0.6]), r"^table\.goodput\.rates\[1\]: 0\.6 is above "),
    (lambda g: g.update(tie_margin="0.01"),
     r"^table\.goodput\.tie_margin: '0\.01' is not a non-negative number$"),
    (lambda g: g.update(allowed_lengths=[]), r"^table\.goodput\.allowed_lengths: \[\] is empty$"),
    (lambda g: g["held_by_noise_batch_sizes"].append(0),
     r"^table\.goodput\.held_by_noise_batch_sizes\[0\]: 0 is not an integer >= 1$"),
    (lambda g: g["tokens_per_s"].pop(),
     r"^table\.goodput\.tokens_per_s: '127 rows' do not match table\.goodput\.batch_sizes "),
    (lambda g: g["tokens_per_s"][5].__setitem__(2, None),
     r"^table\.goodput\.tokens_per_s\[5\]\[2\]: None is not a non-negative number$"),
    (lambda g: g.pop("batch_sizes"),
     r"^table\.goodput\.batch_sizes: None is missing \(needed to report the loss\)$"),
    (lambda g: g["edges"][0].update(gain="big"),
     r"^table\.goodput\.edges\[0\]\.gain: 'big' is not a finite number$"),
    (lambda g: g["edges"][0].pop("to_k"), r"^table\.goodput\.edges\[0\]\.to_k: None is missing$"),
    (lambda g: g["edges"][0].update(cleared_at=0),
     r"^table\.goodput\.edges\[0\]\.cleared_at: 0 is not an integer >= 1$"),
    (lambda g: g["edges"][0].update(cleared_at=g["edges"][0]["batch_size"] - 1),
     r"^table\.goodput\.edges\[0\]\.cleared_at: 24 is below the edge's batch_size 25$"),
    (lambda g: g.update(edges={"batch_size": 2}), r"^table\.goodput\.edges: \{'batch_size'"),
    (lambda g: g["out_of_sample"].pop("folds"),
     r"^table\.goodput\.out_of_sample\.folds: None is missing$"),
    (lambda g: g["out_of_sample"]["worst_loss_per_fold"].__setitem__(1, "x"),
     r"^table\.goodput\.out_of_sample\.worst_loss_per_fold\[1\]: 'x' is not a finite number$"),
])
def test_a_bad_field_is_named_with_its_path_and_value(block, change, message):
    change(block)
    with pytest.raises(ContractError, match=message):
        GoodputBlock.from_dict(block)


def test_a_bad_block_in_a_file_is_named_with_the_file(tmp_path, built, block):
    block["chosen"][3] = 7
    path = tmp_path / "table.json"
    path.write_text(json.dumps({**built.to_dict(), "goodput": block}))
    with pytest.raises(ContractError, match=rf"^{path}: table\.goodput\.chosen\[3\]: 7 "):
        load_json(path, "table")


def test_a_document_takes_a_parsed_block_only(built, block):
    with pytest.raises(ContractError, match=r"^table\.goodput: .* is not a GoodputBlock"):
        dataclasses.replace(built, goodput=block)


def test_the_out_of_sample_figure_is_in_the_block_from_construction():
    build = build_document(make_profile(), make_acceptance()).build
    assert build.to_document({}).goodput.out_of_sample is None
    figure = {"method": "m", "folds": 2, "folds_skipped": 0, "worst_loss_per_fold": [0.1, 0.2],
              "worst_loss_mean": 0.15, "worst_loss_max": 0.2}
    doc = build.to_document({}, out_of_sample=figure)
    assert doc.goodput.out_of_sample.to_dict() == figure
    assert list(doc.to_dict()["goodput"])[-1] == "out_of_sample"


@pytest.mark.parametrize("path", sorted(RESULTS.glob("**/table.json")),
                         ids=lambda p: str(p.relative_to(RESULTS)))
def test_committed_tables_load_and_save_byte_for_byte(tmp_path, path):
    save_json(tmp_path / "table.json", load_json(path, "table"))
    assert (tmp_path / "table.json").read_bytes() == path.read_bytes()
