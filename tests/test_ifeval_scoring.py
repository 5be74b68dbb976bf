"""IFEval file reading, strict/loose scoring and metrics."""

import json
from pathlib import Path

import numpy as np
import pytest

from kvinject.benchmarks import make_bench
from kvinject.benchmarks.ifeval import (
    INSTRUCTIONS,
    IFEvalItem,
    build_instruction,
    exclude,
    loose_variants,
    metrics,
    read_items,
    read_responses,
    score,
    score_responses,
)
from kvinject.benchmarks.ifeval.bench import load_items
from kvinject.exceptions import DataError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "ifeval"
REAL_DATA = Path(__file__).resolve().parents[1].parent / "shared/data/ifeval/input_data.jsonl"


def item(instruction_id, kwargs, key=1, prompt="p"):
    return IFEvalItem(key, prompt, [instruction_id], [kwargs])


def write_lines(tmp_path, *lines):
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = {"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}


# ---------------------------------------------------------------- reading


def test_read_fixture_items_and_responses():
    items = read_items(FIXTURES / "input_data.jsonl")
    assert [i.key for i in items] == [1, 2, 3]
    assert items[1].instruction_id_list == ["startend:end_checker", "length_constraints:number_words"]
    assert items[1].kwargs[1] == {"num_words": 5, "relation": "less than"}
    responses = read_responses(FIXTURES / "responses.jsonl")
    assert [prompt for _, prompt, _ in responses] == [i.prompt for i in items]
    assert responses[2][2] == '{"answer": 42}'


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "bad JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "kwargs"}), "missing key 'kwargs'"),
        (json.dumps({**GOOD, "key": "7"}), "'key' must be int"),
        (json.dumps({**GOOD, "instruction_id_list": [], "kwargs": []}), "instruction_id_list is empty"),
        (json.dumps({**GOOD, "kwargs": [{}, {}]}), "instruction_id_list has 1 entries but kwargs has 2"),
        (json.dumps({**GOOD, "instruction_id_list": ["punctuation:no_commas"]}), "unknown instruction id"),
        (
            json.dumps({**GOOD, "instruction_id_list": ["detectable_format:number_bullet_lists"], "kwargs": [{}]}),
            "detectable_format:number_bullet_lists: missing kwarg(s) num_bullets",
        ),
        (json.dumps({**GOOD, "key": 0}), "duplicate key 0 (first at "),
    ],
    ids=["json", "not-object", "missing-key", "key-type", "no-ids", "lengths", "unknown-id", "bad-kwargs", "dup-key"],
)
def test_read_items_errors_name_file_and_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path, json.dumps({**GOOD, "key": 0}), "", bad_line)
    with pytest.raises(DataError) as excinfo:
        read_items(path)
    assert str(excinfo.value).startswith(f"{path}:3: ")
    assert message in str(excinfo.value)


def test_read_errors_for_missing_file_and_bad_encoding(tmp_path):
    with pytest.raises(DataError, match="cannot read"):
        read_items(tmp_path / "absent.jsonl")
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xff\n")
    with pytest.raises(DataError, match=r":2: not valid UTF-8"):
        read_items(path)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        (json.dumps({"prompt": "q"}), "missing key 'response'"),
        (json.dumps({"prompt": "q", "response": None}), "'response' must be str"),
    ],
    ids=["missing-key", "type"],
)
def test_read_responses_errors_name_file_and_line(tmp_path, bad_line, message):
    path = write_lines(tmp_path, json.dumps({"prompt": "p", "response": "r"}), bad_line)
    with pytest.raises(DataError) as excinfo:
        read_responses(path)
    assert str(excinfo.value).startswith(f"{path}:2: ")
    assert message in str(excinfo.value)


# ---------------------------------------------------------------- loose variants and scoring


