"""The Llama-shaped models of random quantized blocks that speed measurements write
(tests/tiny_model.py): their blocks dequantize to the spread asked for, and, written small through
the same path, they load in llama.cpp with the shape, vocabulary and tensor types written,
tokenize ordinary text as the default model does and decode to finite logits."""

from __future__ import annotations

from dataclasses import replace

import gguf
import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.model import Model

from .tiny_model import LLAMA31_8B, LLAMA32_1B, RANDOM_BLOCKS, Q, llama3_rope_factors, main, random_blocks, write_model

TEXT = "The quick brown fox jumps over the lazy dog, and 1847 railways reached the town."
FILLER = 3000  # tokens added to the default model's tokenizer (49152)


@pytest.mark.parametrize("qtype", list(RANDOM_BLOCKS), ids=lambda q: q.name)
def test_random_blocks_dequantize_to_mean_zero_and_the_spread_asked_for(qtype):
    blocks = random_blocks(qtype, 0.05, 1 << 20, np.random.default_rng(1))
    assert blocks.dtype == np.uint8 and blocks.nbytes % gguf.GGML_QUANT_SIZES[qtype][1] == 0
    values = gguf.quants.dequantize(blocks, qtype)
    assert np.isfinite(values).all()
    assert values.std() == pytest.approx(0.05, rel=0.01)
    assert abs(values.mean()) < 0.01 * 0.05
    assert len(np.unique(values)) > 100  # random values, not a few repeated


# Llama-3.1-8B's and Llama-3.2-1B's tensor types, vocabulary padding and RoPE scaling, small: a
# separate Q6_K output layer and head_dim 128, and a tied Q6_K embedding and head_dim 64.
SMALL = {
    "8b": replace(LLAMA31_8B, n_layer=2, n_embd=256, n_head=2, n_head_kv=1, head_dim=128, n_ff=512),
    "1b": replace(LLAMA32_1B, n_layer=3, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768),
}


@pytest.fixture(scope="module")
def small(tmp_path_factory, default_model_path, tiny):
    """SMALL's shapes with the default model's tokenizer and FILLER tokens more, written."""
    folder = tmp_path_factory.mktemp("shapes")
    shapes = {name: replace(shape, n_vocab=tiny.n_vocab + FILLER) for name, shape in SMALL.items()}
    return {name: (shape, write_model(folder / f"{name}.gguf", default_model_path, shape, seed=3)) for name, shape in shapes.items()}


def test_a_llama_shape_of_random_blocks_has_the_tensors_and_vocabulary_asked_for(small):
    shape, path = small["8b"]  # every kind of tensor: the 1b's are the same less output.weight
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    types = {name: t.tensor_type for name, t in tensors.items()}
    assert types["token_embd.weight"] == Q.Q4_0 and types["output.weight"] == Q.Q6_K and types["output_norm.weight"] == Q.F32
    matrices = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    assert {types[f"blk.{i}.{m}.weight"] for i in range(shape.n_layer) for m in matrices} == {Q.Q4_0}
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q4_0
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == shape.n_vocab and tokens[-1] == f"<|reserved_special_token_{FILLER - 1}|>"
    assert reader.fields["tokenizer.ggml.token_type"].contents()[-FILLER:] == [gguf.TokenType.CONTROL] * FILLER
    factors = tensors["rope_freqs.weight"].data
    assert np.array_equal(factors, llama3_rope_factors(shape.head_dim, 500000.0, shape.rope_scaling))
    assert factors[0] == 1 and factors[-1] == shape.rope_scaling and (np.diff(factors) >= 0).all() and len(np.unique(factors)) > 3
    for tensor, fan_in in [("blk.0.ffn_down.weight", shape.n_ff), ("blk.1.attn_q.weight", shape.n_embd), ("output.weight", shape.n_embd)]:
        w = gguf.quants.dequantize(tensors[tensor].data, types[tensor])
        assert w.shape[-1] == fan_in and w.std() == pytest.approx(fan_in**-0.5, rel=0.05), tensor
    assert not np.array_equal(tensors["blk.0.ffn_up.weight"].data, tensors["blk.0.ffn_gate.weight"].data)


@pytest.mark.parametrize("name", SMALL)
def test_a_llama_shape_of_random_blocks_loads_tokenizes_and_decodes(name, small, tiny):
    shape, path = small[name]
    with Model(str(path)) as model:
        assert (model.n_layer, model.n_embd, model.n_head, model.n_head_kv, model.head_dim_k) == (
            shape.n_layer,
            shape.n_embd,
            shape.n_head,
            shape.n_head_kv,
            shape.head_dim,
        )
        assert model.n_vocab == tiny.n_vocab + FILLER and model.n_ctx_train == 131072 and model.rope.base == 500000.0
        prompt = model.tokenize(TEXT)
        assert prompt == tiny.tokenize(TEXT) and max(prompt) < tiny.n_vocab
        assert model.tokenize("<|reserved_special_token_7|>", add_special=False) == [tiny.n_vocab + 7]
        with Context(model, n_ctx=64) as ctx:
            ctx.prefill(prompt)
            rows = [ctx.logits(-1).copy()]
            for pos in range(len(prompt), len(prompt) + 3):
                ctx.decode([(int(np.argmax(rows[-1])), pos, 0, True)])
                rows.append(ctx.logits(-1).copy())
    rows = np.array(rows)
    assert rows.shape == (4, shape.n_vocab) and np.isfinite(rows).all()
    assert (rows.std(axis=1) > 0.1).all() and not np.array_equal(rows[0], rows[1])


def test_the_command_writes_a_named_shape(tmp_path, default_model_path, monkeypatch, capsys):
    out = tmp_path / "tiny.gguf"
    monkeypatch.setattr("sys.argv", ["tiny_model", "tiny", str(out), "--tokenizer", str(default_model_path), "--seed", "2"])
    main()
    assert capsys.readouterr().out.startswith(f"{out}: {out.stat().st_size / 1e9:.3f} GB in ")
    with Model(str(out)) as model:
        assert (model.n_layer, model.n_embd) == (2, 256)
