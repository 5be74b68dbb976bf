"""llama.cpp's flash attention reads an f32 cache as f16: 'auto' keeps an f32 cache exact."""

import numpy as np

from kvinject.engine.context import Context
from kvinject.engine.options import FLASH_ATTN, CacheOptions

PROMPT = "The quick brown fox jumps over the lazy dog because it wants to see what lies beyond the hill."


def last_logits(model, cache: CacheOptions) -> np.ndarray:
    with Context(model, cache, n_ctx=128) as ctx:
        ctx.prefill(model.tokenize(PROMPT))
        return ctx.logits(-1).copy()


def test_flash_attention_computes_an_f32_cache_as_f16_so_auto_turns_it_off(tiny):
    # llama.cpp casts an f32 K and V to f16 before its flash-attention kernel (build_attn_mha).
    assert np.array_equal(last_logits(tiny, CacheOptions("f32", "f32", "on")), last_logits(tiny, CacheOptions("f16", "f16", "on")))
    assert CacheOptions("f32", "f32").flash_attn_type == CacheOptions("f32", "f16").flash_attn_type == FLASH_ATTN["off"]
    assert CacheOptions("f32", "q8_0").flash_attn_type == FLASH_ATTN["on"], "a quantized V needs flash attention"
    assert CacheOptions("f16", "f16").flash_attn_type == FLASH_ATTN["auto"]
    auto = last_logits(tiny, CacheOptions("f32", "f32"))
    assert np.array_equal(auto, last_logits(tiny, CacheOptions("f32", "f32", "off")))
    assert not np.array_equal(auto, last_logits(tiny, CacheOptions("f16", "f16", "off"))), "f32 is not f16 without flash attention"
