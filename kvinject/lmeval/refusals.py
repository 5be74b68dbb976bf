"""What lm-eval raises for what a user gave it, and that error as one line: a task YAML's field
it does not take, a dataset it cannot find, a `!function` it cannot import, a metric it lacks
(a KeyError of None), a prompt template naming a field the documents lack, a field of another
type (`dataset_kwargs: x`, an AttributeError; `data_files: {test: []}`, a StopIteration). lm-eval
checks few of a task's fields itself, so such an error can be of any kind: what tells it from a
bug of kvinject's is where it was raised. Both ways lm-eval runs under kvinject (`kvinject
lm-eval`, the lmeval bench) read its errors through here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from ..exceptions import DataError

PACKAGE = Path(__file__).resolve().parents[1]


def from_below(e: BaseException) -> bool:
    """Whether ``e`` is an error raised in a dependency's code (lm-eval, datasets, jinja2, a
    task's `!function`), not in kvinject's: one of kvinject's own keeps its traceback (a bug)."""
    if not isinstance(e, Exception) or e.__traceback__ is None:
        return False
    return not Path(_raising(e).tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE)


def raised_at(e: BaseException) -> str:
    """Where ``e`` was raised, as FILE:LINE within its package (lm_eval/api/metrics.py:36)."""
    tb = _raising(e)
    return f"{tb.tb_frame.f_code.co_filename.split('site-packages/')[-1]}:{tb.tb_lineno}"


def _raising(e: BaseException) -> TracebackType:
    tb = e.__traceback__
    assert tb is not None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def said(e: BaseException) -> str:
    """``e`` in one line; a KeyError's bare key, or no message, named by its kind; with what
    the error it was raised from adds ("An error occurred while generating the dataset" says
    no more)."""
    text = _one_line(e)
    cause = _one_line(e.__cause__) if e.__cause__ is not None else ""
    return f"{text} ({cause})" if cause and cause.split(": ")[-1] not in text else text


def _one_line(e: BaseException) -> str:
    if isinstance(e, KeyError):  # str() of a KeyError is its key's repr
        return f"KeyError: {' '.join(str(e.args[0]).split()) if e.args else ''}".strip(": ")
    text = " ".join(str(e).split())
    return text or type(e).__name__


def after_requests(e: BaseException) -> str:
    """An error lm-eval raised after the model answered its requests (scoring them: a task's
    metric that does not fit its output type), in one line that says where."""
    return f"{said(e)} (raised in {raised_at(e)}, after the model answered lm-eval's requests)"


@contextmanager
def refused(what: str) -> Iterator[None]:
    """What lm-eval raises inside, as the lmeval bench's one line: "lm-eval cannot {what}: ..."."""
    try:
        yield
    except Exception as e:
        if not from_below(e):
            raise
        raise DataError(f"lmeval: lm-eval cannot {what}: {said(e)}") from None
