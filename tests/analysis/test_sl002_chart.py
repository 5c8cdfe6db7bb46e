"""SL002's evidence chart: one bar per max_tokens cap in cap order, and a threshold line that says what it is."""

from __future__ import annotations

from servlens.analysis.rules import load_rules, select_rules
from servlens.analysis.runner import analyze
from servlens.store.schema import open_store


def _requests(con, cap: int | None, count: int, cut: int, start: int) -> None:
    """`count` requests with max_tokens `cap`, the first `cut` of them ended at the cap."""
    cap_sql = "NULL" if cap is None else str(cap)
    con.execute(f"""
        INSERT INTO requests (run, request_id, model, max_tokens, finish_reason, completion_tokens, status)
        SELECT 'prod', 'r' || ({start} + i), 'chat-8b', {cap_sql},
               CASE WHEN i < {cut} THEN 'length' ELSE 'stop' END,
               CASE WHEN i < {cut} THEN coalesce({cap_sql}, 700) ELSE 5 + i % 3 END, 'ok'
        FROM range({count}) t(i)""")


def test_bars_follow_the_cap_and_the_line_names_the_threshold():
    con = open_store(None)
    try:
        # Caps inserted out of order, with the most length finishes at 32, then 8, then 1024, then none.
        for start, (cap, count, cut) in enumerate([(1024, 20, 2), (32, 20, 15), (None, 10, 1), (8, 20, 10),
                                                  (16, 20, 0)]):
            _requests(con, cap, count, cut, start * 100)
        rules = select_rules(load_rules(), ["SL002"], None)
        doc = analyze(con, rules, ["prod"])
    finally:
        con.close()
    finding = next(f for f in doc["findings"] if f["rule"] == "SL002")
    assert finding["state"] == "fired"
    chart = finding["evidence"]["chart"]
    assert chart["series"][0]["x"] == ["8", "16", "32", "1024", "unset"]
    assert chart["series"][0]["y"] == [0.5, 0.0, 0.75, 0.1, 0.1]
    assert chart["hlines"] == [{"y": 0.05, "label": "fires at 5% overall (max_length_share)"}]
    # the table still leads with the cap that cut the most
    assert [row[0] for row in finding["evidence"]["table"]["rows"]][:2] == [32, 8]
