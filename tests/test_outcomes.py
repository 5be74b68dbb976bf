"""Fault-campaign outcomes: masked, benign, SDC and DUE per item against the golden run."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

from kvinject.benchmarks import make_bench
from kvinject.benchmarks.outcomes import classify
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.options import CacheOptions
from kvinject.engine.perturbation import EntryModel
from kvinject.engine.target import Target
from kvinject.error_models import Draws, parse_error
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import HookError, InjectionError, SpecError
from kvinject.experiments import executor
from kvinject.experiments.runner import run

from .cache_state import read_cells
from .cli_runs import PNG, kvinject, swept
from .tiny_model import HEAD_DIM, N_HEAD_KV


def test_each_item_gets_the_outcome_its_definition_says():
    golden = [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]]
    tokens = [[1, 2, 3], [1, 2, 4], [1, 2, 4], [1, 2, 4], [1, 2, 3]]
    got = classify(golden, [1.0, 1.0, 0.0, 1.0, 1.0], tokens, [1.0, 0.0, 1.0, 1.0, 1.0], ["", "", "", "timeout", "nonfinite"], higher_is_better=True)
    assert got == {
        "masked": [1, 0, 0, 0, 0],
        "sdc": [0, 1, 0, 0, 0],  # another output, a worse score
        "benign": [0, 0, 1, 0, 0],  # another output, no worse a score (better counts as benign)
        "due": [0, 0, 0, 1, 1],  # a cause, whatever the tokens and score
        "due_nonfinite": [0, 0, 0, 0, 1],
        "due_raised": [0, 0, 0, 0, 0],
        "due_timeout": [0, 0, 0, 1, 0],
        "due_ecc_detected": [0, 0, 0, 0, 0],
    }
    lower = classify(golden[:2], [2.0, 2.0], tokens[:2], [2.0, 3.0], ["", ""], higher_is_better=False)
    assert set(lower) == {"masked", "benign", "sdc", "due"}, "no item DUE: no causes stored"
    assert lower["masked"] == [1, 0] and lower["sdc"] == [0, 1], "a higher perplexity-like score is worse"


def test_every_configuration_but_the_control_is_classified(tiny):
    bench = make_bench("nexttoken", {"limit": 6})
    configs = [Configuration(), Configuration.parse("normal:0,0"), Configuration.parse("normal:0,4")]
    control, silent, loud = run(tiny, [bench], configs, runs=1)
    assert "masked" not in control.extra and "due" not in control.items
    assert silent.extra["masked"] == 1 and silent.items["masked"] == [1.0] * 6, "no error: every output is the golden one"
    per_item = np.sum([loud.items[k] for k in ("masked", "benign", "sdc", "due")], axis=0)
    assert per_item.tolist() == [1.0] * 6, "one outcome per item"
    assert loud.extra["masked"] < 1


PROMPTS = ["The quick brown fox jumps over the lazy dog.", "One two three four five six seven eight nine ten eleven twelve.", "Hello there, how are you?"]


@dataclass(frozen=True)
class _RaisesAt(EntryModel):
    """Changes nothing, and raises in the hook's Python side for a decode of ``rows`` tokens."""

    rows: int
    name = "raises-at"
    syntax = summary = example = "raises-at"

    def apply(self, x, draws):
        if len(x) == self.rows:
            raise ValueError(f"a decode of {self.rows} rows")


def test_an_error_raised_in_one_item_s_decode_stops_that_item_alone(tiny):
    """With ``contain``, a hook error in a decode of one sequence's tokens ends that item (its
    cause kept) and the others generate what they generate without it; in a decode several
    sequences share, it cannot be put down to one item and is raised."""
    prompts = [tiny.tokenize(p) for p in PROMPTS]
    lengths = [len(p) for p in prompts]
    assert len(set(lengths)) == 3 and 2 not in lengths

    def generations(rows, n_seq=1, contain=True):
        with Context(tiny, error=_RaisesAt(rows), seed=1, n_ctx=64 * n_seq, n_seq=n_seq) as ctx:
            return dict(generate_all(ctx, prompts, 5, items=[0, 1, 2], contain=contain))

    clean, got = generations(rows=999), generations(rows=lengths[1])
    assert got[1].stopped == f"error inside the K/V hook: ValueError: a decode of {lengths[1]} rows".join(["raised: ", ""]) and got[1].tokens == []
    assert np.isnan(got[1].first_logits).all(), "no logits: the prompt never finished"
    assert [got[i].tokens for i in (0, 2)] == [clean[i].tokens for i in (0, 2)] and all(clean[i].tokens for i in (0, 2))
    assert not any(g.stopped for g in clean.values())
    with pytest.raises(HookError, match="a decode of"):
        generations(rows=lengths[1], contain=False)
    with pytest.raises(HookError, match="a decode of 2 rows"):  # the first decode of two sequences' next tokens
        generations(rows=2, n_seq=2)


