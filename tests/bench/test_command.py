"""`speedlight bench` and `speedlight probe` end to end on the CPU."""

import os

import pytest

from speedlight import cli, results
from tests.conftest import ON_GPU


@pytest.mark.skipif(ON_GPU, reason="checks the CPU labelling")
def test_bench_quick_softmax_on_cpu_is_labelled_not_representative(tmp_path, capsys):
    code = cli.main(["bench", "--suite", "quick", "--ops", "softmax", "--dtypes", "fp32",
                     "--baselines", "torch-eager,liger", "--time-cap", "0.01",
                     "--max-samples", "3", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "speedlight bench" in out and "NOT representative" in out.split("\n\n")[1]
    assert out.count("NOT representative") >= 3  # banner, table title, footer
    rows = results.read_jsonl(tmp_path / "bench.jsonl")
    assert rows and all(r["representative"] is False for r in rows)
    ours = [r for r in rows if r["implementation"] == "speedlight"]
    timed = [r for r in ours if r["status"] == "ok"]
    assert len(timed) >= 30 and all(r["verified"] for r in timed)
    assert {r["mode"] for r in timed} == {"fwd", "bwd", "fwd+bwd"}
    empty = [r for r in ours if r["case"]["params"]["rows"] == 0]
    assert empty and all(r["status"] == "skip" and "empty" in r["reason"] for r in empty)
    # Liger is not run on the CPU, and every row says so
    liger = [r for r in rows if r["implementation"] == "liger"]
    assert liger and all(r["status"] in ("unavailable", "skip") and r["reason"] for r in liger)

    pytest.importorskip("matplotlib")
    assert cli.main(["bench", "plot", str(tmp_path)]) == 0
    assert len(list((tmp_path / "plots").glob("softmax-fp32-*.png"))) == 3
    assert cli.main(["bench", "compare", str(tmp_path), str(tmp_path)]) == 0


@pytest.mark.skipif(ON_GPU, reason="checks what probe does without a GPU")
def test_probe_without_a_gpu_exits_2_and_caches_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPEEDLIGHT_CACHE", str(tmp_path))
    assert cli.main(["probe"]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "nothing was measured or cached" in err
    assert not any(tmp_path.iterdir())


def test_bad_arguments_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="--modes"):
        cli.main(["bench", "--modes", "sideways", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown baseline"):
        cli.main(["bench", "--baselines", "numpy", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="unknown op"):
        cli.main(["bench", "--ops", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no timed rows"):
        (tmp_path / "bench.jsonl").write_text("")
        cli.main(["bench", "plot", str(tmp_path / "bench.jsonl")])


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_output_location_that_cannot_be_written_fails_before_any_work(where, tmp_path,
                                                                          monkeypatch):
    from speedlight.bench import runner
    monkeypatch.setattr(runner.Bench, "run", lambda *a, **k: pytest.fail("work started"))
    (tmp_path / "f").write_text("not a folder")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "sub"
    with pytest.raises(SystemExit, match=r"speedlight bench: --out .*f.* (is a file|not a "
                                         r"folder|cannot)") as e:
        cli.main(["bench", "--ops", "softmax", "--suite", "quick", "--out", str(out)])
    assert "\n" not in str(e.value.code)


def test_a_read_only_output_folder_fails_before_any_work(tmp_path, monkeypatch):
    from speedlight.bench import runner
    monkeypatch.setattr(runner.Bench, "run", lambda *a, **k: pytest.fail("work started"))
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # root writes anyway: refuse as for others

        def denied(*args, **kwargs):
            raise PermissionError(13, "Permission denied")
        monkeypatch.setattr(results.tempfile, "TemporaryFile", denied)
    try:
        with pytest.raises(SystemExit, match=r"speedlight bench: --out .*ro.* cannot be "
                                             r"written: Permission denied"):
            cli.main(["bench", "--ops", "softmax", "--suite", "quick", "--out", str(out)])
    finally:
        out.chmod(0o700)


def test_a_bad_case_pattern_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match=r"speedlight bench: --cases '\(' is not a regular "
                                         r"expression: missing \)"):
        cli.main(["bench", "--ops", "softmax", "--cases", "(", "--out", str(tmp_path)])


def test_the_results_table_names_every_baseline_column():
    """A run with the default baselines has rows for the attention-only ones too (as
    'unavailable' for other ops): the table gives each its column instead of failing."""
    from speedlight.bench import display

    row = {"op": "relu_squared", "case_id": "c", "dtype": "fp32", "mode": "fwd",
           "status": "skip", "reason": "too large"}
    rows = [dict(row, implementation=impl) for impl in ("speedlight", "torch-eager", "sdpa-flash")]
    table = display.results_table(rows, "t")
    headers = [c.header for c in table.columns]
    assert "x eager" in headers and "x sdpa-flash" in headers


def test_probe_matmul_ceiling_is_the_best_of_its_shapes(monkeypatch):
    """The ceiling every % of SOL divides by is the best rate over the probe's shapes (a
    single cube, measured alone, came out below what bench then measured for cuBLAS on
    Llama's projections on an H200)."""
    from speedlight.bench import probe

    rates = {(8192, 8192, 8192): 6.6e14, (4096, 14336, 4096): 7.6e14, (4096, 4096, 14336): 7.9e14}
    monkeypatch.setattr(probe, "_matmul_rate",
                        lambda device, dtype, m, n, k, rule: probe.Reading(
                            dtype, rates[(m, n, k)], size=f"{m}x{n}x{k}"))
    best = probe.matmul_rate(None, "bf16")
    assert (best.value, best.size) == (7.9e14, "4096x4096x14336")
    assert "best of 3 shapes" in best.note
    one = probe.matmul_rate(None, "bf16", shapes=((8192, 8192, 8192),))
    assert one.value == 6.6e14
