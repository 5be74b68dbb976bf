"""GSM8K-style benchmark: answer extraction, the problem generator, data, prompts and runs."""

from __future__ import annotations

import json
import random
import re

import pytest

from kvinject.benchmarks.arithmetic import MAX_STEPS, MIN_STEPS, OPS, generate
from kvinject.benchmarks.gsm8k import CHAT_INSTRUCTION, GSM8K, INVALID, extract_flexible, extract_strict, load_items, normalize, truncate
from kvinject.engine.generation.batching import Generation
from kvinject.error_models.configuration import Configuration
from kvinject.exceptions import DataError, SpecError
from kvinject.experiments.runner import run

from .cli_runs import kvinject
from .conftest import SHARED

GSM8K_TEST = SHARED / "data" / "gsm8k" / "test.jsonl"
needs_gsm8k = pytest.mark.skipif(not GSM8K_TEST.exists(), reason="../shared/data/gsm8k not present")


def answers(response: str) -> tuple[str, str]:
    return normalize(extract_strict(response)), normalize(extract_flexible(response))


@pytest.mark.parametrize(
    ("response", "strict", "flexible"),
    [
        ("She has 40 + 2 = 42 marbles.\n#### 42", "42", "42"),
        ("The answer is 42.", INVALID, "42"),
        ("It costs $1,234 in all.", INVALID, "1234"),
        ("#### $1,234", INVALID, "1234"),  # lm-eval's strict pattern takes no "$"
        ("#### 1,234.", "1234", "1234"),
        ("The change is 5 - 8 = -3\n#### -3", "-3", "-3"),
        ("#### 7 then 9 and 11", "7", "11"),  # strict: the first "#### N"; flexible: the last number
        ("From 3 to 4 and finally 5.5", INVALID, "5.5"),
        ("no number here", INVALID, INVALID),
    ],
)
def test_strict_takes_the_first_hash_answer_and_flexible_the_last_number(response, strict, flexible):
    assert answers(response) == (strict, flexible)


def test_scoring_compares_normalized_strings_as_lm_eval_does():
    bench = GSM8K(limit=1, shots=0)
    target = bench.items[0].target

    def score(text: str) -> tuple[float, float]:
        return bench.score(0, Generation([], text, 0, None))

    assert score(f"so {target}.\n#### {target}\n\nQuestion: then 7") == (1.0, 1.0)  # cut at the stop
    assert score(f"The answer is {target}.") == (0.0, 1.0)
    assert score(f"#### {target}.0") == (0.0, 0.0)  # "18.0" is not "18", as in lm-eval
    assert score(f"#### {int(target) + 1}") == (0.0, 0.0)
    assert truncate("a</s>b<|im_end|>c") == "a" and truncate("no stop") == "no stop"


def test_generated_answers_recompute_from_the_numbers_in_the_question():
    problems = generate(300, 7)
    ops = set()
    for p in problems:
        stated = {int(n) for n in re.findall(r"\d+", p.question)}
        results: list[int] = []
        for step in p.steps:
            a, b = (results[arg.step] if arg.step is not None else arg.value for arg in step.args)
            for arg in step.args:
                assert arg.step is not None or arg.value in stated, (p.question, arg)
            if step.op == "/":
                assert a % b == 0
            results.append(OPS[step.op](a, b))
            assert results[-1] == step.result and step.result > 0
            assert f"{a} {step.op} {b} = {step.result}" in step.line
            ops.add(step.op)
        assert p.answer == results[-1] and isinstance(p.answer, int)
        assert MIN_STEPS <= len(p.steps) <= MAX_STEPS
        assert p.solution.endswith(f"\n#### {p.answer}")
    assert ops == set(OPS)
    assert {len(p.steps) for p in problems} == set(range(MIN_STEPS, MAX_STEPS + 1))


def test_generated_problems_follow_the_seed():
    assert generate(20, 3) == generate(20, 3)
    assert generate(5, 3) == generate(20, 3)[:5]
    assert [p.question for p in generate(20, 3)] != [p.question for p in generate(20, 4)]


