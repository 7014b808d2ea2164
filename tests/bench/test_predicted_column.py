"""bench --predict: each speedlight row gets the predicted time the CLI's predictor gives
(inspect's, handed in), fwd+bwd the sum, labelled predicted in the table and the file."""

from types import SimpleNamespace

from rich.console import Console

from speedlight import results
from speedlight.bench import display
from speedlight.bench.command import _add_predictions
from speedlight.ops import rms_norm


def _row(mode, median=10.0):
    case = {"op": "rms_norm", "params": {"rows": 8, "hidden": 64}, "dtype": "bf16",
            "layout": "contiguous", "flags": {}, "seed": 0}
    return {"tool": "bench", "op": "rms_norm", "implementation": "speedlight", "mode": mode,
            "case_id": "rms_norm-rows8-hidden64-bf16", "case_label": "rows8-hidden64",
            "case": case, "dtype": "bf16", "status": "ok", "median_us": median, "p20_us": median,
            "p80_us": median, "verified": True, "gbps": 1.0, "tflops": 0.0,
            "family": "memory-bound"}


def test_rows_get_the_predicted_time_per_mode(tmp_path):
    asked = []

    def predictor(spec, case, target):
        asked.append((spec.name, case.id))
        return {"fwd": {"us": 3.0, "bound": "memory", "sku": "NVIDIA H200"},
                "bwd": {"us": 5.0, "bound": "latency", "sku": "NVIDIA H200"}}

    rows = [_row("fwd"), _row("bwd"), _row("fwd+bwd"), dict(_row("fwd"), implementation="torch-eager")]
    tgt = SimpleNamespace(sku=SimpleNamespace(name="NVIDIA H200"))
    _add_predictions(rows, [rms_norm.SPEC], tgt, predictor, tmp_path, Console(file=None, quiet=True))
    assert asked == [("rms_norm", "rms_norm-rows8-hidden64-bf16")]  # once per case
    assert [r.get("predicted", {}).get("us") for r in rows] == [3.0, 5.0, 8.0, None]
    assert rows[2]["predicted"]["bound"] == "latency" and rows[0]["predicted"]["predicted"]
    written = results.read_jsonl(tmp_path / "predicted.jsonl")
    assert [w["us"] for w in written] == [3.0, 5.0, 8.0]
    console = Console(width=250, record=True)
    console.print(display.results_table(rows, "t"))
    assert "predicted on NVIDIA H200" in console.export_text()


def test_a_case_the_model_cannot_predict_says_why(tmp_path):
    rows = [_row("fwd")]
    tgt = SimpleNamespace(sku=SimpleNamespace(name="NVIDIA H200"))
    _add_predictions(rows, [rms_norm.SPEC], tgt,
                     lambda *a: {"fwd": {"why": "iterations unknown", "kernels": []}}, tmp_path,
                     Console(quiet=True))
    assert rows[0]["predicted"] == {"why": "iterations unknown", "predicted": True}
