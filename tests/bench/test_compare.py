"""The regression rule: slower by more than the threshold AND significant."""

import json

import numpy as np
import pytest

from speedlight import cli, results
from speedlight.bench import compare


def _row(samples, case="toy-rows4-fp32", impl="speedlight", mode="fwd", status="ok", **extra):
    samples = [float(s) for s in samples]
    return {"tool": "bench", "op": "toy", "implementation": impl, "case_id": case, "mode": mode,
            "status": status, "reason": "" if status == "ok" else "why",
            "median_us": float(np.median(samples)) if samples else None,
            "samples_us": samples, "device": "NVIDIA H200", "representative": True, **extra}


def _draw(seed, n=60, scale=1.0):
    return 10.0 * scale * np.random.default_rng(seed).lognormal(0.0, 0.03, n)


def _one(old, new, **kw):
    (c,) = compare.compare([old], [new], **kw)
    return c


def test_a_planted_20_percent_regression_is_caught():
    c = _one(_row(_draw(0)), _row(_draw(1, scale=1.2)))
    assert c.verdict == "regression"
    assert c.change == pytest.approx(0.2, abs=0.03) and c.p_value < 1e-6


def test_an_unchanged_rerun_passes():
    for seed in range(1, 6):  # independent reruns from the same distribution
        c = _one(_row(_draw(0)), _row(_draw(seed)))
        assert c.verdict == "unchanged", (seed, c)


def test_significance_is_needed():
    # the median is 20% higher, but 3 noisy samples a side cannot show it at alpha = 0.01
    old, new = _row([10.0, 14.0, 7.0]), _row([12.0, 16.8, 8.4])
    c = _one(old, new)
    assert c.change == pytest.approx(0.2) and c.p_value >= 0.01
    assert c.verdict == "unchanged" and "not significant" in c.note


def test_the_threshold_is_needed():
    # 2% slower and certain of it: below the 5% a team acts on
    c = _one(_row(_draw(0, n=400)), _row(_draw(1, n=400, scale=1.02)))
    assert c.p_value < 0.01 and c.verdict == "unchanged"
    assert _one(_row(_draw(0, n=400)), _row(_draw(1, n=400, scale=1.02)),
                threshold=0.01).verdict == "regression"


def test_improvement_and_unmatched_and_failed_rows():
    old = [_row(_draw(0)), _row(_draw(0), case="gone"), _row(_draw(0), case="broke")]
    new = [_row(_draw(1, scale=0.7)), _row(_draw(0), case="added"),
           _row([], case="broke", status="error")]
    verdicts = {c.case_id: c.verdict for c in compare.compare(old, new)}
    assert verdicts == {"toy-rows4-fp32": "improvement", "gone": "only in old",
                        "broke": "not comparable", "added": "only in new"}


def test_the_last_row_of_a_key_wins_and_baselines_are_left_out_by_default():
    old = [_row(_draw(0, scale=2.0)), _row(_draw(0)), _row(_draw(0), impl="torch-eager")]
    new = [_row(_draw(1)), _row(_draw(1, scale=2.0), impl="torch-eager")]
    comps = compare.compare(old, new)
    assert [(c.implementation, c.verdict) for c in comps] == [("speedlight", "unchanged")]
    every = compare.compare(old, new, implementations=None)
    assert {c.implementation: c.verdict for c in every} == {"speedlight": "unchanged",
                                                           "torch-eager": "regression"}


def _write(path, rows):
    results.write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_cli_exits_one_on_a_regression_and_zero_on_a_rerun(tmp_path, capsys):
    old = _write(tmp_path / "old" / "bench.jsonl", [_row(_draw(0)), _row(_draw(0), case="b")])
    same = _write(tmp_path / "same.jsonl", [_row(_draw(1)), _row(_draw(2), case="b")])
    slow = _write(tmp_path / "slow.jsonl", [_row(_draw(1)), _row(_draw(2, scale=1.2), case="b")])
    assert cli.main(["bench", "compare", old, same]) == 0
    assert "0 regression(s)" in capsys.readouterr().out
    assert cli.main(["bench", "compare", str(tmp_path / "old"), slow]) == 1
    out = capsys.readouterr().out
    assert "regression" in out and "1 regression(s)" in out and "Mann-Whitney" in out
    assert cli.main(["bench", "compare", old, slow, "--threshold", "0.25"]) == 0


def test_cli_needs_two_paths_and_something_in_common(tmp_path):
    with pytest.raises(SystemExit, match="OLD NEW"):
        cli.main(["bench", "compare", str(tmp_path)])
    a = _write(tmp_path / "a.jsonl", [_row(_draw(0), case="x")])
    b = _write(tmp_path / "b.jsonl", [_row(_draw(0), case="y")])
    assert cli.main(["bench", "compare", a, b]) == 2


def test_cli_names_a_side_without_bench_rows(tmp_path):
    new = _write(tmp_path / "new" / "bench.jsonl", [_row(_draw(0))])
    (tmp_path / "old").mkdir()
    with pytest.raises(SystemExit, match=r"OLD .*old.* holds no bench rows") as e:
        cli.main(["bench", "compare", str(tmp_path / "old"), new])
    assert "\n" not in str(e.value.code)
    with pytest.raises(SystemExit, match=r"NEW .*empty.jsonl.* holds no bench rows"):
        cli.main(["bench", "compare", new, _write(tmp_path / "empty.jsonl", [])])


def test_cli_rows_that_are_not_objects_are_a_clear_error(tmp_path):
    new = _write(tmp_path / "new.jsonl", [_row(_draw(0))])
    (tmp_path / "old.jsonl").write_text(json.dumps(_row(_draw(0))) + "\n[1, 2]\n")
    with pytest.raises(SystemExit, match=r"old\.jsonl:2: not a JSON object \(got a list\)"):
        cli.main(["bench", "compare", str(tmp_path / "old.jsonl"), new])


def test_latest_is_the_newest_by_timestamp_not_by_file_order():
    from speedlight.bench import compare

    row = dict(op="rms_norm", implementation="speedlight", case_id="c", mode="fwd")
    new = dict(row, timestamp="2026-12-04T16:00:00+00:00", median_us=1.0)
    old = dict(row, timestamp="2026-12-04T15:00:00+00:00", median_us=2.0)
    assert list(compare.latest([new, old]).values()) == [new]