def test_a_generation_past_its_deadline_stops_after_the_pick_it_was_in(tiny):
    prompts = [tiny.tokenize(p) for p in PROMPTS]
    with Context(tiny, seed=1, n_ctx=64) as ctx:
        clean = dict(generate_all(ctx, prompts, 5, items=[0, 1, 2], ignore_eos=True))
        late = dict(generate_all(ctx, prompts, 5, items=[0, 1, 2], ignore_eos=True, deadline=0.0))
    for i in range(3):
        assert late[i].stopped == "timeout" and late[i].tokens == clean[i].tokens[:1] and len(clean[i].tokens) == 5


_STOPPED_MID_GENERATION = """
import json, os, signal, sys
from kvinject.engine.context import Context
from kvinject.engine.generation.batching import generate_all
from kvinject.engine.model import Model

def stop(tokens):  # after the second pick, the process stops itself; the test continues it
    if len(tokens) == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
    return False

with Model(sys.argv[1]) as model, Context(model, seed=1, n_ctx=64) as ctx:
    got = dict(generate_all(ctx, [model.tokenize("Hello there, how are you?")], 5, items=[0], ignore_eos=True, stop=stop, deadline=float(sys.argv[2])))
print(json.dumps({"stopped": got[0].stopped, "tokens": len(got[0].tokens)}))
"""


def _stopped_for(seconds: float, tiny_path, deadline: float) -> dict:
    """A generation whose process is stopped (SIGSTOP, as Ctrl-Z or a scheduler's suspend stops
    it) for ``seconds`` after its second pick, then continued."""
    child = subprocess.Popen([sys.executable, "-c", _STOPPED_MID_GENERATION, str(tiny_path), str(deadline)], stdout=subprocess.PIPE, text=True)
    _, status = os.waitpid(child.pid, os.WUNTRACED)  # returns once the child has stopped itself
    assert os.WIFSTOPPED(status), "the child ended before it stopped itself"
    time.sleep(seconds)
    child.send_signal(signal.SIGCONT)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    return json.loads(out)


def test_a_stopped_process_does_not_put_its_generations_past_their_deadline(tiny_path):
    """The watchdog counts the time the process runs (kvinject/clock.py): stopped for 3 s with a
    deadline of 2 s, the generation goes on to its 5 tokens (on the wall clock it was cut at 2)."""
    assert _stopped_for(3.0, tiny_path, deadline=2.0) == {"stopped": "", "tokens": 5}


def test_a_campaign_counts_an_item_past_its_time_limit_as_due(tiny, monkeypatch):
    """Fault campaigns alone get the watchdog: with a limit of 0 s, every faulted item still
    generating after its first token is DUE for "timeout"; the control is timed, not limited."""
    monkeypatch.setattr(executor, "TIMEOUT_FLOOR_S", 0.0)
    monkeypatch.setattr(executor, "TIMEOUT_FACTOR", 0.0)
    bench = make_bench("nexttoken", {"limit": 8})
    control, noise, faults = run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0"), Configuration.parse("faults:1,bit=0")], runs=1)
    assert noise.items["masked"] == [1.0] * 8 and "due_timeout" not in noise.items, "only a fault campaign is limited; no DUE, no causes kept"
    assert all(len(tokens) > 1 for tokens in control.outputs), "each golden item takes several picks, so each faulted one is cut"
    assert [len(tokens) for tokens in faults.outputs] == [1] * 8
    assert faults.items["due_timeout"] == faults.items["due"] == [1.0] * 8 and faults.extra["due"] == 1
    assert faults.nonfinite_items == 0 and not any(faults.items["due_nonfinite"] + faults.items["due_raised"])