def test_generated_default_takes_its_shots_from_another_stream():
    bench = GSM8K(problems=50, shots=8)
    assert len(bench) == 50 and len(bench.shots) == 8
    assert not {s.question for s in bench.shots} & {i.question for i in bench.items}
    assert [i.question for i in GSM8K(problems=50, data_seed=1).items] != [i.question for i in bench.items]
    assert len(GSM8K(limit=3)) == 3


def test_few_shot_prompt_is_the_shots_then_the_question():
    bench = GSM8K(limit=2, shots=2)
    a, b = bench.shots
    for item, text in zip(bench.items, bench.prompt_texts):
        assert text == f"Question: {a.question}\nAnswer: {a.solution}\n\nQuestion: {b.question}\nAnswer: {b.solution}\n\nQuestion: {item.question}\nAnswer:"
    assert GSM8K(limit=1, shots=0).prompt_texts[0] == f"Question: {bench.items[0].question}\nAnswer:"


def test_chat_variant_is_zero_shot_through_the_template(tiny):
    bench = GSM8K(limit=1, chat=True)
    assert bench.n_shots == 0 and bench.settings["shots"] == 0 and GSM8K(limit=1).n_shots == 5
    (prompt,) = bench.prompts(tiny)
    user = f"Question: {bench.items[0].question}\n\n{CHAT_INSTRUCTION}"
    assert prompt == tiny.tokenize(tiny.chat_prompt(user), parse_special=True)
    assert tiny.tokenize("<|im_start|>", add_special=False) == prompt[:1]  # the template's, not text


def test_stop_fires_on_a_stop_sequence_in_the_detokenized_text(tiny):
    stop = GSM8K(limit=1).stop(tiny)
    assert stop(tiny.tokenize("So 5 + 4 = 9.\n#### 9\n\nQuestion:", add_special=False))
    assert stop(tiny.tokenize("#### 9</s>", add_special=False, parse_special=False))
    assert not stop(tiny.tokenize("So 5 + 4 = 9.\n#### 9\n\nQuest", add_special=False))


@needs_gsm8k
def test_shots_data_draws_each_question_s_examples_as_lm_eval_s_sampler(tmp_path):
    """--shots-data: every problem of --data is asked, each after k examples drawn from the
    other file by random.Random(1234).sample, question after question (lm-eval's sampler over
    the train split; here a stand-in "train" of 40 rows of the test file)."""
    rows = GSM8K_TEST.read_text().splitlines()
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("\n".join(rows[:40]) + "\n")
    test.write_text("\n".join(rows[40:46]) + "\n")
    bench = GSM8K(data=str(test), shots_data=str(train), shots=3)
    assert len(bench) == 6 and bench.shots == []
    pool = load_items(str(train))
    rnd = random.Random(1234)
    for text, item in zip(bench.prompt_texts, bench.items):
        chosen = rnd.sample(pool, 3)
        assert text == "".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in chosen) + f"Question: {item.question}\nAnswer:"
    assert len(set(bench.shot_texts)) > 1, "each question its own examples"
    # Drawn from the evaluated set itself: one more, the question asked left out, as lm-eval does.
    same = GSM8K(data=str(test), shots_data=str(test), shots=3)
    rnd = random.Random(1234)
    for text, item in zip(same.prompt_texts, same.items):
        chosen = [s for s in rnd.sample(same.items, 4) if s.question != item.question][:3]
        assert text.startswith("".join(f"Question: {s.question}\nAnswer: {s.solution}\n\n" for s in chosen)) and text.count(item.question) == 1
    with pytest.raises(DataError, match="holds 40 problems, fewer than the 50 worked examples asked"):
        GSM8K(data=str(test), shots_data=str(train), shots=50)


