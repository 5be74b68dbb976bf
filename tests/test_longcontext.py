"""The long-context benchmarks (passkey, niah, vt): their generated items against their
definitions, RULER's scoring on known answers, a run on the tiny model, and the heatmap."""

from __future__ import annotations

import re
import uuid
from itertools import pairwise

import pytest

from kvinject.analysis.aggregate import aggregate
from kvinject.analysis.plots import cell_scores, heatmap
from kvinject.analysis.report import load_records, summarize
from kvinject.benchmarks import make_bench
from kvinject.benchmarks.haystack import NOISE, build_prompt, filler_sentences, string_match_all
from kvinject.benchmarks.niah import Niah
from kvinject.benchmarks.vt import EXAMPLE_NOISE_BLOCKS
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import DataError, KvinjectError, SpecError
from kvinject.experiments.runner import run
from kvinject.experiments.store import Store

from .cli_runs import PNG, kvinject, swept
from .stored import RECORD, SETTINGS


def needle_share(model, bench, index: int) -> float:
    """Where item ``index``'s first needle starts in its filler, as a share of the filler's
    tokens (the other needles left out of both)."""
    text, item = bench.fitted[index].text, bench.items[index]
    first, last = text.index(item.before) + len(item.before), text.index(item.after)
    at = text.index(item.needles[0].text, first)

    def filler_tokens(part: str) -> int:
        for needle in item.needles:
            part = part.replace(needle.text, "")
        return len(model.tokenize(part, add_special=False, parse_special=False))

    return filler_tokens(text[first:at]) / filler_tokens(text[first:last])


# vt's worked example (about 500 tokens, as RULER's) leaves a 1K prompt 6 noise blocks, and
# niah's 128 answer tokens leave it about 500 words, sentences 4% apart: too coarse to place a
# needle within 5% of its depth, so their lengths start at 2K here. Text fills to a word, noise
# to a block (about 25 tokens), needles to a line.
@pytest.mark.parametrize(
    "name,options,slack",
    [
        ("passkey", {}, 6),
        ("niah", {"family": "multikey", "lengths": (2048, 3072)}, 6),
        ("niah", {"haystack": "needles", "family": "multivalue", "lengths": (2048, 3072)}, 25),
        ("vt", {"chains": 2, "lengths": (2048, 3072)}, 30),
    ],
)
def test_the_prompt_has_the_asked_length_and_the_needle_its_depth(name, options, slack, tiny):
    bench = make_bench(name, {"lengths": (1024, 2048), "depths": (0, 25, 50, 75, 100), "samples": 1, **options})
    prompts = bench.prompts(tiny)
    for cell, prompt, fitted in zip(bench.cells, prompts, bench.fitted):
        # The length counts the chat template and the answer's max_tokens, as RULER's does.
        assert cell.length - bench.max_tokens - slack <= len(prompt) <= cell.length - bench.max_tokens
        assert fitted.text.startswith("<|im_start|>system\n") and "<|im_start|>user\n" in fitted.text and "<|im_start|>assistant\n" in fitted.text
        assert prompt == tiny.tokenize(fitted.text, parse_special=True)
    for i, cell in enumerate(bench.cells):
        assert needle_share(tiny, bench, i) == pytest.approx(cell.depth / 100, abs=0.05)


def test_the_filler_is_the_bundled_encyclopedia_ending_at_a_whole_sentence(tiny):
    bench = make_bench("passkey", {"lengths": (1024,), "depths": (100,), "samples": 1})
    bench.prompts(tiny)
    item = bench.items[0]
    filler = bench.fitted[0].text.split(item.before)[1].split(item.needles[0].text)[0]
    assert filler.strip().endswith(filler_sentences()[item.end])
    assert len(filler.split()) == bench.fitted[0].filler_words
    assert build_prompt(tiny, item, bench.fitted[0].filler_words) == bench.fitted[0]


def test_a_model_without_a_chat_template_reads_the_task_as_plain_text(tiny, monkeypatch):
    bench = make_bench("passkey", {"lengths": (1024,), "depths": (50,), "samples": 1})
    bench.prompts(tiny)
    item, chat = bench.items[0], bench.fitted[0]
    monkeypatch.setattr(type(tiny), "has_chat_template", property(lambda self: False))
    plain = build_prompt(tiny, item, chat.filler_words)
    assert plain.text.startswith(item.before) and plain.text.endswith(item.after + item.answer_prefix)
    assert "<|im_start|>" not in plain.text and chat.text.count(plain.text.removesuffix(item.answer_prefix)) == 1
    assert plain.tokens == tiny.tokenize(plain.text, parse_special=True)