def _nearest_bf16(x: np.ndarray) -> np.ndarray:
    """bf16's bits of each value by its definition: of the two bf16 values around x (x's upper
    half, and the next one up in magnitude), the nearer; on a tie the one with an even last bit."""
    u = x.view(np.uint32)
    down = u >> 16
    up = down + 1
    d_down = np.abs(x.astype(np.float64) - (down.astype(np.uint32) << 16).view(np.float32))
    d_up = np.abs(x.astype(np.float64) - (up.astype(np.uint32) << 16).view(np.float32))
    return np.where((d_up < d_down) | ((d_up == d_down) & (down & 1 == 1)), up, down).astype(np.uint16)


# A format's bits of a float32 value that it holds exactly, and of the value it starts from.
BITS = {
    "f16": (lambda y: y.astype(np.float16).view(np.uint16), lambda x: x.astype(np.float16).view(np.uint16)),
    "bf16": (lambda y: (y.view(np.uint32) >> 16).astype(np.uint16), _nearest_bf16),
    "f32": (lambda y: y.view(np.uint32), lambda x: x.view(np.uint32)),
}


@pytest.mark.parametrize("fmt,bit", [("f16", 0), ("f16", 10), ("f16", 15), ("bf16", 3), ("bf16", 14), ("f32", 20), ("f32", 31)])
def test_bitflip_at_one_bit_flips_only_that_bit_of_the_stored_format(fmt, bit):
    x = np.random.default_rng(0).standard_normal((200, 64)).astype(np.float32)
    model = parse_error(f"bitflip:0.1,bit={bit}").stored(CacheOptions(fmt, fmt), "kv")
    y = x.copy()
    model.apply(y, Draws(model.draw, np.random.default_rng(1)))
    held, start = BITS[fmt]
    flipped = start(x) ^ held(y)
    assert set(np.unique(flipped).tolist()) == {0, 1 << bit}
    assert np.mean(flipped != 0) == pytest.approx(0.1, abs=0.01)
    assert np.array_equal(model.unchanged(x) != y, flipped != 0), "realized statistics see the flips, not the rounding"
    assert model.spec == f"bitflip:0.1,field=any,bit={bit}" + ("" if fmt == "f16" else f",format={fmt}")
    assert parse_error("bitflip:0.1").spec == "bitflip:0.1,field=any", "specs without bit= stay as they were"


@pytest.mark.parametrize(
    "fmt,field,mask", [("bf16", "exponent", 0x7F80), ("bf16", "mantissa", 0x007F), ("f32", "exponent", 0x7F800000), ("f32", "sign", 1 << 31)]
)
def test_bitflip_fields_follow_the_stored_format(fmt, field, mask):
    x = np.random.default_rng(2).standard_normal((100, 64)).astype(np.float32)
    model = parse_error(f"bitflip:0.05,field={field}").stored(CacheOptions(fmt, fmt), "kv")
    y = x.copy()
    model.apply(y, Draws(model.draw, np.random.default_rng(3)))
    held, start = BITS[fmt]
    flipped = (start(x) ^ held(y)).astype(np.uint64)
    assert np.all(flipped & ~np.uint64(mask) == 0) and flipped.any()
    assert sum(np.count_nonzero(flipped >> np.uint64(b) & np.uint64(1)) for b in range(32)) / (x.size * bin(mask).count("1")) == pytest.approx(0.05, rel=0.1)