@needs_gsm8k
def test_gsm8k_file_loads_with_its_first_items_as_shots_and_through_datasets(tmp_path, monkeypatch):
    bench = GSM8K(data=str(GSM8K_TEST))
    assert len(bench.shots) == 5 and len(bench) == 1319 - 5
    assert bench.shots[0].target == "18" and bench.shots[0].question.startswith("Janet")
    assert all(re.fullmatch(r"-?\d+", i.target) for i in bench.items)
    rows = [json.loads(line) for line in GSM8K_TEST.read_text().splitlines()]
    with_commas = next(r for r in rows if "," in r["answer"].split("####")[-1])
    assert "," not in load_items(str(GSM8K_TEST))[rows.index(with_commas)].target
    assert "<<" in bench.prompt_texts[0]  # the shots' worked solutions as GSM8K writes them

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    local = tmp_path / "gsm8k"
    local.mkdir()
    (local / "test.jsonl").symlink_to(GSM8K_TEST)
    from_hub = GSM8K(data=f"hf:{local}@test", limit=20)
    assert [i.question for i in from_hub.items] == [i.question for i in bench.items[:20]]
    assert [i.target for i in from_hub.items] == [i.target for i in bench.items[:20]]


def test_bad_data_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "q", "answer": "1 + 1 = 2\n#### 2"})
    bad.write_text(good + "\n" + json.dumps({"question": "q"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: missing key 'answer'"):
        GSM8K(data=str(bad), shots=0)
    bad.write_text(good + "\n\n" + json.dumps({"question": "q", "answer": "2"}) + "\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: the answer does not end in '#### N'"):
        GSM8K(data=str(bad))
    bad.write_text(good + "\n")
    with pytest.raises(DataError, match="none left to evaluate after the 5 worked examples"):
        GSM8K(data=str(bad))
    assert GSM8K(data=str(bad), shots=0).items[0].target == "2"


def test_runs_under_the_control_and_an_error_on_the_tiny_model(tiny):
    bench = GSM8K(limit=2, shots=1, max_tokens=12)
    control, noisy = run(tiny, [bench], [Configuration(), Configuration.parse("normal:0,0.5")], runs=1, seed=1)
    scores = {"exact_match_flexible", "exact_match_strict"}
    for result in (control, noisy):
        assert set(result.metrics) == scores | {"bits"}
        assert all(len(v) == 2 for v in result.items.values())
        assert all(set(v) <= {0.0, 1.0} for k, v in result.items.items() if k != "token_match")
        assert len(result.texts) == 2 and "responses" in result.to_dict()
    outcomes = {"masked", "benign", "sdc", "due"}
    assert set(control.items) == scores and set(noisy.items) == scores | outcomes | {"diverged", "token_match"}
    assert all(0 <= m <= 1 for m in noisy.items["token_match"])
    assert control.extra == {} and set(noisy.extra) == {"diverged", "first_diff", "token_match"} | outcomes
    assert 0 <= noisy.extra["diverged"] <= 1 and noisy.realized.k.values > 0


def test_smollm_answers_in_the_shots_format_and_stops_at_the_next_question(smollm):
    # Measured on the first 3 generated problems: with 8 shots SmolLM2-135M-Instruct ends each
    # solution with a "#### N" line and starts a new "Question:" within 60 tokens (with 3 shots
    # it loops on the first problem until the cap).
    bench = GSM8K(limit=2, shots=8, max_tokens=128)
    (control,) = run(smollm, [bench], [Configuration()], runs=1)
    for text, tokens in zip(control.texts, control.outputs):
        assert extract_strict(text) != INVALID, text
        assert text.endswith("Question:") and len(tokens) < 128, text  # the stop, not the cap


def test_a_prompt_past_the_models_training_context_is_refused_before_any_compute(tiny_path):
    """300 worked examples (38K tokens) ran on a 4K model; 5000 grew to 5.6 GB before a timeout."""
    out = kvinject("run", "--bench", "gsm8k", "--shots", "300", "--limit", "1", "--runs", "1", "--model", tiny_path)
    assert out.returncode != 0 and "training context of 4096" in out.stderr and "Traceback" not in out.stderr


def test_counts_that_would_be_generated_whole_before_limit_are_bounded():
    """--problems 100000000 grew memory until killed (every problem is made before --limit picks)."""
    with pytest.raises(SpecError, match="--problems must be at most 100000, got 100000000"):
        GSM8K.Options.parse({"problems": 100_000_000}, cli=True)
