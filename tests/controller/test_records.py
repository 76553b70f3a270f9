"""One rebuild's record on its own (tabletune.controller.records): what moved the table, and the
log that keeps the most recent records and the run's tallies."""

import json

from tabletune.controller.records import MOVED_BY, RebuildLog, RebuildRecord, what_moved


def _record(index: int, moved_by: str, held: int) -> RebuildRecord:
    return RebuildRecord(index=index, step=10 * index, old_ranges=((1, 8, 1),),
                         new_ranges=((1, 8, 1),), changed=moved_by != "nothing", rates=(0.5,),
                         drafted=(1.0,), accepted=(0.5,), prior_weight=10.0, moved_by=moved_by,
                         held_by={"min_width": held})


def test_each_changed_batch_size_is_put_down_to_the_evidence_that_alone_gives_its_new_k():
    old = [3, 3, 3, 1]
    new = [3, 2, 2, 2]
    by_rates = [3, 2, 3, 2]  # the new a_hat alone gives B = 2 and B = 4
    by_times = [3, 3, 2, 2]  # the new T' alone gives B = 3 and B = 4
    moved, cause = what_moved(old, new, by_rates, by_times)
    assert moved == {"acceptance": 1, "step_time": 1, "both": 1}
    assert cause == "both"
    moved, cause = what_moved(old, [3, 2, 3, 1], by_rates, by_times)
    assert moved == {"acceptance": 1, "step_time": 0, "both": 0} and cause == "acceptance"
    assert set(moved) | {"nothing"} == set(MOVED_BY)


def test_the_log_keeps_the_last_records_and_tallies_every_rebuild():
    log = RebuildLog(2)
    for i, cause in enumerate(["acceptance", "nothing", "acceptance"], start=1):
        log.add(_record(i, cause, held=i))
    assert log.count == 3 and [r.index for r in log.records] == [2, 3]
    assert log.moved_by == {"acceptance": 2, "step_time": 0, "both": 0, "nothing": 1}
    assert log.held_by["min_width"] == 6 and log.held_by["acceptance_noise"] == 0
    assert [r.index for r in log.drain()] == [2, 3] and log.drain() == []
    fields = json.loads(json.dumps(log.state_fields()))
    assert fields["num_rebuilds"] == 3 and fields["history_limit"] == 2
    assert [r["index"] for r in fields["history"]] == [2, 3]
    again = RebuildLog(2)
    again.restore(fields, log.records)
    assert again.state_fields() == log.state_fields() and again.drain() == []
