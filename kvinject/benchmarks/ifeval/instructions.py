"""The 25 IFEval instruction checkers, one small frozen dataclass per instruction id.

Each checker reproduces the verdict of the reference IFEval code (google-research
`instruction_following_eval`, also vendored by lm-evaluation-harness) on the same
response, so that our scores are comparable with published ones. Where the reference
draws random kwargs for missing or out-of-range values, we refuse them instead.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from ...exceptions import DataError
from .text import count_sentences, count_words, detect_language, nltk_words

RELATIONS = ("less than", "at least")

# The language codes IFEval can ask for; the reference fails on any other code.
LANGUAGE_CODES = frozenset("en es pt ar hi fr ru de ja it bn uk th ur ta te bg ko pl he fa vi ne sw kn mr gu pa ml fi".split())

CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


class Instruction:
    """Base of all checkers; subclasses are frozen dataclasses whose fields are the kwargs."""

    instruction_id: ClassVar[str] = ""

    def check(self, response: str) -> bool:
        raise NotImplementedError

    def _invalid(self, message: str) -> DataError:
        return DataError(f"{self.instruction_id}: {message}")


INSTRUCTIONS: dict[str, type[Instruction]] = {}


def register(instruction_id: str):
    """Class decorator: record a checker class under its IFEval instruction id."""

    def decorate(cls: type[Instruction]) -> type[Instruction]:
        cls.instruction_id = instruction_id
        INSTRUCTIONS[instruction_id] = cls
        return cls

    return decorate


def build_instruction(instruction_id: str, kwargs: dict[str, Any] | None) -> Instruction:
    """Validate `kwargs` for `instruction_id` and return its checker.

    Keys whose value is None are ignored, because the Hugging Face copy of IFEval
    gives every instruction the union of all kwargs keys, mostly set to null.
    """
    cls = INSTRUCTIONS.get(instruction_id)
    if cls is None:
        raise DataError(f"unknown instruction id {instruction_id!r}")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict):
        raise DataError(f"{instruction_id}: kwargs must be an object, got {type(kwargs).__name__}")
    given = {name: value for name, value in kwargs.items() if value is not None}
    types = typing.get_type_hints(cls)
    expected = [field.name for field in dataclasses.fields(cls)]
    extra = sorted(set(given) - set(expected))
    if extra:
        raise DataError(f"{instruction_id}: unexpected kwarg(s) {', '.join(extra)}")
    missing = [name for name in expected if name not in given]
    if missing:
        raise DataError(f"{instruction_id}: missing kwarg(s) {', '.join(missing)}")
    values = {name: _convert(instruction_id, name, types[name], given[name]) for name in expected}
    return cls(**values)


def _convert(instruction_id: str, name: str, annotation: Any, value: Any) -> Any:
    if annotation is int:
        ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif annotation is str:
        ok, wanted = isinstance(value, str), "a string"
    else:  # tuple[str, ...]: JSON gives a list; a tuple keeps the dataclass hashable
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        wanted = "a list of strings"
        value = tuple(value) if ok else value
    if not ok:
        raise DataError(f"{instruction_id}: kwarg {name} must be {wanted}, got {value!r}")
    return value


def _compare(count: int, relation: str, threshold: int) -> bool:
    return count < threshold if relation == "less than" else count >= threshold


def _check_relation(instr: Instruction, name: str, relation: str) -> None:
    if relation not in RELATIONS:
        raise instr._invalid(f"kwarg {name} must be one of {RELATIONS}, got {relation!r}")


def _check_non_negative(instr: Instruction, name: str, value: int) -> None:
    if value < 0:
        raise instr._invalid(f"kwarg {name} must be >= 0, got {value}")


def _check_non_empty(instr: Instruction, name: str, value: str) -> None:
    if not value.strip():
        raise instr._invalid(f"kwarg {name} must be a non-empty string")


def _check_pattern(instr: Instruction, name: str, pattern: str) -> None:
    # The reference uses some kwargs as regular expressions, unescaped; so do we.
    try:
        re.compile(pattern)
    except re.error as exc:
        raise instr._invalid(f"kwarg {name} is not a valid regular expression: {pattern!r} ({exc})") from None


# ---------------------------------------------------------------- checkers


@register("change_case:capital_word_frequency")
@dataclass(frozen=True)
class CapitalWordFrequency(Instruction):
    capital_frequency: int
    capital_relation: str

    def __post_init__(self):
        _check_non_negative(self, "capital_frequency", self.capital_frequency)
        _check_relation(self, "capital_relation", self.capital_relation)

    def check(self, response: str) -> bool:
        capitals = sum(1 for word in nltk_words(response) if word.isupper())
        return _compare(capitals, self.capital_relation, self.capital_frequency)


@register("change_case:english_capital")
@dataclass(frozen=True)
class EnglishCapital(Instruction):
    def check(self, response: str) -> bool:
        if not response.isupper():
            return False
        language = detect_language(response)
        # The reference counts undetectable text as following the instruction.
        return language is None or language == "en"


@register("change_case:english_lowercase")
@dataclass(frozen=True)
class EnglishLowercase(Instruction):
    def check(self, response: str) -> bool:
        if not response.islower():
            return False
        language = detect_language(response)
        return language is None or language == "en"


@register("combination:repeat_prompt")
@dataclass(frozen=True)
class RepeatPrompt(Instruction):
    prompt_to_repeat: str

    def __post_init__(self):
        _check_non_empty(self, "prompt_to_repeat", self.prompt_to_repeat)

    def check(self, response: str) -> bool:
        return response.strip().lower().startswith(self.prompt_to_repeat.strip().lower())


@register("combination:two_responses")
@dataclass(frozen=True)
class TwoResponses(Instruction):
    def check(self, response: str) -> bool:
        parts = response.split("******")
        answers = []
        for index, part in enumerate(parts):
            if part.strip():
                answers.append(part.strip())
            elif 0 < index < len(parts) - 1:  # an empty answer between two separators
                return False
        return len(answers) == 2 and answers[0] != answers[1]


@register("detectable_content:number_placeholders")
@dataclass(frozen=True)
class NumberPlaceholders(Instruction):
    num_placeholders: int

    def __post_init__(self):
        _check_non_negative(self, "num_placeholders", self.num_placeholders)

    def check(self, response: str) -> bool:
        return len(re.findall(r"\[.*?\]", response)) >= self.num_placeholders


@register("detectable_content:postscript")
@dataclass(frozen=True)
class Postscript(Instruction):
    postscript_marker: str

    def __post_init__(self):
        _check_non_empty(self, "postscript_marker", self.postscript_marker)
        _check_pattern(self, "postscript_marker", self.postscript_marker.strip().lower())

    def check(self, response: str) -> bool:
        marker = self.postscript_marker.strip()
        # The two markers IFEval uses are matched loosely ("p. s.", "P.P.S."); any
        # other marker is used as a regular expression. Anywhere in the text counts.
        if marker == "P.P.S":
            pattern = r"p\.\s?p\.\s?s"
        elif marker == "P.S.":
            pattern = r"p\.\s?s\."
        else:
            pattern = marker.lower()
        return re.search(pattern, response.lower()) is not None


@register("detectable_format:constrained_response")
@dataclass(frozen=True)
class ConstrainedResponse(Instruction):
    def check(self, response: str) -> bool:
        return any(option in response for option in CONSTRAINED_RESPONSES)


@register("detectable_format:json_format")
@dataclass(frozen=True)
class JsonFormat(Instruction):
    def check(self, response: str) -> bool:
        text = response.strip()
        for fence in ("```json", "```Json", "```JSON", "```"):
            text = text.removeprefix(fence)
        text = text.removesuffix("```").strip()
        try:
            json.loads(text)
        except (ValueError, RecursionError):  # deep nesting would crash the reference
            return False
        return True


@register("detectable_format:multiple_sections")
@dataclass(frozen=True)
class MultipleSections(Instruction):
    num_sections: int
    section_spliter: str  # sic: IFEval's spelling of the kwarg

    def __post_init__(self):
        _check_non_negative(self, "num_sections", self.num_sections)
        _check_non_empty(self, "section_spliter", self.section_spliter)
        _check_pattern(self, "section_spliter", self.section_spliter.strip())

    def check(self, response: str) -> bool:
        # Case-sensitive: "SECTION 1" does not open a section when "Section" is asked.
        splitter = r"\s?" + self.section_spliter.strip() + r"\s?\d+\s?"
        return len(re.split(splitter, response)) - 1 >= self.num_sections


@register("detectable_format:number_bullet_lists")
@dataclass(frozen=True)
class NumberBulletLists(Instruction):
    num_bullets: int

    def __post_init__(self):
        _check_non_negative(self, "num_bullets", self.num_bullets)

    def check(self, response: str) -> bool:
        stars = re.findall(r"^\s*\*[^\*].*$", response, flags=re.MULTILINE)
        dashes = re.findall(r"^\s*-.*$", response, flags=re.MULTILINE)
        return len(stars) + len(dashes) == self.num_bullets


@register("detectable_format:number_highlighted_sections")
@dataclass(frozen=True)
class NumberHighlightedSections(Instruction):
    num_highlights: int

    def __post_init__(self):
        _check_non_negative(self, "num_highlights", self.num_highlights)

    def check(self, response: str) -> bool:
        # *italic* and **bold** spans both count, once each: the single-star pattern
        # sees a bold span only as two empty "**" pairs, which are skipped.
        singles = re.findall(r"\*[^\n\*]*\*", response)
        doubles = re.findall(r"\*\*[^\n\*]*\*\*", response)
        count = sum(1 for span in singles if span.strip("*").strip())
        count += sum(1 for span in doubles if span[2:-2].strip())
        return count >= self.num_highlights


@register("detectable_format:title")
@dataclass(frozen=True)
class Title(Instruction):
    def check(self, response: str) -> bool:
        titles = re.findall(r"<<[^\n]+>>", response)
        return any(title.lstrip("<").rstrip(">").strip() for title in titles)


@register("keywords:existence")
@dataclass(frozen=True)
class KeywordsExistence(Instruction):
    keywords: tuple[str, ...]

    def __post_init__(self):
        if not self.keywords:
            raise self._invalid("kwarg keywords must not be empty")
        for keyword in self.keywords:
            _check_non_empty(self, "keywords", keyword)
            _check_pattern(self, "keywords", keyword)

    def check(self, response: str) -> bool:
        # A substring search: "cat" is found in "concatenate".
        return all(re.search(keyword, response, flags=re.IGNORECASE) for keyword in self.keywords)


@register("keywords:forbidden_words")
@dataclass(frozen=True)
class ForbiddenWords(Instruction):
    forbidden_words: tuple[str, ...]

    def __post_init__(self):
        if not self.forbidden_words:
            raise self._invalid("kwarg forbidden_words must not be empty")
        for word in self.forbidden_words:
            _check_non_empty(self, "forbidden_words", word)
            _check_pattern(self, "forbidden_words", r"\b" + word + r"\b")

    def check(self, response: str) -> bool:
        # Whole words only, unlike keywords:existence.
        return not any(re.search(r"\b" + word + r"\b", response, flags=re.IGNORECASE) for word in self.forbidden_words)


@register("keywords:frequency")
@dataclass(frozen=True)
class KeywordFrequency(Instruction):
    frequency: int
    keyword: str
    relation: str

    def __post_init__(self):
        _check_non_negative(self, "frequency", self.frequency)
        _check_non_empty(self, "keyword", self.keyword)
        _check_pattern(self, "keyword", self.keyword.strip())
        _check_relation(self, "relation", self.relation)

    def check(self, response: str) -> bool:
        # Substring occurrences, case-insensitive: "war" also counts in "software".
        count = len(re.findall(self.keyword.strip(), response, flags=re.IGNORECASE))
        return _compare(count, self.relation, self.frequency)


@register("keywords:letter_frequency")
@dataclass(frozen=True)
class LetterFrequency(Instruction):
    let_frequency: int
    let_relation: str
    letter: str

    def __post_init__(self):
        _check_non_negative(self, "let_frequency", self.let_frequency)
        _check_relation(self, "let_relation", self.let_relation)
        # One character; IFEval's data also asks for "#" and "!", which are counted as given.
        if len(self.letter) != 1 or self.letter.isspace():
            raise self._invalid(f"kwarg letter must be a single character, got {self.letter!r}")

    def check(self, response: str) -> bool:
        count = collections.Counter(response.lower())[self.letter.lower()]
        return _compare(count, self.let_relation, self.let_frequency)


@register("language:response_language")
@dataclass(frozen=True)
class ResponseLanguage(Instruction):
    language: str

    def __post_init__(self):
        if self.language not in LANGUAGE_CODES:
            raise self._invalid(f"kwarg language must be one of {sorted(LANGUAGE_CODES)}, got {self.language!r}")

    def check(self, response: str) -> bool:
        language = detect_language(response)
        return language is None or language == self.language


@register("length_constraints:nth_paragraph_first_word")
@dataclass(frozen=True)
class NthParagraphFirstWord(Instruction):
    first_word: str
    nth_paragraph: int
    num_paragraphs: int

    def __post_init__(self):
        _check_non_empty(self, "first_word", self.first_word)
        _check_non_negative(self, "num_paragraphs", self.num_paragraphs)
        if not 1 <= self.nth_paragraph <= self.num_paragraphs:
            raise self._invalid(f"kwarg nth_paragraph must be in 1..num_paragraphs ({self.num_paragraphs}), got {self.nth_paragraph}")

    def check(self, response: str) -> bool:
        paragraphs = response.split("\n\n")
        count = sum(1 for paragraph in paragraphs if paragraph.strip())
        if self.nth_paragraph > count:
            return False
        # Indexing counts blank paragraphs (e.g. from "\n\n\n\n"), as the reference does.
        paragraph = paragraphs[self.nth_paragraph - 1].strip()
        if not paragraph:
            return False
        word = paragraph.split()[0].lstrip("'").lstrip('"')
        first = re.match(r"[^.,?!'\"]*", word).group().lower()
        return count == self.num_paragraphs and first == self.first_word.lower()


@register("length_constraints:number_paragraphs")
@dataclass(frozen=True)
class NumberParagraphs(Instruction):
    num_paragraphs: int

    def __post_init__(self):
        _check_non_negative(self, "num_paragraphs", self.num_paragraphs)

    def check(self, response: str) -> bool:
        paragraphs = re.split(r"\s?\*\*\*\s?", response)
        count = len(paragraphs)
        for index, paragraph in enumerate(paragraphs):
            if not paragraph.strip():
                if 0 < index < len(paragraphs) - 1:  # an empty paragraph between dividers
                    return False
                count -= 1
        return count == self.num_paragraphs


@register("length_constraints:number_sentences")
@dataclass(frozen=True)
class NumberSentences(Instruction):
    num_sentences: int
    relation: str

    def __post_init__(self):
        _check_non_negative(self, "num_sentences", self.num_sentences)
        _check_relation(self, "relation", self.relation)

    def check(self, response: str) -> bool:
        return _compare(count_sentences(response), self.relation, self.num_sentences)


@register("length_constraints:number_words")
@dataclass(frozen=True)
class NumberWords(Instruction):
    num_words: int
    relation: str

    def __post_init__(self):
        _check_non_negative(self, "num_words", self.num_words)
        _check_relation(self, "relation", self.relation)

    def check(self, response: str) -> bool:
        return _compare(count_words(response), self.relation, self.num_words)


@register("punctuation:no_comma")
@dataclass(frozen=True)
class NoComma(Instruction):
    def check(self, response: str) -> bool:
        return "," not in response


@register("startend:end_checker")
@dataclass(frozen=True)
class EndChecker(Instruction):
    end_phrase: str

    def __post_init__(self):
        _check_non_empty(self, "end_phrase", self.end_phrase)

    def check(self, response: str) -> bool:
        # Surrounding double quotes are ignored, so a quoted response can still pass.
        return response.strip().strip('"').lower().endswith(self.end_phrase.strip().lower())


@register("startend:quotation")
@dataclass(frozen=True)
class Quotation(Instruction):
    def check(self, response: str) -> bool:
        text = response.strip()
        return len(text) > 1 and text[0] == '"' and text[-1] == '"'