def test_the_stored_format_is_the_cache_s():
    def stored(spec, target="kv"):
        config = Configuration.parse(spec, Target.parse(target))
        return config.error.stored(config.cache, target).spec

    assert stored("bitflip:0.1") == "bitflip:0.1,field=any", "fp16 keeps its spec and store keys"
    assert stored("bitflip:0.1@q8_0") == "bitflip:0.1,field=any", "a quantized cache: fp16, as before"
    assert Configuration.parse("bitflip:0.1@f32").label == "bitflip:0.1,field=any,format=f32 @f32", "not the key of fp16 flips in an f32 cache"
    assert stored("faults:2,bit=30@f32") == "faults:2,field=any,bit=30,format=f32"
    assert stored("bitflip:0.1@f32/f16", "k") == "bitflip:0.1,field=any,format=f32"
    assert stored("bitflip:0.1,format=bf16@f32") == "bitflip:0.1,field=any,format=bf16", "a named format wins"
    with pytest.raises(SpecError, match="bit 20 is beyond the 16 bits of f16"):
        Configuration.parse("bitflip:0.1,bit=20")
    with pytest.raises(SpecError, match=r"stores K as f32 and V as q8_0 \(flipped as f32 and f16\): target one"):
        Configuration.parse("bitflip:0.1@f32/q8_0")
    with pytest.raises(SpecError, match=r"bit must be in 0..15 \(the bits of bf16\)"):
        parse_error("bitflip:0.1,bit=16,format=bf16")
    # faults flip a q8_0 or q4_0 cache's blocks (bitflip keeps fp16); other quantized caches are refused.
    assert stored("faults:1@q8_0") == "faults:1,field=any,format=q8_0"
    assert stored("faults:1,field=scale,bit=15@q4_0", "k") == "faults:1,field=scale,bit=15,format=q4_0"
    assert stored("faults:1,format=f16@q8_0") == "faults:1,field=any,format=f16", "the float before quantization, when asked"
    with pytest.raises(SpecError, match=r"bit must be in 0..3 \(the bits of a q4_0 code\)"):
        Configuration.parse("faults:1,field=code,bit=5@q4_0")
    with pytest.raises(SpecError, match="flips bits of q8_0 and q4_0 blocks, not of a q4_1 cache's: give format=f16"):
        Configuration.parse("faults:1@q4_1")
    with pytest.raises(SpecError, match=r"field=scale is a quantized block's, and this cache stores K as f16 and V as f16: give a q8_0"):
        Configuration.parse("faults:1,field=scale")
    with pytest.raises(SpecError, match="flips bits of q8_0 blocks, and this cache stores K as q8_0 and V as f16: target one"):
        Configuration.parse("faults:1@q8_0/f16")
    with pytest.raises(SpecError, match="give field=scale or field=code"):
        parse_error("faults:1,bit=3,format=q8_0")


# The fields of each format by their definitions (IEEE 754 binary16 and binary32; bfloat16 is
# binary32's upper half): the lowest and highest bit of each.
FIELDS = {
    "f16": {"mantissa": (0, 9), "exponent": (10, 14), "sign": (15, 15)},
    "bf16": {"mantissa": (0, 6), "exponent": (7, 14), "sign": (15, 15)},
    "f32": {"mantissa": (0, 22), "exponent": (23, 30), "sign": (31, 31)},
}


