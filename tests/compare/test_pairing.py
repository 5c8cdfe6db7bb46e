"""Paired time-of-day batch means: used only when both runs' clocks say they ran at the same hours of the day, and
when used, what the runs share at the same clock time cancels while the A/A guard (never below the
independent-requests variance) holds."""

from __future__ import annotations

import numpy as np
import pytest

from servlens.compare import cohorts as co
from servlens.compare import stats
from tools import compare_simulation as simulate
from servlens.compare.engine import compare_runs
from servlens.compare.policy import load_policy
from servlens.store.schema import open_store


@pytest.fixture
def con():
    con = open_store(None)
    yield con
    con.close()


def add(con, run, start: str | None, hours: float, n: int = 400, seed: int = 0, null_share: float = 0.0):
    """n requests spread evenly over `hours` from `start` (an ISO time; None: no arrival times at all)."""
    rng = np.random.default_rng(seed)
    cols = {"model": np.full(n, "m", dtype=object), "status": np.full(n, "ok", dtype=object),
            "ttft_s": np.exp(rng.normal(np.log(0.2), 0.3, n)), "prompt_tokens": np.full(n, 100),
            "completion_tokens": np.full(n, 50)}
    if start is not None:
        offsets = np.sort(rng.uniform(0, hours * 3600, n))
        t = np.datetime64(start) + (offsets * 1e6).astype("timedelta64[us]")
        if null_share:
            t = t.astype(object)
            t[: int(n * null_share)] = None
        cols["t_arrival"] = t
    simulate.insert_requests(con, run, cols)


@pytest.mark.parametrize("before, after, hours", [
    ("2026-03-02T09:00:00", "2026-03-02T09:00:00", 8),     # a canary beside its baseline, the same hours
    ("2026-03-02T09:00:00", "2026-03-03T09:05:00", 8),     # the next day, the same hours
    ("2026-03-02T23:00:00", "2026-03-05T23:00:00", 2),     # across midnight, both
    ("2026-03-02T00:00:00", "2026-03-03T00:00:00", 23.9),  # whole days
])
def test_runs_at_the_same_hours_of_the_day_are_paired(con, before, after, hours):
    add(con, "before", before, hours, seed=1)
    add(con, "after", after, hours, seed=2)
    clock = co.clock_alignment(con, "before", "after")
    assert clock.paired, clock.reason
    assert clock.reason.startswith("paired by time of day: ")
    assert min(clock.overlap) >= co.PAIRING_MIN_OVERLAP


@pytest.mark.parametrize("before, after, hours, reason", [
    ("2026-03-02T08:00:00", "2026-03-02T14:00:00", 2, "unpaired: the runs cover different hours of the day (0% of "),
    ("2026-03-02T09:00:00", "2026-03-04T13:00:00", 8, "unpaired: the runs cover different hours of the day (49% of "),
    ("1970-01-01T00:00:00", "1970-01-01T00:00:00", 1, "unpaired: run 'before' has relative arrival times"),
    ("2026-03-02T09:00:00", "2026-03-02T09:00:00", 30, "unpaired: run 'before' spans more than a day"),
])
def test_runs_whose_clocks_do_not_align_are_not_paired(con, before, after, hours, reason):
    add(con, "before", before, hours, seed=1)
    add(con, "after", after, hours, seed=2)
    clock = co.clock_alignment(con, "before", "after")
    assert not clock.paired
    assert clock.reason.startswith(reason), clock.reason


def test_unknown_arrival_times_are_not_paired(con):
    add(con, "before", "2026-03-02T09:00:00", 2, seed=1)
    add(con, "after", "2026-03-02T09:00:00", 2, seed=2, null_share=0.1)
    clock = co.clock_alignment(con, "before", "after")
    assert not clock.paired
    assert clock.reason == ("unpaired: arrival times are unknown for 40 of run 'after''s 400 requests, so time "
                            "batches follow each run's stored order")
    con.execute("DELETE FROM requests WHERE run = 'after'")
    add(con, "after", None, 2, seed=2)
    assert not co.clock_alignment(con, "before", "after").paired


