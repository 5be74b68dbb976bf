"""Layer-wise divergence: each layer's output read from the graph, and its distance from a reference's."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.engine.target import Target
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import SpecError
from kvinject.experiments.divergence import divergence, text_prompts

from .tiny_model import HEAD_DIM, N_HEAD, N_HEAD_KV

PROMPTS = ["One two three four five six seven", "The capital of France is"]
F32 = CacheOptions("f32", "f32", "off")


def run(tiny, reference, configs, max_tokens=6):
    return divergence(
        tiny, Configuration.parse(reference), [Configuration.parse(c) if isinstance(c, str) else c for c in configs], text_prompts(tiny, PROMPTS, max_tokens)
    )


def missing(item, n_layer):
    """Where no distance exists: the last layer's output before the prompt's last token."""
    mask = np.zeros((n_layer, item.prompt_tokens + len(item.tokens)), bool)
    mask[-1, : item.prompt_tokens - 1] = True
    return mask


def test_no_error_against_itself_is_exactly_zero(tiny):
    result = run(tiny, "none", ["none", "normal:0,0"])
    assert [len(i.tokens) for i in result.items] == [6, 6]
    for item in result.items:
        for d in item.distances:
            assert d.shape == (tiny.n_layer, item.prompt_tokens + 6)
            assert (np.isnan(d) == missing(item, tiny.n_layer)).all()
            assert (d[np.isfinite(d)] == 0).all()
    (same,) = run(tiny, "recompute@f32", ["recompute@f32"]).summary("all")
    assert (same["max"] == 0).all()


def test_error_in_one_layer_leaves_the_layers_before_it_unchanged(tiny):
    late = Configuration.parse("normal:0,0.5", Target.parse("kv", "1"))
    (item,) = run(tiny, "none", [late], max_tokens=4).items[:1]
    d = item.distances[0]
    assert (d[0] == 0).all()  # layer 0 cannot see layer 1's K/V
    assert (d[1, item.prompt_tokens - 1 :] > 0).all()  # the last layer: where logits are computed


def test_error_on_generated_tokens_leaves_the_prompt_unchanged(tiny):
    generated = Configuration.parse("normal:0,0.5", Target.parse("kv", None, "generated"))
    result = run(tiny, "none", [generated], max_tokens=4)
    for item in result.items:
        d, n = item.distances[0], item.prompt_tokens
        assert (np.nan_to_num(d[:, :n]) == 0).all()
        assert (d[:, n:] > 0).all()


def test_f32_cache_against_recompute_is_measured(tiny):
    result = run(tiny, "recompute@f32", ["none@f32", "none@f16"])
    for item in result.items:
        for d in item.distances:
            assert (np.isnan(d) == missing(item, tiny.n_layer)).all()
            assert (d[np.isfinite(d)] >= 0).all()
            assert np.nanmax(d) < 0.05  # same tokens at the same positions: rounding, not a misalignment
    for span in ("generated", "prompt", "all"):
        summary = result.summary(span)
        assert len(summary) == 2 and all(s["mean"].shape == s["max"].shape == (tiny.n_layer,) for s in summary)
        assert all(np.isfinite(s["max"]).all() for s in summary)
    data = json.loads(json.dumps(result.to_dict("all")))
    assert data["configurations"] == ["none @f32", "none"] and data["reference"] == "recompute @f32"
    assert len(data["items"][0]["distance"]["none @f32"][0]) == result.items[0].prompt_tokens + 6
    offsets, grids = result.by_position("all")
    assert offsets[0] == -max(i.prompt_tokens for i in result.items) and offsets[-1] == 5
    assert all(g.shape == (tiny.n_layer, len(offsets)) for g in grids)


def test_reading_the_residual_stream_changes_no_logits(tiny):
    tokens = tiny.tokenize(PROMPTS[0])
    for spec in ("none", "normal:0,0.3"):
        config = Configuration.parse(spec)
        logits = []
        for residual in (False, True):
            with Context(tiny, config.cache, config.error, seed=3, residual=residual) as ctx:
                ((_, gen),) = generate_all(ctx, [tokens], 8, keep_logits=True)
                logits.append(gen.logits)
        assert np.array_equal(logits[0], logits[1])


def _rms(x):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-5)  # the tiny model's norm weights are ones


def _rope(x, positions):
    """llama.cpp's normal RoPE (adjacent pairs), base 10000, over (tokens, heads, head_dim)."""
    theta = positions[:, None] * 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return out