def test_loose_variants_are_ifevals_eight_in_order():
    assert loose_variants("a*\nb\nc*") == ["a*\nb\nc*", "a\nb\nc", "b\nc*", "a*\nb", "b", "b\nc", "a\nb", "b"]
    assert loose_variants("one line") == ["one line", "one line", "", "", "", "", "", ""]


def test_fixture_verdicts_and_metrics():
    items = read_items(FIXTURES / "input_data.jsonl")
    verdicts = score_responses(items, read_responses(FIXTURES / "responses.jsonl"), "responses.jsonl")
    assert [v.strict for v in verdicts] == [[False, True], [False, False], [True]]
    assert [v.loose for v in verdicts] == [[True, True], [True, False], [True]]
    assert [v.follow_all_strict for v in verdicts] == [False, False, True]
    assert [v.follow_all_loose for v in verdicts] == [True, False, True]
    # Prompts: 1 of 3 strict, 2 of 3 loose. Instructions: 2 of 5 strict, 4 of 5 loose.
    assert metrics(verdicts) == pytest.approx(
        {
            "prompt_level_strict_acc": 1 / 3,
            "inst_level_strict_acc": 2 / 5,
            "prompt_level_loose_acc": 2 / 3,
            "inst_level_loose_acc": 4 / 5,
        }
    )
    # The bench's per-prompt values, weighted by their instructions, are the pooled 2 of 5
    # (unweighted, 1/2, 0 and 1 would average 1/2): what its intervals resample.
    bench = make_bench("ifeval", {"data": str(FIXTURES / "input_data.jsonl")})
    _, items = bench.summarize(verdicts)
    assert bench.weights["inst_level_strict_acc"] == "instructions" and items["instructions"] == [2, 2, 1]
    assert np.average(items["inst_level_strict_acc"], weights=items["instructions"]) == pytest.approx(2 / 5)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "response"),
    [
        ("detectable_format:json_format", {}, 'Here is the JSON:\n{"a": 1}'),
        ("startend:quotation", {}, 'Sure:\n"Wrapped in quotes."'),
        ("startend:end_checker", {"end_phrase": "Peace!"}, "Goodbye and *peace!*"),
        ("keywords:existence", {"keywords": ["blue whale"]}, "The **blue** whale is big."),
        ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "Of course!\nSay hi.\nHi!"),
        ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "Two points:\n* a\n* b\n- signed, me"),
        ("change_case:english_lowercase", {}, "Sure! Here you go:\nthis is all lower case english text, as asked."),
    ],
)
def test_strict_fails_but_loose_passes(instruction_id, kwargs, response):
    verdict = score(item(instruction_id, kwargs), response)
    assert verdict.strict == [False]
    assert verdict.loose == [True]


def test_empty_response_follows_nothing():
    # no_comma would hold for the empty string; IFEval still counts it as not followed.
    verdict = score(item("punctuation:no_comma", {}), "  \n ")
    assert verdict.strict == [False] and verdict.loose == [False]


def test_verdict_to_dict_is_json_ready():
    verdict = score(item("punctuation:no_comma", {}, key=7, prompt="Say it."), "Said")
    record = json.loads(json.dumps(verdict.to_dict()))
    assert record == {
        "key": 7,
        "prompt": "Say it.",
        "response": "Said",
        "instruction_id_list": ["punctuation:no_comma"],
        "strict": [True],
        "loose": [True],
        "follow_all_strict": True,
        "follow_all_loose": True,
    }


def test_metrics_needs_verdicts():
    with pytest.raises(ValueError, match="no verdicts"):
        metrics([])


# ---------------------------------------------------------------- exclusion


def test_exclude_drops_items_with_any_given_id():
    items = read_items(FIXTURES / "input_data.jsonl")
    kept = exclude(items, ["length_constraints:number_words"])
    assert [i.key for i in kept] == [1, 3]
    assert [i.key for i in exclude(items, [])] == [1, 2, 3]


