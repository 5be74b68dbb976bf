"""kvinject as an lm-evaluation-harness model: each request type against a direct computation on
the tiny model, lm-eval's own command line end to end on tasks written at test time over local
files, and one-line errors for bad --model_args before any model loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvinject.engine.context import Context
from kvinject.engine.generation.cache_free import one_pass
from kvinject.exceptions import SpecError

from .cli_runs import kvinject

pytest.importorskip("lm_eval")

from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from kvinject.lmeval.model import KvinjectLM  # noqa: E402


def request(*args):
    return SimpleNamespace(args=args)


@pytest.fixture(scope="module")
def lm(tiny_path):
    return KvinjectLM(model=str(tiny_path), parallel=4, max_length=64)


def direct(model, context, continuation):
    """The continuation's log-probability and greedy match from one cache-free pass on a fresh
    context of one sequence: nothing batched, nothing shared."""
    with Context(model, n_ctx=128) as ctx:
        rows = one_pass(ctx, context, continuation[:-1]).astype(np.float64)
    lse = np.log(np.exp(rows - rows.max(1, keepdims=True)).sum(1)) + rows.max(1)
    return float((rows[np.arange(len(continuation)), continuation] - lse).sum()), bool((rows.argmax(1) == continuation).all())


def test_loglikelihood_is_the_sum_of_the_continuation_token_log_probabilities(lm):
    # Shared contexts (several choices), single-token continuations and more requests than sequences.
    pairs = [("The cat sat on", c) for c in (" the mat", " a", " the roof of the house")] + [("One two", " three four"), ("x", " y")] * 2
    got = lm.loglikelihood([request(*p) for p in pairs], disable_tqdm=True)
    for (context, continuation), (logprob, greedy) in zip(pairs, got):
        want = direct(lm.model, *lm._encode_pair(context, continuation))
        # Batched rows and shared cells run other kernels' summation orders than one pass alone.
        assert logprob == pytest.approx(want[0], rel=1e-4, abs=1e-4)
        assert greedy == want[1]


def test_is_greedy_is_true_for_the_greedy_continuation_only(lm):
    context = lm.tok_encode("Once upon a time")
    with Context(lm.model, n_ctx=128) as ctx:
        first = int(np.argmax(one_pass(ctx, context, [])[0]))
    text = lm.model.detokenize([first])
    assert lm.loglikelihood([request("Once upon a time", text)], disable_tqdm=True)[0][1] is (lm._encode_pair("Once upon a time", text)[1] == [first])
    other = lm.model.detokenize([(first + 1) % lm.model.n_vocab])
    assert lm.loglikelihood([request("Once upon a time", other)], disable_tqdm=True)[0][1] is False


def test_rolling_loglikelihood_scores_every_token_once_in_lm_evals_windows(lm):
    text = "one two three four five six seven eight nine ten " * 15
    tokens = lm.tok_encode(text, add_special_tokens=False)
    assert len(tokens) > 2 * lm.max_length  # several windows
    windows = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, lm.prefix_token_id, lm.max_length, 1)]
    assert sum(len(k) for _, k in windows) == len(tokens)
    want = sum(direct(lm.model, c, k)[0] for c, k in windows)
    assert lm.loglikelihood_rolling([request(text)], disable_tqdm=True)[0] == pytest.approx(want, rel=1e-4)


def test_generation_stops_at_until_and_max_gen_toks(lm):
    free = lm.generate_until([request("The", {"max_gen_toks": 12})], disable_tqdm=True)[0]
    tokens = lm.tok_encode(free, add_special_tokens=False)
    assert 0 < len(tokens) <= 12
    assert len(lm.tok_encode(lm.generate_until([request("The", {"max_gen_toks": 3})], disable_tqdm=True)[0], add_special_tokens=False)) <= 3
    stop = free.strip()[len(free.strip()) // 2 :][:2]  # a piece of the greedy text: generation ends before it
    cut = lm.generate_until([request("The", {"max_gen_toks": 12, "until": [stop]})], disable_tqdm=True)[0]
    assert stop not in cut and free.startswith(cut) and len(cut) < len(free)


def test_an_unsupported_generation_option_is_refused(lm):
    with pytest.raises(SpecError, match="'top_p' is not supported"):
        lm.generate_until([request("The", {"top_p": 0.9})], disable_tqdm=True)


def test_the_error_reaches_the_cache_and_moves_the_scores(tiny_path, lm):
    noisy = KvinjectLM(model=str(tiny_path), parallel=4, max_length=64, error="normal:0,0.5", seed=3)
    pairs = [request("The cat sat on", " the mat"), request("One two", " three four")]
    clean, moved = lm.loglikelihood(pairs, disable_tqdm=True), noisy.loglikelihood(pairs, disable_tqdm=True)
    assert all(a[0] != b[0] for a, b in zip(clean, moved))
    assert noisy.realized.k.values > 0 and noisy.realized.k.rel_err_std == pytest.approx(0.5, rel=0.2)
    again = KvinjectLM(model=str(tiny_path), parallel=1, max_length=64, error="normal:0,0.5", seed=3)
    # A request's noise is seeded by its tokens: the same whatever shares its decodes.
    assert [r[0] for r in again.loglikelihood(pairs[::-1], disable_tqdm=True)][::-1] == pytest.approx([r[0] for r in moved], rel=1e-4)


@pytest.mark.parametrize(
    "args, message",
    [
        ({"modle": "x"}, "kvinject takes no 'modle'"),
        ({"error": "nrmal:0,1"}, "unknown error model 'nrmal'"),
        ({"error": "none@q9"}, "after @ give the cache types"),
        ({"layers": "3-1"}, r"^--model_args: bad layers '3-1'"),
        ({"flash_attn": "maybe"}, r"^--model_args: flash_attn must be auto, on or off"),
        ({"parallel": 0}, r"^--model_args: parallel must be"),
        ({"seed": "x"}, "seed must be an integer"),
    ],
)
def test_bad_model_args_fail_in_one_line_before_a_model_loads(args, message):
    with pytest.raises(SpecError, match=message):
        KvinjectLM(model="/nonexistent.gguf", **args)  # a model that would fail to load: the args fail first


CHOICE = """task: kvinject_tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""

