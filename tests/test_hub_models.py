"""`--model hf:OWNER/REPO/FILE.gguf`, tested with a local Hugging Face cache: nothing downloads here."""

from __future__ import annotations

import huggingface_hub
import huggingface_hub.constants
import pytest

from kvinject.engine.model import resolve_model
from kvinject.exceptions import ModelError


def offline(**kwargs):
    raise OSError("no network here")


def test_a_downloaded_file_is_used_without_asking_the_hub(tmp_path, tiny_path, monkeypatch):
    """Laid out as huggingface_hub caches a download (refs/main names the snapshot), the file is
    found with the Hub unreachable, without asking it first (half a minute of retries offline)."""
    repo = tmp_path / "models--owner--repo"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123abcd")
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").symlink_to(tiny_path)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    assert resolve_model("hf:owner/repo/tiny.gguf") == snapshot / "tiny.gguf"
    with pytest.raises(ModelError, match=r"^could not get hf:owner/repo/other.gguf from the Hugging Face Hub: no network here$"):
        resolve_model("hf:owner/repo/other.gguf")
