"""Profile tests: small models, one CPU thread (the shared CI machine is oversubscribed
otherwise), and one run of `speedlight profile` per mode shared by the tests reading it."""

import json
from pathlib import Path

import pytest
import torch

from speedlight import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "relu_squared.py"
QUICK = ["--batch", "1", "--seq", "16", "--warmup", "1", "--steps", "1"]


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _run(tmp_path_factory, *extra):
    out = tmp_path_factory.mktemp("profile")
    code = cli.main(["profile", *QUICK, "--out", str(out), *extra])
    assert code == 0
    mode = "train" if "--train" in extra else "infer"
    stem = out / f"profile-llama-tiny-{mode}"
    return {"doc": json.loads(stem.with_suffix(".json").read_text()), "json": stem.with_suffix(".json"),
            "html": stem.with_suffix(".html")}


@pytest.fixture(scope="package")
def train_run(tmp_path_factory):  # with a team's own op: profile's advice reads its specs
    return _run(tmp_path_factory, "--train", "--spec", str(EXAMPLE))


@pytest.fixture(scope="package")
def infer_run(tmp_path_factory):
    return _run(tmp_path_factory)