GENERATE = """task: kvinject_tiny_generate
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
"""


def test_lm_eval_runs_tasks_end_to_end_through_kvinject_lm_eval(tmp_path, tiny_path):
    rows = [{"question": f"{a} plus {b} is", "choices": [f" {a + b}", f" {a + b + 1}", " seven"], "answer": 0} for a, b in ((1, 2), (3, 4), (5, 1))]
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.yaml").write_text(CHOICE.format(data=data))
    (tasks / "generate.yaml").write_text(GENERATE.format(data=data))
    out = kvinject(
        "lm-eval", "--model", "kvinject", "--model_args", f"model={tiny_path}", "error='normal:0,0.25'", "parallel=2", "max_length=128",
        "--tasks", "kvinject_tiny_choice,kvinject_tiny_generate", "--include_path", tasks, "--output_path", tmp_path / "out", "--log_samples",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    got = json.loads(results.read_text())["results"]
    assert 0 <= got["kvinject_tiny_choice"]["acc,none"] <= 1 and 0 <= got["kvinject_tiny_generate"]["exact_match,none"] <= 1
    samples = [json.loads(line) for f in (tmp_path / "out").rglob("samples_kvinject_tiny_choice_*.jsonl") for line in f.read_text().splitlines()]
    assert len(samples) == 3 and all(len(s["resps"]) == 3 for s in samples)  # three choices scored per item
    assert "kvinject: normal:0,0.25: K " in out.stderr and "relative error" in out.stderr
    (realized,) = json.loads((tmp_path / "out" / "kvinject.json").read_text())
    assert realized["error"] == "normal:0,0.25" and realized["realized"]["k"]["values"] > 0
    assert realized["realized"]["k"]["rel_err_std"] == pytest.approx(0.25, rel=0.2)


def test_kvinject_lm_eval_help_names_the_model_args():
    out = kvinject("lm-eval", "--help")
    assert out.returncode == 0
    assert "--model_args (key=value" in out.stdout and "--tasks" in out.stdout


def test_without_the_extra_kvinject_lm_eval_says_how_to_install_it(tmp_path):
    (tmp_path / "lm_eval").mkdir()
    (tmp_path / "lm_eval" / "__init__.py").write_text("raise ImportError('not installed')\n")  # lm-eval as absent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    out = subprocess.run([sys.executable, "-m", "kvinject", "lm-eval", "--tasks", "x"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == "error: kvinject lm-eval needs lm-evaluation-harness: pip install 'kvinject[lm-eval]'"


FIXTURES = Path(__file__).resolve().parent / "fixtures" / "lmeval"
WIKITEXT = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


def test_both_directions_score_each_document_alike(tmp_path, tiny_path):
    """lm-eval driving kvinject (`kvinject lm-eval`) and kvinject driving lm-eval (the lmeval bench)
    give each document the same score under the same configuration and seed: one definition of
    the task, and each request's noise seeded by its tokens in both."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.yaml").write_text((FIXTURES / "choice.yaml").read_text().replace("test: items.jsonl", f"test: {FIXTURES / 'items.jsonl'}"))
    harness = kvinject(
        "lm-eval", "--model", "kvinject", "--model_args", f"model={tiny_path}", "error='normal:0,0.5'", "seed=4",
        "--tasks", "kvinject_tiny_choice", "--include_path", tasks, "--output_path", tmp_path / "out", "--log_samples",
    )  # fmt: skip
    assert harness.returncode == 0, harness.stderr[-3000:]
    (samples,) = (tmp_path / "out").rglob("samples_kvinject_tiny_choice_*.jsonl")
    by_harness = [s["acc"] for s in sorted(map(json.loads, samples.read_text().splitlines()), key=lambda s: s["doc_id"])]
    bench = kvinject(
        "run", "--model", tiny_path, "--bench", "lmeval", "--task", "kvinject_tiny_choice", "--include-path", FIXTURES,
        "--data", FIXTURES / "items.jsonl", "--error", "normal:0,0.5", "--seed", "4", "--runs", "1", "--format", "json",
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    records = {r["label"]: r for r in json.loads(bench.stdout)["records"]}
    assert records["normal:0,0.5"]["items"]["score"] == by_harness
    assert records["normal:0,0.5"]["metrics"]["kvinject_tiny_choice/acc,none"] == pytest.approx(sum(by_harness) / len(by_harness))
    assert records["normal:0,0.5"]["realized"]["k"]["values"] > 0 and records["none"]["realized"]["k"]["values"] == 0


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "name the tasks with --task"),
        ({"task": ("no_such_task_here",)}, "lm-eval has no task 'no_such_task_here'"),
        ({"task": ("kvinject_tiny_choice", "kvinject_tiny_generate"), "data": "x.jsonl"}, "replaces the dataset of one task"),
        ({"task": ("kvinject_tiny_choice",), "data": "/nonexistent.jsonl"}, "no such file"),
        ({"task": ("kvinject_tiny_choice",), "shots_data": "x.jsonl"}, "--shots-data goes with --data"),
        ({"task": ("kvinject_tiny_rolling",), "data": str(FIXTURES / "items.jsonl")}, "kvinject_tiny_rolling scores no document on its own"),
        ({"task": ("kvinject_tiny_choice", "kvinject_tiny_generate")}, "score by different metrics"),
        ({"task": ("kvinject_tiny_generate",), "gen_kwargs": "top_p=0.9"}, "--gen-kwargs sets do_sample, max_gen_toks, temperature, until, got 'top_p=0.9'"),
    ],
)
def test_the_lmeval_bench_refuses_what_it_cannot_run_in_one_line(options, message, monkeypatch):
    monkeypatch.chdir(FIXTURES)  # the YAMLs' own relative data files, for the tasks given no --data
    from kvinject.benchmarks import make_bench
    from kvinject.exceptions import DataError

    with pytest.raises(DataError, match=message):
        make_bench("lmeval", {"include_path": str(FIXTURES), **options})


def test_data_replaces_the_documents_of_a_task_that_makes_them_in_code(tmp_path):
    """kvinject_nextword makes its documents in code (custom_dataset): --data was ignored without
    a word, and its own 2766 documents scored. An empty file said only StopIteration."""
    from kvinject.benchmarks.lmeval import TASKS
    from kvinject.exceptions import DataError
    from kvinject.lmeval.tasks import task_set

    docs = [{"prompt": "The cat sat on the", "choices": [" mat", " moon", " idea", " seven"], "answer": 0}] * 2
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    tasks = task_set(("kvinject_nextword",), [TASKS], data=str(tmp_path / "mine.jsonl"))
    assert tasks.docs(None) == {"kvinject_nextword": 2}
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="--data .*empty.jsonl: the file is empty"):
        task_set(("kvinject_nextword",), [TASKS], data=str(tmp_path / "empty.jsonl"))


def test_tasks_the_include_folders_hold_are_found_without_lm_evals_own(tmp_path):
    """Plain tasks of the include folders are looked up in those alone (lm-eval's own 14,000
    YAMLs take 10 s to index); with one of lm-eval's tasks, or a group, the whole index."""
    from kvinject.lmeval.tasks import task_set

    assert "hellaswag" not in task_set(("kvinject_tiny_choice",), [FIXTURES]).manager.all_tasks
    assert "hellaswag" in task_set(("kvinject_tiny_choice", "hellaswag"), [FIXTURES]).manager.all_tasks
    (tmp_path / "group.yaml").write_text("group: kvinject_tiny_group\ntask:\n  - kvinject_tiny_choice\n  - hellaswag\n")
    assert "hellaswag" in task_set(("kvinject_tiny_group",), [FIXTURES, tmp_path]).manager.all_tasks


def test_a_chunk_s_loglikelihood_equals_the_perplexity_bench_nll(tiny):
    """The same tokens after the same context: a log-likelihood request of a chunk's second half
    after its first half is the perplexity bench's NLL of that chunk (llama-perplexity's)."""
    from kvinject.benchmarks import make_bench
    from kvinject.engine.generation.likelihood import score_continuations
    from kvinject.error_models.configuration import Configuration
    from kvinject.experiments.runner import run

    bench = make_bench("perplexity", {"ctx": 64, "chunks": 3, **({"data": str(WIKITEXT)} if WIKITEXT.exists() else {})})
    (result,) = run(tiny, [bench], [Configuration()], runs=1)
    tokens = bench.tokens(tiny)
    with Context(tiny, n_ctx=128) as ctx:
        for c, nll in enumerate(result.items["mean_nll"]):
            piece = tokens[c * 64 : (c + 1) * 64]
            if tiny.adds_bos:
                piece[0] = tiny.bos  # as llama-perplexity starts every chunk of a model that wants BOS
            (scored,) = score_continuations(ctx, [(piece[:33], piece[33:])])
            # One decode of the whole chunk there, a prefill and a continuation here: other kernels' sums.
            assert -scored.logprob / 31 == pytest.approx(nll, rel=1e-4)


def test_kvinject_nextword_task_offers_the_true_next_word_among_distinct_choices():
    from kvinject.benchmarks.lmeval import TASKS
    from kvinject.benchmarks.nexttoken import make_snippets, normalize_word
    from kvinject.data import read_text

    import_path = str(TASKS)
    sys.path.insert(0, import_path)
    try:
        from nextword import docs  # as lm-eval's !function loads it, from the task's folder
    finally:
        sys.path.remove(import_path)
    rows = docs()["test"]
    snippets = make_snippets(read_text(None, "encyclopedia"))
    assert len(rows) == len(snippets)
    for row, snippet in zip(rows, snippets):
        assert row["prompt"] == snippet.prompt and row["choices"][row["answer"]] == f" {snippet.target}"
        assert len({normalize_word(c) for c in row["choices"]}) == 4
    assert {row["answer"] for row in rows} == {0, 1, 2, 3}
    assert list(docs()["test"]) == list(rows)  # seeded


def test_kvinject_nextword_runs_as_a_bench(tiny):
    from kvinject.benchmarks import make_bench
    from kvinject.error_models.configuration import Configuration
    from kvinject.experiments.runner import run

    bench = make_bench("lmeval", {"task": ("kvinject_nextword",), "limit": 3})
    (result,) = run(tiny, [bench], [Configuration()], runs=1)
    assert len(result.items["score"]) == 3 and set(result.items["score"]) <= {0.0, 1.0}
    assert {"kvinject_nextword/acc,none", "kvinject_nextword/acc_norm,none"} <= set(result.metrics)


def test_kvinject_lm_eval_defaults_to_the_kvinject_model_and_finds_kvinject_tasks(tiny_path, tmp_path):
    out = kvinject("lm-eval", "--model_args", f"model={tiny_path}", "--tasks", "kvinject_nextword", "--limit", "2", "--output_path", tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (results,) = tmp_path.rglob("results_*.json")
    saved = json.loads(results.read_text())
    assert saved["config"]["model"] == "kvinject" and "kvinject_nextword" in saved["results"]


def test_a_request_s_noise_is_the_same_whatever_shares_its_decodes(tiny_path):
    """A context's noise comes from its tokens and each choice's from its own: six choices of one
    context on two sequences or on eight, in another order, get the same error."""
    choices = [" a", " b c", " d e f", " g", " h i", " j k l m"]
    requests = [request("The cat sat on the", c) for c in choices]
    scores = []
    for parallel, order in ((2, choices), (8, choices[::-1])):
        lm = KvinjectLM(model=str(tiny_path), parallel=parallel, max_length=64, error="normal:0,0.5", seed=2)
        got = dict(zip(order, lm.loglikelihood([request("The cat sat on the", c) for c in order], disable_tqdm=True)))
        scores.append([got[c][0] for c in choices])
    clean = KvinjectLM(model=str(tiny_path), parallel=8, max_length=64).loglikelihood(requests, disable_tqdm=True)
    assert scores[0] == pytest.approx(scores[1], rel=1e-4) and scores[0] != pytest.approx([c[0] for c in clean], rel=1e-4)


def test_faults_are_placed_in_each_request_s_context(tiny_path):
    """`faults:K` places K faults in an item's prompt: here each request's context, decoded for
    it alone (a shared context would be one item's)."""
    lm = KvinjectLM(model=str(tiny_path), parallel=4, max_length=64, error="faults:1,bit=14")
    got = lm.loglikelihood([request("The cat sat on the", c) for c in (" mat", " roof of it", " sofa")], disable_tqdm=True)
    assert len(got) == 3 and lm.realized.k.values + lm.realized.v.values > 0


def test_a_pass_fail_headline_gets_wilson_and_exact_mcnemar_a_graded_one_the_bootstrap_and_wilcoxon():
    """The lmeval bench's score is pass/fail for acc, exact_match and IFEval's prompt-level
    accuracies, graded for f1 and the like: its tests follow the values, as kvinject's own benches
    declare theirs (docs/lm-eval.md's IFEval run: 13 of 100 prompts right, 7 under normal:0,0.25, b=10, c=4)."""
    from kvinject.analysis.aggregate import aggregate
    from kvinject.benchmarks.base import RunResult
    from kvinject.benchmarks.lmeval import LMEval
    from kvinject.engine.realized_error import Realized
    from kvinject.error_models.configuration import Configuration

    clean = [1.0] * 13 + [0.0] * 87
    noisy = [1.0] * 3 + [0.0] * 10 + [1.0] * 4 + [0.0] * 83
    graded = [v * 0.5 + 0.25 for v in clean], [v * 0.5 + 0.2 for v in noisy]

    def rows(control, treated):
        results = [
            RunResult("lmeval", Configuration.parse(spec), 0, {"score": float(np.mean(v))}, {"score": v}, Realized.empty())
            for spec, v in (("none", control), ("normal:0,0.25", treated))
        ]
        return aggregate(LMEval, results, LMEval.Options.parse({"task": ["x"]}))

    control, treated = rows(clean, noisy)
    assert (control["items_ci_method"], treated["test"]["test"], treated["test"]["b"], treated["test"]["c"]) == ("wilson", "mcnemar_exact", 10, 4)
    assert treated["test"]["p_value"] == pytest.approx(0.1796, abs=1e-4)
    control, treated = rows(*graded)
    assert (control["items_ci_method"], treated["test"]["test"]) == ("bootstrap", "wilcoxon")


def test_the_lmeval_bench_passes_generation_settings_to_the_tasks(tiny, monkeypatch):
    """--gen-kwargs reaches every generation request, as lm-eval's --gen_kwargs: a cap of one token
    writes fewer values to the cache than the task's own six."""
    monkeypatch.chdir(FIXTURES)
    from kvinject.benchmarks import make_bench
    from kvinject.error_models.configuration import Configuration

    def values(**options):
        bench = make_bench("lmeval", {"task": ("kvinject_tiny_generate",), "include_path": str(FIXTURES), **options})
        (result,) = bench.evaluate(tiny, [(Configuration.parse("normal:0,0.5"), [0])], 0, lambda n: None)
        return result.realized.k.values

    assert values(gen_kwargs="max_gen_toks=1") < values()


@pytest.mark.parametrize("given", [["--model_args", "error=normal:0,0.25"], ["--model_args=model=smollm2,error=normal:0,0.25,seed=1"]])
def test_a_spec_s_comma_in_model_args_says_how_to_quote_it(given):
    """lm-eval's own message, "expected `key=value`, got '0.25'", did not say why."""
    out = kvinject("lm-eval", "--model", "kvinject", *given, "--tasks", "kvinject_nextword")
    said = "error: --model_args: '0.25' is no key=value: a comma separates model arguments, so a value that holds one is quoted: "
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [said + """'error="normal:0,0.25"' (in single quotes for the shell)"""], out.stderr


@pytest.mark.parametrize(
    "command, flag",
    [
        (["run", "-b", "lmeval", "--task", "kvinject_nextword", "--include-path"], "--include-path"),
        (["lm-eval", "--tasks", "x", "--include_path"], "--include_path"),
        (["lm-eval", "ls", "tasks", "--include"], "--include_path"),  # a prefix, as lm-eval's parser reads it
    ],
)
@pytest.mark.parametrize("where, said", [("missing", "no such folder (a folder of lm-eval task YAMLs)"), ("empty", "the folder holds no task YAMLs")])
def test_a_task_folder_that_is_not_one_is_refused(tmp_path, command, flag, where, said):
    """lm-eval skipped a folder that does not exist without a word, and kvinject recorded the path."""
    (tmp_path / "empty").mkdir()
    out = kvinject(*command, str(tmp_path / where))
    assert out.returncode == 2 and out.stderr.strip() == f"error: {flag} {tmp_path / where}: {said}", out.stderr


TASK = "task: mine\ndataset_path: json\ndataset_kwargs: {data_files: {test: DOCS}}\noutput_type: loglikelihood\ntest_split: test\n"
BROKEN_TASKS = {  # a field of a working task's YAML changed, and what lm-eval says of it
    "dataset": ("DOCS", "MISSING", "Unable to find"),
    "function": ('doc_to_text: "{{x}}"', "doc_to_text: !function no_module.fn", "Cannot import module 'no_module' for function 'fn'"),
    "metric": ("metric: acc", "metric: no_such_metric", "KeyError: None"),
    "template": ('doc_to_text: "{{x}}"', 'doc_to_text: "{{missing.field}}"', "'missing' is undefined"),
    # generate_until, lm-eval's default, scored by acc: lm-eval fails summing the scores
    "output type": ("output_type: loglikelihood\n", "", "(raised in lm_eval/api/metrics.py:"),
}


@pytest.mark.parametrize(
    "broken, command",
    [(b, "run") for b in BROKEN_TASKS] + [(b, "lm-eval") for b in ("function", "template", "output type")],
)
def test_a_task_lm_eval_cannot_load_or_score_is_refused_in_one_line(tmp_path, broken, command):
    """A task YAML lm-eval refuses ended the lmeval bench in a traceback (FileNotFoundError,
    ImportError, KeyError, jinja2's UndefinedError), and `kvinject lm-eval` in an ImportError's;
    one it fails on after the model's work, in a TypeError's from lm-eval's code."""
    (tmp_path / "docs.jsonl").write_text('{"x": "The cat", "y": " sat"}\n')
    (tmp_path / "tasks").mkdir()
    working = TASK + 'doc_to_text: "{{x}}"\ndoc_to_target: "{{y}}"\nmetric_list:\n  - metric: acc\n'
    was, now, said = BROKEN_TASKS[broken]
    yaml = working.replace(was, now).replace("DOCS", str(tmp_path / "docs.jsonl")).replace("MISSING", str(tmp_path / "missing.jsonl"))
    (tmp_path / "tasks" / "mine.yaml").write_text(yaml)
    if command == "run":
        out = kvinject("run", "-b", "lmeval", "--task", "mine", "--include-path", tmp_path / "tasks", "--limit", "1", "--runs", "1")
        prefix = "error: lmeval: lm-eval cannot " + ("evaluate" if broken == "output type" else "load") + " mine: "
    else:
        out = kvinject("lm-eval", "--tasks", "mine", "--include_path", tmp_path / "tasks", "--limit", "1")
        prefix = "error: lm-eval: "
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1 and errors[0].startswith(prefix) and said in errors[0], out.stderr


@pytest.mark.parametrize(
    "config, said",
    [
        # kvinject's own --model kvinject, added to the command line, replaced the file's without a word
        ("model: no_such_model\ntasks: kvinject_nextword\nlimit: 1\n", "error: lm-eval: Attempted to load model 'no_such_model'"),
        ("tasks: [kvinject_nextword, kvinject_nextword]\n", "error: --tasks gives 'kvinject_nextword' twice"),
        ("tasks: kvinject_nextword\nlimit: .nan\n", "error: --limit must be a number, got 'nan'"),
        ("tasks: kvinject_nextword\nmodel_args: {batch_size: 2}\n", "error: --model_args: batch_size is lm-eval's own option"),
        ("tasks: [kvinject_nextword\n", "error: lm-eval: --config {path}: Invalid YAML in"),
        ("tasks: true\n", "error: lm-eval: 'bool' object is not iterable"),  # a value of another type: lm-eval's own words
        (None, "error: lm-eval: --config {path}: Config file not found"),
    ],
)
def test_what_lm_eval_s_config_file_gives_is_checked_as_the_command_line_is(tmp_path, config, said):
    path = tmp_path / "config.yaml"
    if config is not None:
        path.write_text(config)
    out = kvinject("lm-eval", "--config", path)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1 and errors[0].startswith(said.format(path=path)), out.stderr


def test_an_error_is_lm_eval_s_refusal_where_a_dependency_raised_it():
    """lm-eval checks few of a task's fields: what it raises can be of any kind (a StopIteration
    for `data_files: {test: []}`), and only where it was raised tells it from a bug of kvinject's."""
    import json

    from kvinject.lmeval.refusals import from_below, said
    from kvinject.values import parse_int

    def caught(call):
        try:
            call()
        except Exception as e:
            return e
        raise AssertionError("nothing raised")

    below, own = caught(lambda: json.loads("{")), caught(lambda: parse_int("n", "x"))
    assert from_below(below) and not from_below(own) and not from_below(ValueError("never raised"))
    assert said(KeyError(None)) == "KeyError: None" and said(StopIteration()) == "StopIteration"
    code = "try:\n    json.loads('{')\nexcept ValueError as e:\n    raise RuntimeError('generating the dataset') from e"
    chained = caught(lambda: exec(code, {"json": json}))
    assert said(chained) == "generating the dataset (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"


@pytest.mark.parametrize("flag", ["--include-path", "--include_path"])
@pytest.mark.parametrize(
    "text, said",
    [
        ("task: null\n", "{flag} {folder}: {yaml}: task must be the task's name, got None"),  # lm-eval's index: a TypeError
        ("task: [mine\n", "lm-eval skipped {yaml} (while parsing a flow sequence"),  # lm-eval: "no task", without a word why
    ],
)
def test_a_task_yaml_lm_eval_cannot_index_or_skips_is_named(tmp_path, flag, text, said):
    (tmp_path / "mine.yaml").write_text(text)
    if flag == "--include-path":
        out = kvinject("run", "-b", "lmeval", "--task", "mine", flag, tmp_path, "--limit", "1", "--runs", "1")
    else:
        out = kvinject("lm-eval", "--tasks", "mine", flag, tmp_path, "--limit", "1")
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    expected = said.format(flag=flag, folder=tmp_path, yaml=tmp_path / "mine.yaml")
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1 and expected in errors[0], out.stderr


@pytest.mark.parametrize(
    "given, said",
    [
        (["--tasks", "no_such_task"], "error: lm-eval: Tasks not found: no_such_task"),
        (["-t", "kvinject_nextword", "--bogus"], "error: lm-eval: unrecognized arguments: --bogus"),
        (["-t", "kvinject_nextword", "-M", "no_such_model"], "error: lm-eval: Attempted to load model 'no_such_model'"),
        (["-t", "kvinject_nextword", "--limit", "nan"], "error: --limit must be a number, got 'nan'"),
        (["-t", "kvinject_nextword", "-L", "0"], "error: --limit must be above 0"),
        (["-t", "kvinject_nextword", "-f", "1_000"], "error: --num_fewshot must be an integer, got '1_000'"),
        (["-t", "kvinject_nextword", "-a", "batch_size=4"], "error: --model_args: batch_size is lm-eval's own option: give it as --batch_size"),
        (["-t", "kvinject_nextword,kvinject_nextword"], "error: --tasks gives 'kvinject_nextword' twice"),
        (["-t", "kvinject_nextword", "-L", "1", "--verbosity", "bogus"], "error: --verbosity must be a logging level"),
        # each flag as lm-eval's parser also reads it: a short form's value attached, a prefix of the long one
        (["-tkvinject_nextword", "-Lnan"], "error: --limit must be a number, got 'nan'"),
        (["-t", "kvinject_nextword", "--lim=0"], "error: --limit must be above 0"),
        (["--task", "kvinject_nextword", "--num", "1_000"], "error: --num_fewshot must be an integer, got '1_000'"),
        (["-t", "kvinject_nextword", "--model_a", "batch_size=4"], "error: --model_args: batch_size is lm-eval's own option"),
        (["-t", "kvinject_nextword", "-t", "kvinject_nextword"], "error: --tasks gives 'kvinject_nextword' twice"),
        (["-t", "kvinject_nextword", "-L", "1", "--verb", "bogus"], "error: --verbosity must be a logging level"),
        (["-t", "kvinject_nextword", "-Mno_such_model"], "error: lm-eval: Attempted to load model 'no_such_model'"),
        (["-t", "kvinject_nextword", "--mod", "kvinject"], "error: lm-eval: ambiguous option: --mod could match --model, --model_args"),
        (["validate", "-t", "kvinject_nextword,kvinject_nextword"], "error: --tasks gives 'kvinject_nextword' twice"),
    ],
)
def test_what_lm_eval_refuses_reaches_the_user_in_one_line(given, said):
    """lm-eval's argument parser's usage, and the tracebacks of its task loader, model registry,
    `--limit nan` and a model argument it passes itself, before any request reaches the model."""
    out = kvinject("lm-eval", *given)
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1 and errors[0].startswith(said), out.stderr
