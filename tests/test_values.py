"""One parser for a field's value (kvinject/values.py): an error spec, a bench option and lm-eval's
--model_args read the same text alike, and refuse the same text with the same words."""

from __future__ import annotations

import pytest

from kvinject.benchmarks.options import Options
from kvinject.error_models import parse_error
from kvinject.exceptions import SpecError
from kvinject.lmeval.settings import Settings
from tests.cli_tree import empty_store, invoke


def read_int(text: str) -> list[int]:
    """``text`` as an error model's integer (quant's bits), a bench's (limit) and the lm-eval model's (seed)."""
    return [parse_error(f"quant:{text}").bits, Options.parse({"limit": text}).limit, Settings.parse({"seed": text}).seed]


def test_an_integer_reads_alike_everywhere():
    assert read_int("7") == [7, 7, 7]
    assert read_int("+8") == [8, 8, 8]


@pytest.mark.parametrize("text", ["1_000", "4.0", "nan", "0x10"])
def test_what_is_not_a_plain_integer_is_refused_alike_everywhere(text):
    messages = []
    for read in (lambda: parse_error(f"quant:{text}"), lambda: Options.parse({"limit": text}), lambda: Settings.parse({"seed": text})):
        with pytest.raises(SpecError) as e:
            read()
        messages.append(str(e.value))
    assert all(f"must be an integer, got {text!r}" in m for m in messages), messages


def test_a_string_is_stripped_and_an_empty_one_refused_alike_everywhere():
    assert parse_error("evict:knorm,0.5,query= aware").query == "aware"
    assert Options.parse({"data": " x.jsonl "}).data == "x.jsonl"
    assert Settings.parse({"target": " k "}).target == "k"
    for read in (lambda: parse_error("evict:knorm,0.5,query="), lambda: Options.parse({"data": " "}), lambda: Settings.parse({"target": ""})):
        with pytest.raises(SpecError, match="must be a non-empty string"):
            read()


def test_a_switch_reads_the_words_a_user_types():
    assert [Settings.parse({"kv_rotation": word}).kv_rotation for word in ("off", "no", "false", "on", "True", True)] == [False] * 3 + [True] * 3
    with pytest.raises(SpecError, match="kv_rotation must be true or false, got 'maybe'"):
        Settings.parse({"kv_rotation": "maybe"})


@pytest.mark.parametrize("args", [["--runs", "1_000"], ["--seed", "0x10"], ["--threads", "99999999999999999999"]])
def test_integer_options_are_read_as_every_number_is(args, no_work):
    """`run --runs 1_000` ran a thousand runs where a spec field refuses 1_000; a thread count past
    ggml's limit ended in llama.cpp's std::bad_alloc."""

    code, said = invoke(["run", "--bench", "nexttoken", *args])
    assert code == 2 and ("must be an integer" in said or "between 1 and 512" in said), said


@pytest.mark.parametrize("value", ["nan", "inf", "1_0"])
def test_real_options_are_read_as_every_number_is(value, tmp_path, no_work):

    code, said = invoke(["report", empty_store(tmp_path), "--faults", "bit", "--ctx", "64", "--fit-per-mbit", value])
    assert code == 2 and "must be a number" in said, said


@pytest.mark.parametrize("command", [["info"], ["generate", "Hi"]])
@pytest.mark.parametrize("value", ["0", "-1", "2147483647"])
def test_a_context_size_is_checked_before_any_work(command, value, no_work):
    """`info --ctx 0` ended in a ValueError traceback; 2^31-1 made llama.cpp allocate until killed."""
    code, said = invoke([*command, f"--ctx={value}"])
    assert code == 2 and "--ctx must be between 1 and 1048576 tokens" in said, said