def test_exclude_rejects_unknown_ids():
    with pytest.raises(DataError, match="length_constraints:word_count"):
        exclude([], ["length_constraints:word_count"])


# ---------------------------------------------------------------- the real IFEval prompts


@pytest.mark.skipif(not REAL_DATA.is_file(), reason="IFEval input_data.jsonl not present")
def test_real_ifeval_file_loads_and_builds():
    items = read_items(REAL_DATA)
    assert len(items) == 541
    ids = {i for item in items for i in item.instruction_id_list}
    assert ids == set(INSTRUCTIONS)
    instances = [(i, kw) for item in items for i, kw in zip(item.instruction_id_list, item.kwargs)]
    assert len(instances) == 834
    for instruction_id, kwargs in instances:
        build_instruction(instruction_id, kwargs)
    # The study drops the 50 prompts that carry a word-count instruction (52 instances).
    assert len(exclude(items, ["length_constraints:number_words"])) == 491


def test_every_response_line_is_scored_in_order_repeated_prompts_included(tmp_path):
    items = read_items(FIXTURES / "input_data.jsonl")
    lines = [json.dumps({"prompt": items[2].prompt, "response": r}) for r in ('{"answer": 42}', "not json", '{"a": 1}')]
    verdicts = score_responses(items, read_responses(write_lines(tmp_path, *lines)), "r.jsonl")
    assert [v.follow_all_strict for v in verdicts] == [True, False, True]


def test_a_response_to_a_prompt_the_data_lacks_names_its_line(tmp_path):
    items = read_items(FIXTURES / "input_data.jsonl")
    path = write_lines(tmp_path, json.dumps({"prompt": items[0].prompt, "response": "r"}), json.dumps({"prompt": "elsewhere", "response": "r"}))
    with pytest.raises(DataError, match=r"r.jsonl:2: the prompt is not one of the data's"):
        score_responses(items, read_responses(path), "r.jsonl")


def test_a_model_without_a_chat_template_reads_the_instruction_as_plain_text(tiny, monkeypatch):
    bench = make_bench("ifeval", {"data": str(FIXTURES / "input_data.jsonl")})
    chat = [tiny.detokenize(t) for t in bench.prompt_tokens(tiny)]
    monkeypatch.setattr(type(tiny), "has_chat_template", property(lambda self: False))
    plain = bench.prompt_tokens(tiny)
    assert plain == [tiny.tokenize(item.prompt, parse_special=False) for item in bench.items]
    assert all(tiny.detokenize(p).strip() == item.prompt.strip() for p, item in zip(plain, bench.items))
    assert all(text.count(item.prompt) == 1 and len(text) > len(item.prompt) for text, item in zip(chat, bench.items))


def test_one_prompt_twice_with_other_instructions_cannot_be_scored_by_prompt(tmp_path):
    """The last of the two was used without a word."""
    first, second = [json.loads(line) for line in (FIXTURES / "input_data.jsonl").read_text().splitlines() if line.strip()][:2]
    data = read_items(write_lines(tmp_path, json.dumps(first), json.dumps({**second, "prompt": first["prompt"]})))
    answers = read_responses(write_lines(tmp_path, json.dumps({"prompt": first["prompt"], "response": "r"})))
    with pytest.raises(DataError, match=rf"twice with other instructions \(keys {first['key']} and {second['key']}\)"):
        score_responses(data, answers, "r.jsonl")
    same = [*data[:1], IFEvalItem(first["key"] + 1, first["prompt"], first["instruction_id_list"], first["kwargs"])]
    assert len(score_responses(same, answers, "r.jsonl")) == 1  # the same instructions twice: either scores alike


def test_data_without_a_prompt_is_named(tmp_path):
    """`score ifeval --data EMPTY --responses R` blamed R's first line."""
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=r"empty.jsonl leaves no item to evaluate for ifeval$"):
        load_items(str(tmp_path / "empty.jsonl"))