@pytest.mark.parametrize("fmt,bit,n_batch", [("f16", 14, 512), ("bf16", 3, 512), ("f32", 20, 512), ("f16", 15, 4), ("bf16", 7, 5)])
def test_faults_flip_exactly_k_values_of_each_prompt_and_nothing_else(tiny, fmt, bit, n_batch):
    """A float cache holds what the hook wrote exactly: in the last layer (whose K/V no other
    cached value depends on), each item's prompt rows differ from the control's in exactly K
    values, each by the chosen bit of the cache's format, where the item's record says; the
    first layer is untouched. A small batch decodes the prompts in pieces."""
    cache = CacheOptions(fmt, fmt, "on")
    faulty_spec = f"faults:3,bit={bit}"
    prompts = [tiny.tokenize("The quick brown fox jumps over the lazy dog."), tiny.tokenize("One two three four five six seven eight nine ten eleven.")]
    caches, realized, recorded = {}, {}, {}
    for spec in ("none", faulty_spec):
        with Context(tiny, cache, parse_error(spec), Target.parse("kv", "1"), seed=5, n_ctx=128, n_batch=n_batch) as ctx:
            done = {i: (read_cells(ctx), gen.faults) for i, gen in generate_all(ctx, prompts, 4, items=[0, 1])}
            caches[spec], recorded[spec] = [done[i][0] for i in range(len(prompts))], [done[i][1] for i in range(len(prompts))]
            realized[spec] = ctx.realized.summary()
    assert recorded["none"] == [None, None], "only placed faults are recorded"
    # The realized statistics count the faults, not the rounding to the format they start from.
    assert sum(realized[faulty_spec][c]["changed"] for c in "kv") == 3 * len(prompts)
    held = BITS[fmt][0]
    for i, prompt in enumerate(prompts):
        (clean_pos, clean), (faulty_pos, faulty) = caches["none"][i], caches[faulty_spec][i]
        rows = {name: np.argsort(pos)[: len(prompt)] for name, pos in (("clean", clean_pos), ("faulty", faulty_pos))}

        def bits(c, layer):
            return held(clean[c, layer][rows["clean"]]) ^ held(faulty[c, layer][rows["faulty"]])

        assert not any(bits(c, 0).any() for c in "kv"), "the first layer is untouched"
        flips = np.concatenate([bits(c, 1).ravel() for c in "kv"])
        # A flip that makes a NaN is stored quieted: fp16's quiet bit (9) set by the conversions.
        assert np.count_nonzero(flips) == 3 and set(flips[flips != 0].tolist()) <= {1 << bit, 1 << bit | 1 << 9}
        # Each fault is recorded where it landed: the value at its layer, K or V, position, head and element.
        found = {(c, int(p), int(col)) for c in "kv" for p, col in zip(*np.nonzero(bits(c, 1)))}
        sites = recorded[faulty_spec][i]
        assert {(f["kv"], f["position"], f["head"] * HEAD_DIM + f["element"]) for f in sites} == found
        field = next(f for f, (lo, hi) in FIELDS[fmt].items() if lo <= bit <= hi)
        assert all(f["layer"] == 1 and f["bit"] == bit and f["field"] == field and f["format"] == fmt for f in sites)
        assert all(0 <= f["position"] < len(prompt) and f["stage"] == "prompt" and 0 <= f["head"] < N_HEAD_KV for f in sites)


def _block_bit(block_bytes: int, code_bits: int, row_element: int, field: str, bit: int) -> tuple[int, int]:
    """The byte of a cache row and the bit in it that a fault names, from ggml-common.h's block
    definitions: 32 values a block, the fp16 scale d first (little-endian), then q8_0's int8
    codes (value j at byte 2 + j) or q4_0's nibbles (value j < 16 low in byte 2 + j, j + 16 high)."""
    block, j = divmod(row_element, 32)
    start = block * block_bytes
    if field == "scale":
        return start + bit // 8, bit % 8
    if code_bits == 8:
        return start + 2 + j, bit
    return start + 2 + j % 16, bit + (4 if j >= 16 else 0)


