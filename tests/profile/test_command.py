"""`speedlight profile` end to end on the CPU: terminal output, JSON, HTML, and errors."""

import json

import pytest

from speedlight import cli
from speedlight.profile import schema
from tests.profile.conftest import QUICK

CALLABLE = '''
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    return model, torch.randn(4, 32)
'''


@pytest.mark.parametrize("run", ["infer_run", "train_run"])
def test_writes_a_json_document_that_follows_the_schema(run, request):
    r = request.getfixturevalue(run)
    doc = r["doc"]
    assert schema.check(doc) == []
    assert doc["run"]["mode"] == ("train" if run == "train_run" else "infer")
    assert doc["environment"]["runtime"] == "cpu-interpreter" and doc["measured"]["time"] == "cpu"
    assert doc["measured"]["floors"] == "projected" and doc["target"]["key"] == "h200"
    assert "no GPU" in doc["measured"]["note"]
    phases = {row["phase"] for row in doc["rows"]}
    assert phases == ({"forward", "backward", "optimizer"} if run == "train_run" else {"forward"})
    s = doc["summary"]
    assert s["op_time_s"] > 0 and s["floor_s"] > 0 and s["flops"] > 0
    assert s["uncounted"]["ops"] == 0, s["uncounted"]["names"]
    assert all(row["distance"] is None for row in doc["rows"]), "no distance across devices"
    assert {g["key"] for g in doc["by_phase"]} == phases
    assert sum(g["time_s"] for g in doc["by_type"]) == pytest.approx(s["op_time_s"])


def test_train_profile_has_more_flops_than_forward(train_run, infer_run):
    # a training step's matmuls are about three forwards
    ratio = train_run["doc"]["summary"]["flops"] / infer_run["doc"]["summary"]["flops"]
    assert 2.5 < ratio < 3.5


def test_html_page_has_both_charts_and_the_tables(train_run):
    page = train_run["html"].read_text()
    assert page.count("<svg") >= 2
    for heading in ("Roofline", "Time breakdown", "What to fuse", "Top ops by time", "Memory"):
        assert heading in page
    assert "swiglu" in page and "NVIDIA H200" in page


def test_terminal_output(tmp_path, capsys):
    assert cli.main(["profile", *QUICK, "--out", str(tmp_path), "--no-html", "--target", "a100"]) == 0
    out = capsys.readouterr().out
    for text in ("speedlight profile", "summary, per step", "top ops by time", "by op type",
                 "memory at the peak", "what to fuse", "NVIDIA A100", "launch gaps"):
        assert text in out
    assert not list(tmp_path.glob("*.html"))
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["target"]["key"] == "a100-sxm"


def test_a_users_callable(tmp_path):
    path = tmp_path / "mymodel.py"
    path.write_text(CALLABLE)
    code = cli.main(["profile", "--model", f"{path}:build", "--train", "--warmup", "1", "--steps", "1",
                     "--out", str(tmp_path), "--no-html"])
    assert code == 0
    doc = json.loads((tmp_path / "profile-build-train.json").read_text())
    modules = {row["module"] for row in doc["rows"] if row["name"] == "addmm"}
    assert modules == {"0", "2"}


def test_a_config_json(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert cli.main(["profile", "--model", str(path), *QUICK, "--out", str(tmp_path), "--no-html"]) == 0
    doc = json.loads(next(tmp_path.glob("profile-*.json")).read_text())
    assert doc["model"]["hidden_size"] == 64 and doc["model"]["num_hidden_layers"] == 1


@pytest.mark.parametrize("argv,message", [
    (["--model", "llama-9000"], "not a model name"),
    (["--model", "missing.json"], "no such config file"),
    (["--model", "no_such_module_here:build"], "cannot import"),
    (["--model", "json:nothing_called_this"], "has no callable"),
    (["--target", "h999"], "is not a known GPU; --target takes SKUs: a100-sxm"),
    (["--batch", "0"], "at least 1"),
], ids=["name", "config", "module", "callable", "target", "batch"])
def test_bad_arguments_are_clear_errors(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        cli.main(["profile", *argv, "--out", str(tmp_path)])
