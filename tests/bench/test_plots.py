import pytest

from speedlight.bench import plots

pytest.importorskip("matplotlib")


def _row(impl, case, nbytes, seconds, mode="fwd", **extra):
    return {"tool": "bench", "status": "ok", "op": "toy", "dtype": "bf16", "mode": mode,
            "implementation": impl, "case_id": f"toy-{case}-bf16", "case_label": case,
            "bytes": nbytes, "flops": nbytes // 4, "gbps": nbytes / seconds / 1e9,
            "tflops": nbytes / 4 / seconds / 1e12, "family": "memory-bound",
            "sol_bound": "memory", "sol_bandwidth": 4.3e12, "sol_roof": "measured",
            "device": "NVIDIA H200", "representative": True, **extra}


ROWS = [_row(i, c, n, s * f) for c, n, s in (("rows1", 8192, 2e-6), ("rows4096", 2**26, 20e-6),
                                            ("rows512", 2**22, 4e-6))
        for i, f in (("speedlight", 1.0), ("torch-eager", 2.0), ("liger", 1.3))]


def test_one_line_per_implementation_and_the_ceiling():
    fig = plots.figure(ROWS, "toy")
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:3] == ["speedlight", "torch-eager", "liger"]
    assert labels[3].startswith("ceiling (measured): 4300")
    # x follows bytes moved: rows1, rows512, rows4096; y is GB/s from the rows
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rows1", "rows512", "rows4096"]
    ours = ax.get_lines()[0]
    assert list(ours.get_ydata()) == pytest.approx([8192 / 2e-6 / 1e9, 2**22 / 4e-6 / 1e9,
                                                    2**26 / 20e-6 / 1e9])
    assert "GB/s" in ax.get_ylabel()


def test_files_written_per_op_dtype_and_mode(tmp_path):
    rows = ROWS + [_row("speedlight", "rows1", 8192, 3e-6, mode="fwd+bwd")]
    paths = plots.plot(rows, tmp_path)
    assert sorted(p.name for p in paths) == ["toy-bf16-fwd.png", "toy-bf16-fwd_bwd.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_compute_bound_ops_plot_tflops_and_cpu_rows_say_so():
    rows = [dict(r, sol_bound="compute", sol_peak_flops=989e12, sol_peak="bf16",
                 representative=False) for r in ROWS]
    ax = plots.figure(rows, "toy").axes[0]
    assert "TFLOP/s" in ax.get_ylabel() and "NOT representative" in ax.get_title()
    assert ax.get_lines()[-1].get_label().startswith("ceiling (measured bf16): 989")