def test_the_verdict_says_which_batches_it_used(con):
    add(con, "before", "2026-03-02T09:00:00", 2, seed=1)
    add(con, "after", "2026-03-02T14:00:00", 2, seed=2)
    doc = compare_runs(con, "before", "after", load_policy())
    assert doc["method"]["batches"].startswith("unpaired: the runs cover different hours")
    ttft = next(g for g in doc["gates"] if g["id"] == "ttft_p50")
    assert ttft["batch_means"] == {"paired": False, "batches": {"before": 50, "after": 50}}
    con.execute("DELETE FROM requests")
    add(con, "before", "2026-03-02T09:00:00", 2, seed=1)
    add(con, "after", "2026-03-03T09:00:00", 2, seed=2)
    doc = compare_runs(con, "before", "after", load_policy())
    ttft = next(g for g in doc["gates"] if g["id"] == "ttft_p50")
    assert ttft["batch_means"]["paired"] is True and ttft["batch_means"]["windows"] == 50
    assert 1 <= ttft["batch_means"]["df"] <= 49
    error = next(g for g in doc["gates"] if g["id"] == "error_rate_rate")
    assert "batch_means" not in error          # rates keep each run's own batches


def _side(batch_of_request: np.ndarray, column: np.ndarray, bins: int) -> stats.Side:
    cells, n = np.unique(np.stack([batch_of_request, column]), axis=1, return_counts=True)
    return stats.Side(counts=np.bincount(column, minlength=bins)[None, :], batch=cells[0],
                      cohort=np.zeros(cells.shape[1], dtype=np.int64), column=cells[1], n=n.astype(np.float64))


def test_shared_structure_cancels_and_the_floor_holds():
    """Both runs slower in the same windows (a shared incident): the unpaired batch-means variance is many times
    the independent one, the paired one falls back to it (never below); independent runs keep their variance."""
    rng = np.random.default_rng(5)
    windows, per = 20, 500
    batch = np.repeat(np.arange(windows), per)
    level = np.repeat(rng.normal(0, 1.0, windows), per)        # the same in both runs: shared by clock time
    grid = np.arange(400)
    sides = []
    for _ in range(2):
        x = level + rng.normal(0, 0.5, windows * per)
        sides.append(_side(batch, np.clip(((x + 4) * 50).astype(np.int64), 0, 399), len(grid)))
    one = np.ones(1)
    unpaired = [stats.quantile_side(s, one, 0.5).se for s in sides]
    pb, pa, info = stats.paired_quantile_sides(sides[0], sides[1], one, 0.5)
    iid = np.sqrt(0.25 / (windows * per))
    assert min(unpaired) > 5 * iid
    assert info["correlation"] > 0.9
    assert pb.se == pytest.approx(iid, rel=0.05) and pa.se == pytest.approx(iid, rel=0.05)
    assert pb.df >= windows // 2             # windows alike: t keeps most of its degrees of freedom
    own = np.repeat(rng.normal(0, 1.0, windows), per) + rng.normal(0, 0.5, windows * per)   # its own structure
    other = _side(batch, np.clip(((own + 4) * 50).astype(np.int64), 0, 399), len(grid))
    qb, _, info = stats.paired_quantile_sides(sides[0], other, one, 0.5)
    assert abs(info["correlation"]) < 0.5
    assert qb.se > 0.5 * unpaired[0]


def test_a_difference_carried_by_one_window_gets_few_degrees_of_freedom():
    """All of the tail in one window both runs share (an incident): once the shared part is out, what is left is
    estimated from that window alone, so t must not keep the degrees of freedom of all the windows."""
    rng = np.random.default_rng(9)
    windows, per = 20, 200
    batch = np.repeat(np.arange(windows), per)
    sides = []
    for _ in range(2):
        x = rng.normal(0, 0.3, windows * per) + 3.0 * (batch == 7)
        sides.append(_side(batch, np.clip(((x + 2) * 40).astype(np.int64), 0, 399), 400))
    qb, _, info = stats.paired_quantile_sides(sides[0], sides[1], np.ones(1), 0.99)
    assert info["effective_windows"] < 4
    assert qb.df <= 3
