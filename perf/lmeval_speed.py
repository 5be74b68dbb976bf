"""lm-eval through kvinject's model against lm-eval's own llama.cpp path (`--model gguf`, HTTP
to llama-cpp-python's server), on the same requests, interleaved.

    pip install 'llama-cpp-python[server]==<the installed version>'   # the server's extras only
    python perf/lmeval_speed.py [--model smollm2] [--docs 100] [--generate 24] [--repeats 3] [--threads N]

Log-likelihoods: `--docs` documents of kvinject's own multiple-choice task, kvinject_nextword
(four choices each). Generation: `--generate` of its prompts completed greedily up to 32 tokens
or a newline. Each repeat evaluates, in turn: kvinject clean, the server, kvinject under
normal:0,0.25; the same model file, threads, f16 cache and flash attention. Printed: requests
per second of each, kvinject's over the server's and the noisy run's over the clean one,
as medians with min and max over repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import socket
import subprocess
import sys
import time
import urllib.request

from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

from kvinject.benchmarks.lmeval import TASKS
from kvinject.engine.model import resolve_model
from kvinject.engine.options import physical_cores
from kvinject.lmeval.model import KvinjectLM
from measurements import add_record_flag, model_label, record
from tools import spread

sys.path.insert(0, str(TASKS))
from nextword import docs  # noqa: E402  (the task's documents, for the generation task below)


def generation_task() -> dict:
    return {
        "task": "kvinject_nextword_generate",
        "custom_dataset": lambda **_: docs(),
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{choices[answer]}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 32, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    }


def server(model: str, threads: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(threads), "--n_threads_batch", str(threads),
            "--n_ctx", "2048", "--flash_attn", "true", "--port", str(port), "--host", "127.0.0.1"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                sys.exit("llama_cpp.server did not start: pip install 'llama-cpp-python[server]' (its extras)")
            time.sleep(0.5)
    sys.exit("llama_cpp.server did not answer in 5 minutes")


def timed(model, tasks: list, manager: TaskManager, limit: int) -> float:
    """Seconds lm-eval takes to evaluate ``tasks`` with ``model`` (its own progress bars hidden)."""
    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        simple_evaluate(model=model, tasks=tasks, task_manager=manager, limit=limit, bootstrap_iters=0)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--docs", type=int, default=100)
    p.add_argument("--generate", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=physical_cores())
    add_record_flag(p)
    a = p.parse_args()
    path = str(resolve_model(a.model))
    manager = TaskManager(include_path=str(TASKS))
    common = {"model": path, "threads": a.threads, "flash_attn": "on"}
    clean, noisy = KvinjectLM(**common), KvinjectLM(**common, error="normal:0,0.25")
    proc, url = server(path, a.threads)
    from lm_eval.models.gguf import GGUFLM

    remote = GGUFLM(base_url=url, max_length=2048)
    try:
        for kind, tasks, n, per_doc in (("loglikelihood", ["kvinject_nextword"], a.docs, 4), ("generate_until", [generation_task()], a.generate, 1)):
            seconds: dict[str, list[float]] = {"kvinject": [], "server": [], "kvinject normal:0,0.25": []}
            for _ in range(a.repeats):
                seconds["kvinject"].append(timed(clean, tasks, manager, n))
                seconds["server"].append(timed(remote, tasks, manager, n))
                seconds["kvinject normal:0,0.25"].append(timed(noisy, tasks, manager, n))
            requests = n * per_doc
            print(f"{kind}: {requests} requests, {a.threads} threads, {a.repeats} repeats")
            for name, times in seconds.items():
                print(f"  {name:<24} {requests / sorted(times)[len(times) // 2]:8.1f} requests/s")
            ratios = [s / k for k, s in zip(seconds["kvinject"], seconds["server"])]
            print(f"  kvinject / server        {spread(ratios)}")
            what = f"lm-eval, {requests} {kind} requests, kvinject / lm-eval's gguf model on llama-cpp-python's server"
            record(a, "cpu", f"lm-eval {model_label(a.model)} {kind}", what, ratios)
            print(f"  normal:0,0.25 / clean    {spread([k / n for k, n in zip(seconds['kvinject'], seconds['kvinject normal:0,0.25'])])}")
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