def test_the_same_seed_gives_the_same_items_and_another_seed_others():
    def items(seed, **kw):
        return make_bench("niah", {"family": "multivalue", "data_seed": seed, "lengths": (1024, 2048), **kw}).items

    assert items(0) == items(0)
    assert all(a.expected != b.expected and a.needles != b.needles for a, b in zip(items(0), items(1)))
    # An item depends on its cell and sample only, not on what else the grid holds.
    assert items(0, depths=(50,))[0] == items(0)[4]


def test_values_are_seven_digit_numbers_or_uuids():
    for item in make_bench("niah", {"family": "multivalue", "samples": 3}).items:
        assert len(item.expected) == 4 and all(re.fullmatch(r"[1-9]\d{6}", v) for v in item.expected)
        assert all(f": {v}." in "".join(n.text for n in item.needles) for v in item.expected)
    for item in make_bench("niah", {"value_type": "uuids"}).items:
        (value,) = item.expected
        assert str(uuid.UUID(value)) == value and uuid.UUID(value).version == 4
    assert all(re.fullmatch(r"[1-9]\d{4}", item.expected[0]) for item in make_bench("passkey", {}).items)


def test_each_family_hides_and_asks_what_it_should():
    key = re.compile(r"for ([a-z]+-[a-z]+) is: (\S+)\.")

    def needles(item):
        return [key.search(n.text).groups() for n in item.needles]

    for item in make_bench("niah", {"family": "multikey", "needles": 5}).items:
        pairs = needles(item)
        asked = pairs[0][0]
        assert len(pairs) == 5 and len({k for k, _ in pairs}) == 5  # distractors have other keys
        assert item.expected == (pairs[0][1],) and f"for {asked} mentioned" in item.after
        assert all(k not in item.after for k, _ in pairs[1:])
    for item in make_bench("niah", {"family": "multivalue"}).items:
        assert len({k for k, _ in needles(item)}) == 1 and set(item.expected) == {v for _, v in needles(item)}
    for item in make_bench("niah", {"family": "multiquery", "needles": 3}).items:
        pairs = needles(item)
        assert item.expected == tuple(v for _, v in pairs) and all(k in item.after for k, _ in pairs)
    for item in make_bench("niah", {"family": "single"}).items:
        assert len(item.needles) == 1 and item.needles[0].depth in (0, 25, 50, 75, 100)


@pytest.mark.parametrize("haystack,end", [("noise", " "), ("text", ".")])
def test_variable_tracking_chains_hop_from_the_value_in_order(haystack, end):
    """RULER's statements: a line each in its noise haystack ("VAR B = VAR A ", as its code
    writes them), sentences with a full stop in text."""
    for item in make_bench("vt", {"chains": 3, "hops": 4, "depths": (0, 60), "haystack": haystack}).items:
        statements = [n.text for n in item.needles]
        assert len(statements) == 3 * 5
        names = list(item.expected)
        assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in names)
        value = re.fullmatch(rf"VAR {names[0]} = (\d{{5}}){re.escape(end.strip())}", statements[0])[1]
        assert statements[1:5] == [f"VAR {b} = VAR {a}{end}" for a, b in pairwise(names)]
        assert f"value {value} in the text" in item.after
        depths = [n.depth for n in item.needles[:5]]
        assert depths == sorted(depths) and depths[0] in (0, 60)
        others = " ".join(statements[5:])
        assert value not in others and not any(v in others for v in names)


# RULER's niah task (scripts/data/synthetic/constants.py), template and answer prefix as
# prepare.py joins them.
RULER_NIAH = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the "
    "{type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
    " The special magic {type_needle_v} for {query} mentioned in the provided text are"
)
RULER_VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables "
    "that are assigned the value {query} in the text above. Answer: According to the chain(s) of variable assignment in the text above, "
    "{num_v} variables are assigned the value {query}, they are: "
)


def ruler_niah(type_needle_v: str, queries: list[str], values: int, context: str) -> str:
    """RULER's niah.py: the template in the singular where one value is asked for, by its
    string replacements, and the queries joined with ', and '."""
    template = RULER_NIAH
    if len(queries) * values == 1:
        for a, b in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(a, b)
        type_needle_v = type_needle_v[:-1]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    return template.format(type_needle_v=type_needle_v, context=context, query=query)


