"""Perplexity computed as llama.cpp's llama-perplexity computes it, so the numbers compare.

The text is tokenized once (special tokens added as the model asks, not parsed), cut into
chunks of n_ctx tokens (the first replaced by BOS when the model adds one), each chunk is
evaluated from an empty cache, and only its second half is scored: positions n_ctx/2 to
n_ctx-2 predicting the next token. PPL = exp(mean NLL) over all scored tokens.

Against the control's logits, computed in the same invocation and held one chunk at a time
(never written to disk), it also reports llama-perplexity --kl-divergence's statistics:
mean KL divergence, "same top p" (argmax agreement) and RMS Δp (difference of the
probability of the correct token).

With ``step`` the first half of each chunk is decoded at once and the scored half STEP tokens a
decode, so that a compressor acting on the cache between decodes (KIVI's quantized groups,
eviction) changes what the scored tokens attend to, as StreamingLLM and KIVI measure
perplexity with a cache. A chunk in one decode never reads its own cache after a compressor
has acted, so KIVI and eviction leave llama-perplexity's figure unchanged.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
from llama_cpp import llama_cpp as ll

from .. import clock
from ..data import read_text
from ..engine.context import Context
from ..engine.model import Model
from ..engine.realized_error import sumsq
from ..error_models.configuration import Configuration
from ..exceptions import DataError, SpecError
from .base import Benchmark, Golden, Plan, Progress, RunResult
from .options import Options, option
from .speed import Speed


class _Tally:
    """Running sums of one (configuration, run) over chunks."""

    def __init__(self) -> None:
        self.chunk_nll: list[float] = []
        self.chunk_kld: list[float] = []
        self.chunk_same_top: list[float] = []
        self.chunk_dp2: list[float] = []
        self.nll = self.nll2 = 0.0
        self.count = 0
        self.kld = 0.0
        self.same_top = 0
        self.dp2 = 0.0
        self.compared = 0
        self.nonfinite = 0
        self.seconds = 0.0


@dataclass(frozen=True)
class PerplexityOptions(Options):
    data: str | None = option(None, "Plain text file, folder of .txt files or hf: dataset with a text column. Default: the bundled articles.")
    limit: int | None = option(None, "Chunks to evaluate (default: all); --chunks says the same.", minimum=1)
    chunks: int | None = option(None, "Chunks of --ctx tokens (default: all, or --limit).", minimum=1)
    ctx: int = option(512, "Chunk size in tokens, as llama-perplexity's --ctx-size.", minimum=8)
    skip: int | None = option(None, "Chunks left out at the start of the text: score text that another run (kvinject tune) did not see.", minimum=1)
    step: int | None = option(
        None,
        "Decode the scored half of each chunk STEP tokens at a time (1: token by token), so that kivi and evict act on "
        "what it attends to; default: each chunk in one decode, as llama-perplexity.",
        minimum=1,
    )


# Contexts computed side by side: at most MAX_BATCH, and as many as CONTEXT_MEMORY holds.
MAX_BATCH = 16
CONTEXT_MEMORY = 2 << 30
BLOCK_BYTES = 16 << 20  # rows of logits scored at once: float32 work arrays of this size (85 rows of SmolLM2, 16 of Gemma 3)
BASE_BYTES = 256 << 20  # the control's probabilities of a chunk kept up to this size (_Base)


class Perplexity(Benchmark):
    name = "perplexity"
    summary = "Perplexity as llama-perplexity computes it, plus KL divergence, same-top-p and RMS Δp against the control."
    Options = PerplexityOptions
    options: PerplexityOptions
    primary = "ppl"
    secondary = ("kld", "same_top_p", "rms_dp")
    # PPL is exp of the mean NLL over equal-sized chunks: its item-level CI and paired test
    # come from the per-chunk mean NLL.
    proxies = {"ppl": ("mean_nll", np.exp), "rms_dp": ("mean_dp2", np.sqrt)}
    higher_is_better = {"ppl": False, "mean_nll": False, "kld": False, "same_top_p": True, "rms_dp": False}

    @classmethod
    def check(cls, config: Configuration, options: Options | None = None) -> None:
        super().check(config, options)
        if config.error.resident is not None and not (isinstance(options, PerplexityOptions) and options.step):
            raise SpecError(
                f"'{config.error.spec}' changes the cache between decodes, and perplexity decodes a chunk at once (a long one in "
                "pieces of 512 tokens), so its scored tokens read none of the change, or what the pieces' boundaries let them: "
                "give --step N (the scored half N tokens a decode; 1: token by token)"
            )

    def load(self) -> None:
        self.text = read_text(self.options.data, "encyclopedia")
        self._n_chunk: int | None = None
        self._tokens: list[int] | None = None

    @property
    def chunks(self) -> int | None:
        return self.options.chunks if self.options.chunks is not None else self.options.limit

    @property
    def n_ctx(self) -> int:
        return self.options.ctx

    def __len__(self) -> int:
        return self._n_chunk if self._n_chunk is not None else (self.chunks or 0)

    @property
    def settings(self) -> dict[str, object]:
        return {
            "data": self.options.data or "bundled:encyclopedia",
            "ctx": self.n_ctx,
            "chunks": len(self),
            **({"skip": self.options.skip} if self.options.skip else {}),
            "scored_per_chunk": self.n_ctx - 1 - self.n_ctx // 2,
        } | ({"step": self.options.step} if self.options.step else {})

    def estimate_seconds(self, runs: int, speed: Speed) -> float:
        chunks = self.chunks or 100
        if self.options.step:
            half = self.n_ctx - self.n_ctx // 2
            return runs * speed.generation(chunks, self.n_ctx // 2, half)
        return runs * speed.prefill(chunks * self.n_ctx, self.n_ctx)

    def prepare(self, model: Model) -> None:
        self._tokens = self.tokens(model)

    def tokens(self, model: Model) -> list[int]:
        tokens = model.tokenize(self.text, add_special=True, parse_special=False)
        skip = self.options.skip or 0
        if len(tokens) < (2 + skip) * self.n_ctx:
            after = f" after the {skip} chunks --skip leaves out" if skip else ""
            corpus = self.options.data or "the corpus"
            raise DataError(f"{corpus} has {len(tokens)} tokens; perplexity at --ctx {self.n_ctx} needs at least {2 * self.n_ctx}{after}")
        tokens = tokens[skip * self.n_ctx :]
        n_max = len(tokens) // self.n_ctx
        self._n_chunk = min(self.chunks, n_max) if self.chunks else n_max
        return tokens

    def evaluate(self, model: Model, plan: Plan, seed: int, progress: Progress, golden: Golden | None = None) -> Iterator[RunResult]:
        """Every job chunk by chunk against the control's probabilities, a batch of jobs at a
        time: each context holds the logits of one decode (50 MB for 512 tokens of a 49K
        vocabulary), so a profile's 60 jobs at once took 7.7 GB. Each batch recomputes the
        control's probabilities, bit-identical, and its results are yielded when it ends."""
        tokens = self._tokens if self._tokens is not None else self.tokens(model)
        # Stepped chunks decode a few tokens each time: side by side, as generation does.
        n_seq = min(model.chunks_per_decode(self.n_ctx) if not self.options.step else model.parallel, len(self))
        jobs = [(config, run) for config, runs in plan for run in runs]
        ranges = self.decodes(model.decode_tokens // n_seq)
        # llama.cpp grows a context's output buffer to the most logits a decode asks for.
        per_context = n_seq * max(_asked(a, b, self.n_ctx // 2) for a, b in ranges) * model.n_vocab * 4
        size = max(2, min(MAX_BATCH, CONTEXT_MEMORY // per_context))
        rest = jobs[1:]
        for i in range(0, max(len(rest), 1), size - 1):
            yield from self._evaluate_batch(model, tokens, n_seq, ranges, [jobs[0], *rest[i : i + size - 1]], seed, progress, with_control=i == 0)

    def decodes(self, span: int) -> list[tuple[int, int]]:
        """The positions each decode of a chunk takes, [a, b): the whole chunk where it fits
        ``span`` (llama.cpp's default ubatch, 512 tokens on a CPU, over the chunks decoded
        together), else pieces of ``span`` from position 0, as llama-perplexity's ubatches cut
        it; with ``step``, the unscored half so and the scored half STEP positions a decode."""
        n_ctx, first, step = self.n_ctx, self.n_ctx // 2, self.options.step
        head = first if step else n_ctx
        ranges = [(a, min(a + span, head)) for a in range(0, head, span)]
        return ranges + ([(a, min(a + step, n_ctx)) for a in range(first, n_ctx, step)] if step else [])

    def _evaluate_batch(
        self,
        model: Model,
        tokens: list[int],
        n_seq: int,
        ranges: list[tuple[int, int]],
        jobs: list[tuple[Configuration, int]],
        seed: int,
        progress: Progress,
        with_control: bool,
    ) -> Iterator[RunResult]:
        """The jobs, the control first; the control's result only ``with_control``. Each decode
        of a chunk is made in every job's context in turn, the control's first, and its rows
        scored against the control's at once: no context holds more than one decode's logits."""
        n_ctx, first = self.n_ctx, self.n_ctx // 2
        add_bos = ll.llama_vocab_get_add_bos(model.vocab)
        most = max(_asked(a, b, first) for a, b in ranges)
        tallies = [_Tally() for _ in jobs]
        scratch = _Scratch(most, model.n_vocab, model.backend.n_threads)
        bases = [_Base(most, model.n_vocab) for _ in range(n_seq)] if len(jobs) > 1 else []
        n_batch = n_seq * max(b - a for a, b in ranges)
        contexts = [Context(model, c.cache, c.error, c.target, seed=seed, run=r, n_ctx=n_seq * n_ctx, n_seq=n_seq, n_batch=n_batch) for c, r in jobs]
        try:
            for group in range(0, len(self), n_seq):
                chunks = range(group, min(group + n_seq, len(self)))
                pieces = [tokens[c * n_ctx : (c + 1) * n_ctx] for c in chunks]
                if add_bos:
                    for piece in pieces:
                        piece[0] = model.bos
                targets = [np.array(piece[first + 1 :]) for piece in pieces]
                rows = [[_Rows() for _ in pieces] for _ in jobs]
                for ctx in contexts:
                    ctx.clear()
                    for s, chunk in enumerate(chunks):
                        ctx.begin_item(chunk, s, len(pieces[s]))
                for a, b in ranges:
                    entries = [(t, pos, s, pos >= first) for s, piece in enumerate(pieces) for pos, t in enumerate(piece[a:b], a)]
                    asked, lo, hi = _asked(a, b, first), max(a, first), min(b, n_ctx - 1)  # rows lo..hi-1 predict a token of the chunk
                    for job, (ctx, tally) in enumerate(zip(contexts, tallies)):
                        start = clock.now()
                        ctx.decode(entries)
                        if hi > lo:
                            logits = ctx.output_logits(len(pieces) * asked).reshape(len(pieces), asked, -1)
                            for s in range(len(pieces)):
                                block = logits[s, : hi - lo], targets[s][lo - first : hi - first], scratch
                                if job == 0:  # the control, kept for the others to compare with
                                    _score_rows(rows[job][s], *block, None, bases[s] if bases else None)
                                else:
                                    _score_rows(rows[job][s], *block, bases[s], None)
                        tally.seconds += clock.now() - start
                for job, tally in enumerate(tallies):
                    start = clock.now()
                    for chunk_rows in rows[job]:
                        _fold(tally, chunk_rows)
                    tally.seconds += clock.now() - start
                    if job or with_control:
                        progress(len(pieces))
        finally:
            for ctx in contexts:
                ctx.close()
        for job, ((config, run), tally, ctx) in enumerate(zip(jobs, tallies, contexts)):
            if job or with_control:
                yield self._result(config, run, tally, ctx)

    def _result(self, config: Configuration, run: int, tally: _Tally, ctx) -> RunResult:
        n = tally.count
        mean = tally.nll / n if n else math.nan
        ppl = math.exp(mean) if n else math.nan
        var = tally.nll2 / n - mean * mean if n else math.nan
        metrics = {
            "ppl": ppl,
            "ppl_err": ppl * math.sqrt(var / (n - 1)) if n > 1 and var > 0 else math.nan,
            "mean_nll": mean,
            "bits": ctx.cache_bits,
        }
        if tally.compared:
            metrics.update(
                kld=tally.kld / tally.compared,
                same_top_p=tally.same_top / tally.compared,
                rms_dp=math.sqrt(tally.dp2 / tally.compared),
            )
        return RunResult(
            self.name,
            config,
            run,
            metrics,
            {"mean_nll": tally.chunk_nll, "kld": tally.chunk_kld, "same_top_p": tally.chunk_same_top, "mean_dp2": tally.chunk_dp2},
            ctx.realized,
            tally.nonfinite,
            tally.seconds,
            len(tally.chunk_nll) * self.n_ctx,
        )


def _asked(a: int, b: int, first: int) -> int:
    """Rows of logits a decode of positions [a, b) asks for per chunk: those from ``first`` on."""
    return max(0, b - max(a, first))


class _Scratch:
    """Work arrays for scoring a block of rows at a time, allocated once: a fresh 50 MB array per
    chunk costs more in page faults than the arithmetic (5x, measured right after a decode), and
    arrays of a whole chunk's rows grew with the context (Gemma 3's 262,144-token vocabulary at
    --ctx 8192: 4.3 GB each, three of them beside llama.cpp's own logits). With ``threads``, as
    many threads score blocks side by side (numpy's arithmetic lets go of the GIL; llama.cpp's
    threads are idle meanwhile), each with arrays of its own that together take what one took."""

    def __init__(self, rows: int, n_vocab: int, threads: int = 1):
        self.block = max(1, min(rows, BLOCK_BYTES // (4 * n_vocab * threads)))
        self.threads = threads
        self._arrays = [_Arrays(self.block, n_vocab) for _ in range(threads)]

    def each(self, n: int, score) -> None:
        """``score(lo, hi, arrays)`` for every block of ``n`` rows: thread t takes blocks t, t +
        threads, ... with its own arrays. Each row's figures do not depend on which block holds it."""
        blocks = [(lo, min(lo + self.block, n)) for lo in range(0, n, self.block)]

        def take(t: int) -> None:
            for lo, hi in blocks[t :: self.threads]:
                score(lo, hi, self._arrays[t])

        used = min(self.threads, len(blocks))
        if used > 1:
            with ThreadPoolExecutor(used) as pool:
                list(pool.map(take, range(used)))
        elif blocks:
            take(0)


class _Arrays:
    """One thread's work arrays for a block of rows."""

    def __init__(self, block: int, n_vocab: int):
        self.shifted = np.empty((block, n_vocab), dtype=np.float32)
        self.work = np.empty_like(self.shifted)
        self._p: np.ndarray | None = None

    @property
    def p(self) -> np.ndarray:
        """Room for a block's probabilities, which only comparisons with the control use: a
        control evaluated alone never allocates it."""
        if self._p is None:
            self._p = np.empty_like(self.shifted)
        return self._p


class _Base:
    """The control's scored logits of one decode of a chunk, read in place (its context decodes
    nothing else until every job has been compared with it), and what each row's comparison
    needs. Its probabilities are kept where they take at most BASE_BYTES, and computed again for
    each job from the logits where they would take more (Gemma 3's 262,144-token vocabulary: 512
    MB for 512 rows); kept, four jobs' comparisons with it took 28% less time (SmolLM2, 255 rows)."""

    def __init__(self, rows: int, n_vocab: int):
        self.p = np.empty((rows, n_vocab), dtype=np.float32) if rows * n_vocab * 4 <= BASE_BYTES else None
        self.valid = False

    def probabilities(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Rows lo..hi of the control's probabilities, float32 as llama-perplexity's."""
        if self.p is not None:
            return self.p[lo:hi]
        np.subtract(self.logits[lo:hi], self.top[lo:hi], out=out)
        np.subtract(out, self.lse[lo:hi, None].astype(np.float32), out=out)
        return np.exp(out, out=out)


@dataclass
class _Rows:
    """One job's figures of each scored row of one chunk, gathered over its decodes and folded
    into the tally when the chunk ends (:func:`_fold`), so that a chunk decoded in pieces sums
    as one decoded at once."""

    logp_target: list[np.ndarray] = field(default_factory=list)
    kld: list[np.ndarray] = field(default_factory=list)
    same: list[np.ndarray] = field(default_factory=list)
    dp: list[np.ndarray] = field(default_factory=list)
    nonfinite: bool = False
    compared: bool = True  # every row had a valid control to compare with


def _score_rows(rows: _Rows, logits: np.ndarray, targets: np.ndarray, scratch: _Scratch, base: _Base | None, keep: _Base | None) -> None:
    """Score one decode's rows of a chunk into ``rows``, compared with the control's ``base``
    when valid; fill ``keep`` for the other jobs to compare with. As in llama-perplexity,
    exponentials are float32 and sums float64; rows are scored a block at a time, each row's
    figures as from the whole chunk at once. A row of NaN or Inf marks the chunk non-finite."""
    if rows.nonfinite:
        if keep is not None:
            keep.valid = False
        return
    n = len(targets)
    compare = base is not None and base.valid
    top = np.empty((n, 1), dtype=logits.dtype)
    lse, logp_target, argmax = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64)
    cross = np.empty(n) if compare else None
    p_sum, neg_entropy = (np.empty(n), np.empty(n)) if keep is not None else (None, None)
    finite = np.ones(n, dtype=bool)

    def score(lo: int, hi: int, arrays: _Arrays) -> None:
        np.max(logits[lo:hi], axis=1, keepdims=True, out=top[lo:hi])
        if not (np.isfinite(top[lo:hi]).all() and np.isfinite(logits[lo:hi].min(axis=1)).all()):
            finite[lo:hi] = False
            return
        shifted = np.subtract(logits[lo:hi], top[lo:hi], out=arrays.shifted[: hi - lo])
        lse[lo:hi] = np.log(np.exp(shifted, out=arrays.work[: hi - lo]).sum(axis=1, dtype=np.float64))
        logp_target[lo:hi] = shifted[np.arange(hi - lo), targets[lo:hi]] - lse[lo:hi]
        argmax[lo:hi] = shifted.argmax(axis=1)
        if compare:
            # KL(base || this) = sum p_b log p_b - sum p_b (shifted - lse), without forming log p.
            p = base.probabilities(lo, hi, arrays.p[: hi - lo])
            cross[lo:hi] = np.multiply(p, shifted, out=arrays.work[: hi - lo]).sum(axis=1, dtype=np.float64)
        if keep is not None:
            logp = np.subtract(shifted, lse[lo:hi, None].astype(np.float32), out=arrays.work[: hi - lo])
            p = np.exp(logp, out=arrays.p[: hi - lo] if keep.p is None else keep.p[lo:hi])
            p_sum[lo:hi] = p.sum(axis=1, dtype=np.float64)
            neg_entropy[lo:hi] = np.multiply(p, logp, out=arrays.work[: hi - lo]).sum(axis=1, dtype=np.float64)

    scratch.each(n, score)
    if not finite.all():
        rows.nonfinite = True
        if keep is not None:
            keep.valid = False
        return
    rows.compared &= compare
    rows.logp_target.append(logp_target)
    if compare:
        rows.kld.append(base.neg_entropy - cross + lse * base.p_sum)
        rows.same.append(base.argmax == argmax)
        rows.dp.append(np.exp(logp_target) - np.exp(base.logp_target))
    if keep is not None:
        keep.logits, keep.top, keep.lse, keep.p_sum, keep.neg_entropy = logits, top, lse, p_sum, neg_entropy
        keep.argmax, keep.logp_target, keep.valid = argmax, logp_target, True


def _fold(tally: _Tally, rows: _Rows) -> None:
    """Fold a chunk's scored rows into ``tally``: its NLL, and where every row was compared with
    the control's, its KL divergence, same top and Δp; a chunk with a row of NaN or Inf counts
    as non-finite and gives NaN items."""
    if rows.nonfinite:
        tally.nonfinite += 1
        for chunks in (tally.chunk_nll, tally.chunk_kld, tally.chunk_same_top, tally.chunk_dp2):
            chunks.append(math.nan)
        return
    nll = -np.concatenate(rows.logp_target)
    tally.nll += float(nll.sum())
    tally.nll2 += sumsq(nll)
    tally.count += len(nll)
    tally.chunk_nll.append(float(nll.mean()))
    if not rows.compared:
        for chunks in (tally.chunk_kld, tally.chunk_same_top, tally.chunk_dp2):
            chunks.append(math.nan)
        return
    kld = np.concatenate(rows.kld)
    tally.kld += float(kld.sum())
    tally.chunk_kld.append(float(kld.mean()))
    same = int(np.count_nonzero(np.concatenate(rows.same)))
    dp2 = sumsq(np.concatenate(rows.dp))
    tally.same_top += same
    tally.dp2 += dp2
    tally.compared += len(nll)
    tally.chunk_same_top.append(same / len(nll))
    tally.chunk_dp2.append(dp2 / len(nll))


def _score(tally: _Tally, logits: np.ndarray, targets: np.ndarray, scratch: _Scratch, base: _Base | None, keep: _Base | None) -> None:
    """One chunk's scored logits in one piece, scored and folded (:func:`_score_rows`, :func:`_fold`)."""
    rows = _Rows()
    _score_rows(rows, logits, targets, scratch, base, keep)
    _fold(tally, rows)
