"""experiments/clock.py (issue 41): the simulator's clock against real runs. Its measures by hand, and the
committed page regenerated from the committed runs byte for byte."""
import json

import pytest

from helpers import experiment

clock = experiment("clock")


def run(curve, histogram=None, updates=None):
    return {"curve": curve, "histogram": histogram or {}, "updates": updates or []}


def test_time_to_a_target_is_the_first_evaluation_at_or_above_it():
    r = run([(0.0, 0.1), (1.0, 0.8), (2.0, 0.9), (3.0, 0.85), (4.0, 0.95)])
    assert clock.time_to(r, 0.85) == 2.0 and clock.time_to(r, 0.9) == 2.0 and clock.time_to(r, 0.95) == 4.0
    assert clock.time_to(r, 0.96) is None


def test_a_median_that_a_censored_run_could_move_is_not_given():
    reached = [run([(t, 0.9)]) for t in (1.0, 2.0, 3.0)]
    never = run([(5.0, 0.5)])
    assert clock.median_time(reached, 0.9) == (2.0, 0)
    # one of three never reached: it counts as later than all, the median is still the second
    assert clock.median_time(reached[:2] + [never], 0.9) == (2.0, 1)
    # two of three: the median is unknown
    assert clock.median_time(reached[:1] + [never, never], 0.9) == (None, 2)
    # one of two: the median (between a time and infinity) is unknown too
    assert clock.median_time([reached[0], never], 0.9) == (None, 1)


def test_total_variation_by_hand():
    p, q = {1: 2, 2: 2}, {1: 1, 2: 2, 3: 1}
    # p = (1/2, 1/2, 0), q = (1/4, 1/2, 1/4): half of 1/4 + 0 + 1/4
    assert clock.tv_distance(p, q) == pytest.approx(0.25)
    assert clock.tv_distance(p, p) == 0.0


def test_shares_and_histograms_pool_the_seeds():
    a, b = run([], {0: 1, 3: 3}, [3, 1]), run([], {3: 4}, [1, 3])
    assert clock.pooled([a, b], "histogram") == {0: 1, 3: 7}
    assert clock.pooled([a, b], "shares") == [0.5, 0.5]


def test_the_committed_page_is_what_the_committed_runs_give(tmp_path):
    root = clock.ROOT
    if not (root / clock.RUNS).is_dir():
        pytest.skip("no committed clock runs")
    rows = clock.compare(root)
    assert rows, "the committed runs make no row"
    assert clock.page(rows, clock.machine(root)) == (root / clock.PAGE).read_text()


def test_real_runs_are_timed_from_their_workers_start(tmp_path):
    d = tmp_path / clock.RUNS / "real-local-M4-x-s0"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"pacing": {"started_s": 2.5}}))
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"wall_s": 0.0, "virtual_s": 0.0, "val_acc": 0.1}, {"wall_s": 4.0, "virtual_s": 3.0, "val_acc": 0.9}]))
    (d / "staleness.json").write_text(json.dumps({"histogram": {"0": 1}, "per_worker": [{"updates": 1}]}))
    loaded = clock.load(tmp_path, "real-local-M4-x-s0")
    assert loaded["curve"] == [(0.0, 0.1), (0.5, 0.9)]