def _layer0(weights, tokens):
    """The tiny model's first layer in numpy, float64: its output at every position."""
    x = weights["token_embd.weight"][tokens]
    n = len(tokens)
    h = _rms(x)
    q = _rope((h @ weights["blk.0.attn_q.weight"].T).reshape(n, N_HEAD, HEAD_DIM), np.arange(n))
    k = _rope((h @ weights["blk.0.attn_k.weight"].T).reshape(n, N_HEAD_KV, HEAD_DIM), np.arange(n))
    v = (h @ weights["blk.0.attn_v.weight"].T).reshape(n, N_HEAD_KV, HEAD_DIM)
    group = N_HEAD // N_HEAD_KV
    heads = []
    for hd in range(N_HEAD):
        scores = q[:, hd] @ k[:, hd // group].T / np.sqrt(HEAD_DIM) + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append((p / p.sum(axis=1, keepdims=True)) @ v[:, hd // group])
    x = x + np.concatenate(heads, axis=1) @ weights["blk.0.attn_output.weight"].T
    h = _rms(x)
    gate, up = h @ weights["blk.0.ffn_gate.weight"].T, h @ weights["blk.0.ffn_up.weight"].T
    return x + (gate / (1 + np.exp(-gate)) * up) @ weights["blk.0.ffn_down.weight"].T


def test_the_outputs_read_are_the_layers_outputs(tiny, tiny_path):
    """Layer 0 at every position against a numpy forward pass, the last layer through the logits
    llama.cpp computes from it (final norm, then the tied embedding)."""
    weights = {t.name: np.asarray(t.data, np.float64) for t in gguf.GGUFReader(tiny_path).tensors}
    tokens = tiny.tokenize(PROMPTS[0])
    with Context(tiny, F32, n_ctx=64, residual=True) as ctx:
        ctx.decode([(t, i, 0, True) for i, t in enumerate(tokens)])
        outputs = ctx.residual.read().astype(np.float64)
        logits = ctx.output_logits(len(tokens)).astype(np.float64)
    first = _layer0(weights, tokens)
    assert (np.linalg.norm(outputs[0] - first, axis=1) / np.linalg.norm(first, axis=1)).max() < 1e-2
    mine = _rms(outputs[-1]) @ weights["token_embd.weight"].T
    assert np.abs(mine - logits).max() < 1e-2 * np.abs(logits).max()
    # The check can fail: the next position's output, or the layer after, is far off.
    assert (np.linalg.norm(outputs[0, 1:] - first[:-1], axis=1) / np.linalg.norm(first[:-1], axis=1)).min() > 0.1
    assert (np.linalg.norm(outputs[1] - first, axis=1) / np.linalg.norm(first, axis=1)).min() > 0.1


def test_last_layer_exists_only_where_logits_are_computed(tiny):
    tokens = tiny.tokenize(PROMPTS[0])
    with Context(tiny, F32, n_ctx=64, residual=True) as ctx:
        ctx.decode([(t, i, 0, i in (2, len(tokens) - 1)) for i, t in enumerate(tokens)])
        outputs = ctx.residual.read()
    assert np.isfinite(outputs[:-1]).all()
    assert [bool(np.isfinite(row).all()) for row in outputs[-1]] == [i in (2, len(tokens) - 1) for i in range(len(tokens))]


def test_divergence_needs_a_configuration(tiny):
    with pytest.raises(SpecError, match="at least one configuration"):
        run(tiny, "none", [])


def test_command_prints_the_table_writes_json_and_heatmap(tmp_path, tiny_path):
    out, png = tmp_path / "d.json", tmp_path / "d.png"
    args = [
        "--model",
        tiny_path,
        "--prompt",
        PROMPTS[1],
        "--max-tokens",
        "4",
        "-e",
        "none@f32",
        "-e",
        "none",
        "--output",
        out,
        "--heatmap",
        png,
        "--span",
        "all",
    ]
    done = subprocess.run([sys.executable, "-m", "kvinject", "divergence", *map(str, args)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "recompute @f32" in done.stdout and "none @f32" in done.stdout
    data = json.loads(out.read_text())
    assert data["span"] == "all" and list(data["summary"]) == ["none @f32", "none"]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(
    "args,message",
    [
        (["-e", "none", "--bench", "perplexity"], "perplexity generates nothing"),
        (["-e", "none", "--prompt", "x", "--limit", "2"], "--prompt gives the prompts as text"),
        (["-e", "none", "--span", "middle"], "--span must be one of generated, prompt, all"),
        (["-e", "none", "--heatmap", "/nonexistent/d.png"], "cannot write /nonexistent/d.png"),
    ],
)
def test_command_refuses_bad_input_in_one_line(args, message):
    done = subprocess.run([sys.executable, "-m", "kvinject", "divergence", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