@pytest.mark.parametrize("family", ["single", "multikey", "multivalue", "multiquery"])
@pytest.mark.parametrize("value_type", ["numbers", "uuids"])
def test_niah_asks_with_ruler_s_template(family, value_type):
    bench = make_bench("niah", {"family": family, "value_type": value_type, **({"needles": 3} if family != "single" else {})})
    for item in bench.items:
        keys = list(dict.fromkeys(re.search(r"for (\S+) is:", n.text)[1] for n in item.needles))
        queries = keys if family == "multiquery" else keys[:1]
        values = 3 if family == "multivalue" else 1
        assert item.before + "CONTEXT" + item.after + item.answer_prefix == ruler_niah(value_type, queries, values, "CONTEXT")


def test_vt_asks_with_ruler_s_template_after_a_worked_example():
    for item in make_bench("vt", {"chains": 2, "hops": 3}).items:
        value = re.search(r"VAR \S+ = (\d+)$", item.needles[0].text)[1]
        example, _, task = item.before.rpartition("\n\n" + RULER_VT.split("{context}")[0])
        assert task == "" and item.before.endswith(RULER_VT.split("{context}")[0])
        assert "CONTEXT".join((RULER_VT.split("{context}")[0], item.after + item.answer_prefix)) == RULER_VT.format(context="CONTEXT", query=value, num_v=4)
        # The example: a task of its own over noise lines, 3-letter variables, its answer given.
        head, answer = example.rsplit("they are: ", 1)
        names = answer.split()
        assert example.startswith(RULER_VT.split("{context}")[0]) and len(names) == 4 and all(re.fullmatch(r"[A-Z]{3}", n) for n in names)
        lines = head.split("\n")
        first = next(i for i, line in enumerate(lines) if line.startswith(f"VAR {names[0]} = "))
        example_value = lines[first].split(" = ")[1]
        hops = [i for i, line in enumerate(lines) if line.startswith("VAR ") and line.endswith(" ")]
        assert [lines[i] for i in hops if lines[i].startswith(tuple(f"VAR {n} " for n in names))] == [f"VAR {b} = VAR {a} " for a, b in pairwise(names)]
        assert f"assigned the value {example_value} in the text above" in head and example_value != value
        assert sum(line == NOISE for line in lines) == EXAMPLE_NOISE_BLOCKS


@pytest.mark.parametrize("key_type,value_type", [("words", "numbers"), ("uuids", "uuids")])
def test_the_needles_haystack_is_whole_needles_of_other_keys(key_type, value_type, tiny):
    """RULER's multikey_2 (word keys, numbers) and multikey_3 (UUIDs both): every line of the
    context is a whole needle, and only the queried one has the asked key."""
    bench = make_bench("niah", {"lengths": (1024,), "depths": (50,), "samples": 1, "haystack": "needles", "key_type": key_type, "value_type": value_type})
    bench.prompts(tiny)
    item, text = bench.items[0], bench.fitted[0].text
    key = r"[a-z]+-[a-z]+" if key_type == "words" else r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    value = r"[1-9]\d{6}" if value_type == "numbers" else r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    lines = text.split(item.before)[1].split(item.after)[0].split("\n")
    assert len(lines) > 5 and all(re.fullmatch(rf"One of the special magic {value_type} for ({key}) is: ({value})\.", line) for line in lines)
    asked = re.search(r"for (\S+) is:", item.needles[0].text)[1]
    assert [line for line in lines if f" {asked} " in line] == [item.needles[0].text]
    assert f"for {asked} mentioned" in item.after
    if key_type == "uuids":
        assert uuid.UUID(asked).version == 4


def test_a_needles_haystack_is_drawn_at_any_length():
    """32K tokens ask for more distractor needles than there are word keys (2304): each is drawn
    on its own, as RULER's, never with a key the item hides."""
    for item in make_bench("niah", {"family": "multikey", "haystack": "needles", "lengths": (32768,), "depths": (50,), "samples": 1}).items:
        hidden = {re.search(r"for (\S+) is:", n.text)[1] for n in item.needles}
        filler_keys = [re.search(r"for (\S+) is:", line)[1] for line in item.filler]
        assert len(filler_keys) > 3000 and not hidden & set(filler_keys)


def test_the_noise_haystack_is_ruler_s_block_a_line_each(tiny):
    bench = make_bench("passkey", {"lengths": (1024,), "depths": (50,), "samples": 1, "haystack": "noise"})
    bench.prompts(tiny)
    item, text = bench.items[0], bench.fitted[0].text
    context = text.split(item.before)[1].split(item.after)[0]
    lines = context.split("\n")
    assert lines.count(item.needles[0].text) == 1
    filler = [line for line in lines if line != item.needles[0].text]
    assert all(line == NOISE for line in filler) and len(filler) > 20, "whole blocks, as RULER fits them"