@pytest.mark.parametrize(
    "fmt,spec,n_batch",
    [("q8_0", "faults:3", 512), ("q8_0", "faults:2,field=scale", 4), ("q4_0", "faults:3,field=code", 5), ("q4_0", "faults:2,field=scale,bit=14", 512)],
)
def test_faults_in_a_quantized_cache_flip_exactly_k_bits_of_its_blocks(tiny, fmt, spec, n_batch):
    """A q8_0 or q4_0 cache's faults land in the blocks llama.cpp stored: in the last layer, each
    item's prompt rows differ from the control's in exactly K bits, each the scale's or a code's
    bit its record names; the first layer is untouched. A small batch decodes prompts in pieces."""
    block_bytes, code_bits = {"q8_0": (34, 8), "q4_0": (18, 4)}[fmt]
    cache = CacheOptions(fmt, fmt, "on")
    prompts = [tiny.tokenize("The quick brown fox jumps over the lazy dog."), tiny.tokenize("One two three four five six seven eight nine ten eleven.")]
    caches, recorded, realized = {}, {}, {}
    for s in ("none", spec):
        config = Configuration.parse(f"{s}@{fmt}", Target.parse("kv", "1"))
        with Context(tiny, cache, config.error, Target.parse("kv", "1"), seed=5, n_ctx=128, n_batch=n_batch) as ctx:
            done = {i: (read_cells(ctx), gen.faults) for i, gen in generate_all(ctx, prompts, 4, items=[0, 1])}
            caches[s], recorded[s] = [done[i][0] for i in range(2)], [done[i][1] for i in range(2)]
            realized[s] = ctx.realized.summary()
    k = int(spec.split(":")[1].split(",")[0])
    field = "scale" if "scale" in spec else "code" if "code" in spec else None
    assert sum(realized[spec][c]["changed"] for c in "kv") >= 2 * k, "every fault changes at least the value it lies in"
    for i, prompt in enumerate(prompts):
        (clean_pos, clean), (faulty_pos, faulty) = caches["none"][i], caches[spec][i]
        rows = {name: np.argsort(pos)[: len(prompt)] for name, pos in (("clean", clean_pos), ("faulty", faulty_pos))}

        def xor(c, layer):
            return clean[c, layer][rows["clean"]] ^ faulty[c, layer][rows["faulty"]]

        assert not any(xor(c, 0).any() for c in "kv"), "the first layer is untouched"
        assert sum(int(np.unpackbits(xor(c, 1)).sum()) for c in "kv") == k, "exactly K bits differ"
        found = {(c, int(p), int(b), int(x).bit_length() - 1) for c in "kv" for p, b in zip(*np.nonzero(xor(c, 1))) for x in [xor(c, 1)[p, b]]}
        sites = recorded[spec][i]
        assert all(f["layer"] == 1 and f["format"] == fmt and (field is None or f["field"] == field) for f in sites)
        assert "bit=14" not in spec or all(f["bit"] == 14 for f in sites)
        named = {(f["kv"], f["position"], *_block_bit(block_bytes, code_bits, f["head"] * HEAD_DIM + f["element"], f["field"], f["bit"])) for f in sites}
        assert named == found


def test_faults_in_generated_tokens_leave_the_prompt_and_the_first_pick_alone(tiny):
    """stage=generated places every fault in the K/V of generated tokens: the prompt's rows are
    the control's in every layer, the first token picked (from the prompt alone) is the
    control's, and each fault is recorded at a generated position, all K of them changed."""
    prompts = [tiny.tokenize("The quick brown fox jumps over the lazy dog."), tiny.tokenize("One two three four five six seven eight nine ten eleven.")]
    out = {}
    for spec in ("none", "faults:2,bit=14,stage=generated"):
        with Context(tiny, CacheOptions("f16", "f16", "on"), parse_error(spec), seed=3, n_ctx=128) as ctx:
            out[spec] = {i: (read_cells(ctx), gen) for i, gen in generate_all(ctx, prompts, 6, items=[0, 1], ignore_eos=True)}
            assert sum(s["changed"] for s in ctx.realized.summary().values()) == (2 * len(prompts) if spec != "none" else 0)
    for i, prompt in enumerate(prompts):
        (clean_pos, clean), golden = out["none"][i]
        (faulty_pos, faulty), gen = out["faults:2,bit=14,stage=generated"][i]
        assert gen.tokens[0] == golden.tokens[0]
        for key in clean:
            assert np.array_equal(clean[key][np.argsort(clean_pos)[: len(prompt)]], faulty[key][np.argsort(faulty_pos)[: len(prompt)]])
        assert len(gen.faults) == 2
        assert all(f["stage"] == "generated" and len(prompt) <= f["position"] < len(prompt) + 5 for f in gen.faults)


def test_faults_need_an_item_s_prompt(tiny):
    with Context(tiny, error=parse_error("faults:1")) as ctx, pytest.raises(InjectionError, match="run it through a benchmark"):
        ctx.prefill(tiny.tokenize("Hello there"))


def test_report_draws_the_outcomes_of_a_campaign(tmp_path, tiny_path):
    store = swept(
        tmp_path, f'[sweep]\nmodels = ["{tiny_path}"]\nruns = 1\n\n[bench.nexttoken]\nlimit = 4\n\n[[errors]]\nspec = ["faults:2,bit=14", "faults:2,bit=3"]\n'
    )
    png = tmp_path / "outcomes.png"
    out = kvinject("report", store, "--outcomes", png)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
