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

from ..exceptions import DataError

PACKAGE = Path(__file__).resolve().parents[1]


def from_below(e: BaseException) -> bool:
    """Whether ``e`` is an error raised in a dependency's code (lm-eval, datasets, jinja2, a
    task's `!function`), not in kvinject's: one of kvinject's own keeps its traceback (a bug)."""
    if not isinstance(e, Exception) or e.__traceback__ is None:
        return False
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return not Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(PACKAGE)


def said(e: BaseException) -> str:
    """``e`` in one line; a KeyError's bare key, or no message, named by its kind; with the
    error it was raised from ("An error occurred while generating the dataset" says no more)."""
    text = " ".join(str(e).split())
    text = type(e).__name__ if not text else f"{type(e).__name__}: {text}" if isinstance(e, KeyError) else text
    return f"{text} ({said(e.__cause__)})" if e.__cause__ is not None else text


@contextmanager
def refused(what: str) -> Iterator[None]:
    """What lm-eval raises inside, as the lmeval bench's one line: "lm-eval cannot {what}: ..."."""
    try:
        yield
    except Exception as e:
        if not from_below(e):
            raise
        raise DataError(f"lmeval: lm-eval cannot {what}: {said(e)}") from None