def test_scoring_on_known_answers():
    niah = make_bench("niah", {"family": "multivalue", "lengths": (1024,), "depths": (50,), "samples": 1})
    values = niah.items[0].expected
    assert niah.score_text(0, " " + ", ".join(values) + ".") == 1
    assert niah.score_text(0, f" {values[0]} and {values[2]}, I think") == 0.5
    assert niah.score_text(0, " 1234567") == 0
    assert string_match_all("the ABCDE, and bcdef", ["abcde", "BCDEF", "XYZ"]) == pytest.approx(2 / 3)
    vt = make_bench("vt", {"lengths": (1024,), "depths": (50,), "samples": 1})
    assert vt.score_text(0, " ".join(vt.items[0].expected).lower()) == 1
    passkey = make_bench("passkey", {"lengths": (1024,), "depths": (50,), "samples": 1})
    key = passkey.items[0].expected[0]
    assert passkey.score_text(0, f"The pass key is {key}.") == 1
    assert passkey.score_text(0, f"The pass key is 1{key}.") == 0  # exact match, not a substring
    assert passkey.score_text(0, f"It is 12345, or maybe {key}.") == 0  # the first number counts


def test_a_length_beyond_the_training_context_is_a_clear_error(tiny):
    bench = make_bench("passkey", {"lengths": (1024, 8192)})
    with pytest.raises(DataError, match=rf"passkey: length 8192 exceeds the training context of tiny-llama.gguf \({tiny.n_ctx_train} tokens\)"):
        list(run(tiny, [bench], [Configuration()], runs=1))
    with pytest.raises(DataError, match="niah: length 64 is too short with max_tokens 128"):
        make_bench("niah", {"lengths": (64,)}).prompts(tiny)


def test_options_are_checked():
    with pytest.raises(DataError, match="niah: 3000 needles need more keys than the 2304 word keys: use --key-type uuids"):
        make_bench("niah", {"family": "multikey", "needles": 3000})
    with pytest.raises(SpecError, match="family must be one of single, multikey, multivalue, multiquery"):
        make_bench("niah", {"family": "double"})
    with pytest.raises(SpecError, match="lengths must be at least 64"):
        make_bench("passkey", {"lengths": "1024,32"})
    with pytest.raises(DataError, match="depths are percentages from 0 to 100, got 150"):
        make_bench("vt", {"depths": (50, 150)})
    assert make_bench("passkey", {"lengths": "1024,2048"}).options.lengths == (1024, 2048)
    assert len(make_bench("niah", {"samples": 3, "limit": 7})) == 7


@pytest.mark.parametrize(
    "name,options",
    [
        ("vt", {}),
        ("vt", {"chains": 3, "hops": 12}),
        ("niah", {}),
        ("niah", {"family": "multikey", "needles": 6}),
        ("niah", {"family": "multivalue", "needles": 5}),
    ],
)
def test_the_needles_bound_is_no_more_than_an_item_s_needles_take(name, options, tiny):
    """needle_words, which refuses a length before any item is made, is a lower bound on the
    tokens the item's needles and worked example take; past the length, refused at once."""
    bench = make_bench(name, {"lengths": (4096,), "depths": (50,), "samples": 1, **options})
    item = bench.items[0]
    taken = sum(len(tiny.tokenize(text)) for text in [item.before, *(n.text for n in item.needles)] if text)
    assert 0 < bench.needle_words() <= taken
    too_many = {"hops": 100_000} if name == "vt" else {"family": options.get("family", "multikey"), "needles": 100_000, "key_type": "uuids"}
    with pytest.raises(DataError, match=rf"{name}: an item's needles take at least \d+ tokens, more than length 256 holds"):
        make_bench(name, {**options, **too_many, "lengths": (256,)})


