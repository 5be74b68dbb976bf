"""`kvinject score`: responses generated elsewhere, scored with kvinject's IFEval checkers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..exceptions import KvinjectError
from ..files import write_text
from ..jsonutil import dumps
from .flags import FormatOpt
from .outputs import check_writable
from .render import console


def score(
    bench: Annotated[str, typer.Argument(help="The benchmark whose checkers score the responses: ifeval.")],
    data: Annotated[str, typer.Option("--data", help="IFEval input_data.jsonl (or hf:google/IFEval).")],
    responses: Annotated[Path, typer.Option("--responses", help="JSONL with 'prompt' and 'response' per line (IFEval's input_response_data format).")],
    output: Annotated[
        Optional[Path], typer.Option("--output", "-o", help="Write one verdict per response line, in order (per-instruction strict/loose), as JSONL.")
    ] = None,
    output_format: FormatOpt = "table",
) -> None:
    """Score responses generated elsewhere with kvinject's IFEval checkers. Every line is scored:
    a prompt may come several times (responses of several runs, seeds or models)."""
    from ..benchmarks.ifeval.bench import load_items
    from ..benchmarks.ifeval.scoring import metrics, read_responses, score_responses

    if bench != "ifeval":
        raise KvinjectError(f"only ifeval responses can be scored, got '{bench}'")
    check_writable({"--output": output}, inputs=[data, responses], stdout=["--output"])
    items = load_items(data)
    answers = read_responses(responses)
    if not answers:
        raise KvinjectError(f"{responses} holds no response")
    verdicts = score_responses(items, answers, str(responses))
    if output:
        write_text(output, "".join(json.dumps(v.to_dict()) + "\n" for v in verdicts))
    covered = len({v.prompt for v in verdicts})
    result = {"scored": len(verdicts), "prompts": covered, "prompts_without_response": len(items) - covered, **metrics(verdicts)}
    if output_format == "json":
        print(dumps(result))
        return
    missing = len(items) - covered
    table = Table(
        title=f"IFEval: {len(verdicts)} responses to {covered} prompts scored" + (f"; {missing} prompts of the data without a response" if missing else "")
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics(verdicts).items():
        table.add_row(key, f"{value:.4f}")
    console.print(table)
