"""One rebuild's record on its own (tabletune.controller.records): what moved the table."""

from tabletune.controller.records import MOVED_BY, what_moved


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