def test_a_run_on_the_tiny_model_reports_every_cell(tiny):
    bench = make_bench("niah", {"lengths": (256, 512), "depths": (0, 100), "samples": 1, "max_tokens": 8})
    control, noisy = run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0.5")], runs=1, seed=1)
    cells = {f"accuracy@{n}/{d}" for n in (256, 512) for d in (0, 100)}
    for result in (control, noisy):
        assert cells <= set(result.metrics) and len(result.items["accuracy"]) == 4
        assert result.metrics["accuracy"] == pytest.approx(sum(result.metrics[c] for c in cells) / 4)
        assert all(len(o) <= 8 for o in result.outputs)
    assert noisy.realized.k.values > 0 and "diverged" in noisy.extra
    # One value asked: each item passes or fails, so a single run's interval is Wilson's, from
    # the bench or from its class and options as a report reads them.
    for rows in (aggregate(bench, [control, noisy]), aggregate(Niah, [control, noisy], bench.options)):
        assert {a["items_ci_method"] for a in rows if a["metric"] == "accuracy"} == {"wilson"}


@pytest.mark.parametrize("family,pass_fail", [("single", True), ("multikey", True), ("multivalue", False), ("multiquery", False)])
def test_niah_accuracy_is_pass_fail_when_one_value_is_asked(family, pass_fail):
    assert ("accuracy" in Niah.pass_fail(Niah.Options.parse({"family": family}))) == pass_fail


def test_long_prompts_share_fewer_sequences_unless_parallel_is_given(tiny_path):
    from kvinject.engine.model import Model
    from kvinject.engine.options import BackendOptions

    bench = make_bench("passkey", {})
    with Model(str(tiny_path)) as default, Model(str(tiny_path), BackendOptions(parallel=8)) as given:
        assert (
            bench.sequences(default, 1025) == 7
            and bench.sequences(default, 2049) == 3
            and bench.sequences(default, 4097) == 1
            and bench.sequences(default, 8193) == 1
        )
        assert bench.sequences(given, 8193) == 8


def _record(store: Store, label: str, run: int, metrics: dict[str, float]) -> None:
    settings = {**SETTINGS, "bench": "passkey", "error": label, "model": "m", "options": {"lengths": [1024, 2048], "samples": 1}}
    store.add(f"{label}-cell", run, settings, {**RECORD, "label": label, "run": run, "metrics": metrics})


def test_heatmap_panels_average_runs_per_configuration(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        _record(store, "none", 0, {"accuracy": 0.5, "accuracy@1024/0": 1.0, "accuracy@2048/0": 0.0})
        _record(store, "normal:0,1", 0, {"accuracy": 0.5, "accuracy@1024/0": 1.0, "accuracy@2048/0": 0.0})
        _record(store, "normal:0,1", 1, {"accuracy": 0.0, "accuracy@1024/0": 0.0, "accuracy@2048/0": 0.0})
        records = list(store.records())
    panels = cell_scores(records)
    assert sorted(label for _, label in panels) == ["none", "normal:0,1"]
    noisy = next(cells for (_, label), cells in panels.items() if label == "normal:0,1")
    assert noisy == {(1024, 0): [1.0, 0.0], (2048, 0): [0.0, 0.0]}
    heatmap(records, tmp_path / "h.png")
    assert (tmp_path / "h.png").read_bytes()[:8] == PNG
    with pytest.raises(KvinjectError, match="--heatmap needs per-cell metrics"):
        heatmap([{**r, "metrics": {"accuracy": 1.0}} for r in records], tmp_path / "none.png")


GRID = """
[sweep]
models = ["{model}"]
runs = 1

[bench.passkey]
lengths = [256]
depths = [0, 50, 100]
samples = 1

[bench.niah]
lengths = [256]
depths = [0, 100]
samples = 1

[[cells]]
error = "none@q8_0"
"""


def test_report_tables_and_a_heatmap_from_a_sweep(tmp_path, tiny_path):
    store = swept(tmp_path, GRID.format(model=tiny_path))
    png = tmp_path / "heat.png"
    out = kvinject("report", store, "--heatmap", png)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == PNG
    # Each terminal table's title holds the options its rows share, list-valued ones included.
    out = kvinject("report", store)
    assert out.returncode == 0, out.stderr
    assert "depths 0,50,100" in out.stdout and "depths 0,100" in out.stdout  # as --depths takes them
    # Read back from the store, niah's single-needle accuracy is pass/fail as passkey's is.
    df = summarize(load_records([store]))
    assert set(df[df["metric"] == "accuracy"]["items_ci_method"]) == {"wilson"}


@pytest.mark.slow
def test_the_clean_small_model_finds_the_passkey(smollm):
    bench = make_bench("passkey", {"lengths": (1024,), "depths": (0, 50, 100), "samples": 1})
    (control,) = run(smollm, [bench], [Configuration()], runs=1)
    assert control.metrics["accuracy"] >= 2 / 3
