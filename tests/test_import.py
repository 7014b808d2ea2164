import os
import subprocess
import sys


def _run(code: str, tmp_path):
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_import_compiles_nothing_touches_no_gpu_prints_nothing(tmp_path):
    code = ("import torch\n"
            "import speedlight, speedlight.nn, speedlight.registry\n"
            "speedlight.registry.builtin_specs()\n"
            "assert not torch.cuda.is_initialized(), 'CUDA was initialised at import'\n"
            "import speedlight.tuning\n"
            "assert speedlight.tuning._LOADED == {}, 'a tuned table was read at import'\n")
    out = _run(code, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "" and out.stderr == ""
    cache = tmp_path / "triton-cache"
    assert not cache.exists() or not any(cache.iterdir()), "a kernel was compiled at import"


def test_top_level_import_loads_no_ops(tmp_path):
    out = _run("import sys, speedlight\n"
               "print(sorted(m for m in sys.modules if m.startswith('speedlight.ops')))", tmp_path)
    assert out.stdout.strip() == "[]", out.stderr


def test_interpreter_set_after_triton_was_imported_is_speedlight_s_message(tmp_path):
    """The notebook order: something imports triton (transformers does), then the user sets
    TRITON_INTERPRET=1 and calls an op on CPU tensors. triton.language's functions are then
    compiled ones the interpreter cannot call: the error says what to do, not Triton's
    "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    code = ("import os, triton, torch\n"
            "os.environ['TRITON_INTERPRET'] = '1'\n"
            "import speedlight\n"
            "speedlight.rms_norm(torch.randn(4, 8), torch.ones(8))\n")
    out = _run(code, tmp_path)
    assert out.returncode != 0
    assert "triton itself was imported before TRITON_INTERPRET=1" in out.stderr, out.stderr[-2000:]
    assert "outside of the scope of a kernel" not in out.stderr
