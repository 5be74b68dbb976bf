"""The command line, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def kvinject(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvinject", *args], capture_output=True, text=True, timeout=300)


def test_errors_lists_every_registered_model():
    from kvinject.error_models import REGISTRY

    out = kvinject("errors")
    assert out.returncode == 0
    for cls in REGISTRY.values():
        assert cls.syntax.split(":")[0] in out.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["generate", "hi", "--error", "gauss:1"], "unknown error model 'gauss'"),
        (["generate", "hi", "--error", "normal:0"], "needs a value for 'std'"),
        (["generate", "hi", "--cache-type-v", "q8_0", "--flash-attn", "off"], "needs flash attention"),
        (["generate", "hi", "--cache-type-k", "q3"], "not a cache type"),
        (["generate", "hi", "--layers", "x-1"], "bad --layers"),
        (["generate", "hi", "--model", "/nonexistent/model.gguf"], "model file not found"),
    ],
)
def test_bad_input_fails_with_a_clear_message(args, message):
    out = kvinject(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_generate_json_reports_text_and_realized_statistics(tiny_path):
    out = kvinject("generate", "Once upon a time", "-e", "none", "-e", "normal:0,0.5", "--target", "v", "-n", "4", "--format", "json", "--model", str(tiny_path))
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [r["error"] for r in results] == ["none", "normal:0,0.5"]
    control, noisy = results
    assert control["realized"]["k"]["values"] == 0 and noisy["realized"]["k"]["values"] == 0
    assert noisy["realized"]["v"]["rel_err_std"] == pytest.approx(0.5, rel=0.05)
    for key in ("values", "rel_err_mean", "rel_err_std", "sign_flip_frac", "snr_db"):
        assert key in noisy["realized"]["v"]
    assert isinstance(noisy["text"], str)
