"""A context whose decodes are recorded, to replay them into a clean one and compare what
reached the cache. Layer 0's K and V depend only on the token and its position (no earlier
injection reaches them), so whatever differs there from the clean replay is what the error
changed."""

from __future__ import annotations

import numpy as np

from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.error_models import parse_error

from .cache_state import read_cells

F32 = CacheOptions("f32", "f32", "on")


class Recorded:
    """A context whose decodes and forgotten sequences (and marked spans) are recorded, to replay
    them into a clean one."""

    def __init__(self, model, spec, target, n_seq=1, n_ctx=512, seed=3):
        self.model, self.n_seq, self.n_ctx = model, n_seq, n_ctx
        self.ctx = Context(model, F32, parse_error(spec), target, seed=seed, n_seq=n_seq, n_ctx=n_ctx)
        self.entries, self.events, self.marks = [], [], {}
        decode, forget, mark = self.ctx.decode, self.ctx.forget, self.ctx.mark
        self.ctx.decode = lambda entries: (self.entries.append(list(entries)), self.events.append(("decode", list(entries))), decode(entries))[2]
        self.ctx.forget = lambda seq: (self.events.append(("forget", seq)), forget(seq))[1]
        self.ctx.mark = lambda seq, spans: (self.marks.__setitem__(seq, spans), mark(seq, spans))[1]

    def changed(self, seq=0):
        """The positions of ``seq``'s cells and {component: which values of its layer-0 K or V,
        (cells, row), differ from a clean replay}."""
        with Context(self.model, F32, n_seq=self.n_seq, n_ctx=self.n_ctx) as clean:
            for event, arg in self.events:
                getattr(clean, event)(arg)
            pos, want = read_cells(clean, seq)
        got_pos, got = read_cells(self.ctx, seq)
        assert np.array_equal(pos, got_pos)
        return pos, {c: got[c, 0] != want[c, 0] for c in "kv"}

    def differing(self, seq=0):
        """{component: positions whose layer-0 K or V differ from a clean replay} and all positions."""
        pos, changed = self.changed(seq)
        return {c: set(pos[changed[c].any(axis=1)].tolist()) for c in "kv"}, set(pos.tolist())

    def close(self):
        self.ctx.close()


def prefill_and_step(rec, tokens, steps=4):
    """The prompt in one decode, then fixed tokens one at a time (no greedy pick: the same tokens as the replay)."""
    rec.ctx.prefill(tokens)
    for i in range(steps):
        rec.ctx.decode([(tokens[i], len(tokens) + i, 0, True)])
    return len(tokens) + steps


def assert_selecting_everything_changes_nothing(model, error, targets, prompts):
    """Each of ``targets`` (selections of every value, the first none) gives the first's caches,
    logits and realized statistics bit for bit, with sequences sharing decodes; and the whole of
    it counts as selected."""
    out = []
    for target in targets:
        with Context(model, F32, parse_error(error), target, seed=4, n_seq=2, n_ctx=512) as ctx:
            tokens = [model.tokenize(p) for p in prompts]
            logits = [gen.logits for _, gen in generate_all(ctx, tokens, max_tokens=5, items=range(len(prompts)), keep_logits=True)]
            caches = [read_cells(ctx, seq)[1] for seq in (0, 1)]
            out.append((logits, caches, ctx.realized.summary()))
    (logits, caches, realized), *selections = out
    for got_logits, got_caches, got_realized in selections:
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(logits, got_logits))
        for seq in (0, 1):
            assert all(np.array_equal(caches[seq][site], got_caches[seq][site], equal_nan=True) for site in caches[seq])
        assert repr({c: got_realized[c] for c in "kv"}) == repr(realized)  # repr: NaN equals NaN
        assert repr(got_realized["selection"]["selected"]) == repr(realized)
        assert all(got_realized["selection"]["other"][c]["values"] == 0 for c in "kv")
