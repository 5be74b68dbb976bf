"""The 25 IFEval checkers: behaviour matching the reference, and kwargs validation."""

import pytest

from kvinject.benchmarks.ifeval import INSTRUCTIONS, build_instruction
from kvinject.benchmarks.ifeval.text import count_sentences, count_words, nltk_words
from kvinject.exceptions import DataError

EN_UPPER = "THIS IS AN ENGLISH SENTENCE WRITTEN ENTIRELY IN CAPITAL LETTERS FOR THE TEST."
DE_UPPER = "DAS IST EIN DEUTSCHER SATZ, DER GANZ IN GROSSBUCHSTABEN GESCHRIEBEN WURDE."
EN_LOWER = "this is an english sentence written entirely in lowercase letters for the test."
DE_LOWER = "das ist ein deutscher satz, der ganz in kleinbuchstaben geschrieben wurde."
DE_TEXT = "Das Wetter ist heute sehr schön, und wir gehen am Nachmittag in den Park spazieren."
EN_TEXT = "The weather is very nice today, and we are going for a walk in the park this afternoon."

# (instruction id, kwargs, a response that follows it, one that does not)
CASES = [
    ("change_case:capital_word_frequency", {"capital_frequency": 3, "capital_relation": "at least"}, "THE CAT SAT quietly", "THE cat SAT"),
    ("change_case:english_capital", {}, EN_UPPER, DE_UPPER),
    ("change_case:english_lowercase", {}, EN_LOWER, DE_LOWER),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about cats."},
        "write a poem about cats.\nCats nap all day.",
        "Sure! Write a poem about cats.",
    ),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", "Same.\n******\nSame."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], I live at [address].", "Dear [name], I live here."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "See you soon.\n\np. s. Bring snacks.", "See you soon. PS bring snacks."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Bye.\nP.S. one\nP.P.S two", "Bye.\nP.S. only one"),
    ("detectable_format:constrained_response", {}, "Hmm, tricky. My answer is maybe.", "My answer is yes"),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', 'Here it is: {"a": 1}'),
    (
        "detectable_format:multiple_sections",
        {"num_sections": 2, "section_spliter": "Section"},
        "Section 1\nIntro.\nSection 2\nBody.",
        "SECTION 1\nIntro.\nSECTION 2\nBody.",
    ),
    ("detectable_format:number_bullet_lists", {"num_bullets": 3}, "Points:\n* one\n* two\n- three", "* one\n* two\n* three\n* four"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "It is *very* hot and *dry* here.", "It is *very* hot and * * here."),
    ("detectable_format:title", {}, "<<Ode to Joy>>\nLa la la.", "<< >> and <<split\ntitle>>"),
    ("keywords:existence", {"keywords": ["cat", "dog"]}, "A CAT met a doggo.", "A cat met a bird."),
    ("keywords:forbidden_words", {"forbidden_words": ["rock", "roll"]}, "A rocky road.", "I like Rock music."),
    ("keywords:frequency", {"keyword": "war", "frequency": 2, "relation": "at least"}, "War needs software.", "The war ended."),
    ("keywords:letter_frequency", {"letter": "q", "let_frequency": 2, "let_relation": "less than"}, "Quite good.", "A quick quip."),
    ("language:response_language", {"language": "de"}, DE_TEXT, EN_TEXT),
    (
        "length_constraints:nth_paragraph_first_word",
        {"first_word": "second", "nth_paragraph": 2, "num_paragraphs": 2},
        'First part here.\n\n"Second, we go on.',
        "First part here.\n\nThird, we go on.",
    ),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 3}, "One.\n***\nTwo.\n***\nThree.", "One.\n***\nTwo."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, "One sentence. Two sentences.", "One. Two. Three."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five", "one two three four"),
    ("punctuation:no_comma", {}, "No commas here at all.", "Yes, there is one."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "That is all. any other questions?  ", "Any other questions? Thanks."),
    ("startend:quotation", {}, '  "Hello there."\n', 'Hello "there".'),
]


def test_registry_has_exactly_the_25_ids():
    assert len(INSTRUCTIONS) == 25
    assert {case[0] for case in CASES} == set(INSTRUCTIONS)


@pytest.mark.parametrize(("instruction_id", "kwargs", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_follows_and_fails(instruction_id, kwargs, good, bad):
    instruction = build_instruction(instruction_id, kwargs)
    assert instruction.check(good) is True
    assert instruction.check(bad) is False


# ---------------------------------------------------------------- relations


@pytest.mark.parametrize(
    ("relation", "count", "expected"),
    [("less than", 2, True), ("less than", 3, False), ("at least", 3, True), ("at least", 2, False)],
)
def test_relations_at_the_threshold(relation, count, expected):
    words = " ".join(["word"] * count)
    checks = {
        "length_constraints:number_words": {"num_words": 3, "relation": relation},
        "keywords:frequency": {"keyword": "word", "frequency": 3, "relation": relation},
        "keywords:letter_frequency": {"letter": "w", "let_frequency": 3, "let_relation": relation},
        "change_case:capital_word_frequency": {"capital_frequency": 3, "capital_relation": relation},
    }
    for instruction_id, kwargs in checks.items():
        response = words.upper() if instruction_id.startswith("change_case") else words
        assert build_instruction(instruction_id, kwargs).check(response) is expected, instruction_id
    sentences = " ".join(["Yes."] * count)
    kwargs = {"num_sentences": 3, "relation": relation}
    assert build_instruction("length_constraints:number_sentences", kwargs).check(sentences) is expected


# ---------------------------------------------------------------- counting helpers


def test_words_are_runs_of_word_characters():
    assert count_words("Don't stop-me now, 3.5 times!") == 8  # Don t stop me now 3 5 times
    assert count_words("") == 0


def test_sentences_are_counted_as_punkt_counts_them():
    # Punkt (the reference) ends sentences at punctuation, never at a bare line break.
    assert count_sentences("A title\n\nThe first sentence. The second one!\n* a bullet") == 3
    assert count_sentences("   \n ") == 0
    # A response wrapped in quotes is still three sentences (pysbd had counted one), and a
    # list's numbers are sentences of their own, as punkt splits them: IFEval's recorded
    # verdicts on GPT-4's responses turn on both.
    assert count_sentences('"Hello there. How are you? I am fine."') == 3
    assert count_sentences("1. First point.\n2. Second point.\n3. Third point.") == 6
    assert count_sentences("Dr. Smith went home. He was tired.") == 2  # an abbreviation of its model


def test_capital_words_follow_nltk_tokenization():
    # Splits as nltk.word_tokenize makes them: clitics, &, "cannot", curly quotes; hyphens kept.
    assert nltk_words("DON'T say IT'S AT&T, WELL-KNOWN!") == ["DO", "N'T", "say", "IT", "'S", "AT", "&", "T", ",", "WELL-KNOWN", "!"]
    assert nltk_words("CANNOT DON’T") == ["CAN", "NOT", "DON", "’", "T"]
    # A clitic before a sentence's final period is split off; one before another
    # character is not.
    assert nltk_words("THAT'S. ok") == ["THAT", "'S", ".", "ok"]
    assert nltk_words("THAT'S.ok") == ["THAT'S.ok"]
    # Punkt's abbreviations stay whole words: "D.C." is one capital word, as nltk counts it.
    assert nltk_words("Mr. SMITH went to D.C. at 5 p.m. NOW.") == ["Mr.", "SMITH", "went", "to", "D.C.", "at", "5", "p.m.", "NOW", "."]
    kwargs = {"capital_frequency": 3, "capital_relation": "at least"}
    check = build_instruction("change_case:capital_word_frequency", kwargs)
    assert check.check("DON'T PANIC")  # DO, N'T, PANIC
    assert not check.check("Don't PANIC now, OK")  # PANIC, OK


# ---------------------------------------------------------------- reference quirks


def test_bold_and_italic_highlights_count_once_each():
    check = build_instruction("detectable_format:number_highlighted_sections", {"num_highlights": 2})
    assert check.check("An *italic* and a **bold** span.")
    assert not check.check("Only **one** bold span.")
    assert not check.check("An empty ** pair and *one*.")


def test_undetectable_language_counts_as_followed():
    assert build_instruction("language:response_language", {"language": "de"}).check("12345 !!!")
    # Upper case (Roman numeral twelve) but nothing langdetect can read.
    assert build_instruction("change_case:english_capital", {}).check("\u216b 2024")
    assert not build_instruction("change_case:english_capital", {}).check("1234 !!!")  # no cased letter


def test_language_detection_is_deterministic():
    check = build_instruction("language:response_language", {"language": "en"})
    text = "ok sure fine yes no maybe"
    assert len({check.check(text) for _ in range(5)}) == 1


def test_two_responses_edge_cases():
    check = build_instruction("combination:two_responses", {})
    assert check.check("******\nFirst.\n******\nSecond.\n******")  # empty ends are allowed
    assert not check.check("First.\n******\n  \n******\nSecond.")  # an empty middle is not
    assert not check.check("Only one.")


def test_paragraph_dividers():
    check = build_instruction("length_constraints:number_paragraphs", {"num_paragraphs": 2})
    assert check.check("***\nOne.\n***\nTwo.\n***")
    assert not check.check("One.\n***\n***\nTwo.")


def test_nth_paragraph_counts_blank_paragraphs_when_indexing():
    kwargs = {"first_word": "two", "nth_paragraph": 2, "num_paragraphs": 2}
    check = build_instruction("length_constraints:nth_paragraph_first_word", kwargs)
    assert check.check("One.\n\nTwo!")
    # "\n\n\n\n" leaves an empty second slot: two paragraphs, but the 2nd slot is blank.
    assert not check.check("One.\n\n\n\nTwo!")
    assert not check.check("One.\n\nTwo!\n\nThree.")


def test_bullets_ignore_bold_lines():
    check = build_instruction("detectable_format:number_bullet_lists", {"num_bullets": 1})
    assert check.check("**Heading**\n* the only bullet")


def test_keywords_are_case_insensitive_substrings_but_forbidden_words_are_whole_words():
    assert build_instruction("keywords:existence", {"keywords": ["cat"]}).check("conCATenate")
    assert build_instruction("keywords:forbidden_words", {"forbidden_words": ["cat"]}).check("concatenate")


def test_letter_frequency_accepts_symbols():
    kwargs = {"letter": "#", "let_frequency": 2, "let_relation": "at least"}
    check = build_instruction("keywords:letter_frequency", kwargs)
    assert check.check("# one\n# two")
    assert not check.check("# one")


def test_json_does_not_crash_on_deep_nesting():
    assert build_instruction("detectable_format:json_format", {}).check("[" * 100_000) is False


def test_end_phrase_may_be_followed_by_a_closing_quote():
    check = build_instruction("startend:end_checker", {"end_phrase": "Peace!"})
    assert check.check('"Goodbye and peace!"')


def test_quotation_needs_two_characters():
    assert not build_instruction("startend:quotation", {}).check('"')


# ---------------------------------------------------------------- kwargs validation


def test_none_valued_kwargs_are_ignored():
    kwargs = {"num_highlights": 2, "relation": None, "keywords": None, "prompt_to_repeat": None}
    instruction = build_instruction("detectable_format:number_highlighted_sections", kwargs)
    assert instruction.num_highlights == 2
    assert build_instruction("punctuation:no_comma", None).check("ok")


def test_lists_become_tuples():
    instruction = build_instruction("keywords:existence", {"keywords": ["a", "b"]})
    assert instruction.keywords == ("a", "b")
    hash(instruction)


@pytest.mark.parametrize(
    ("instruction_id", "kwargs", "message"),
    [
        ("punctuation:no_commas", {}, "unknown instruction id"),
        ("punctuation:no_comma", {"num_words": 3}, "unexpected kwarg(s) num_words"),
        ("length_constraints:number_words", {"num_words": 3}, "missing kwarg(s) relation"),
        ("length_constraints:number_words", {"num_words": "3", "relation": "at least"}, "must be an integer"),
        ("length_constraints:number_words", {"num_words": True, "relation": "at least"}, "must be an integer"),
        ("length_constraints:number_words", {"num_words": 3, "relation": "at most"}, "relation must be one of"),
        ("detectable_format:number_bullet_lists", {"num_bullets": -1}, "num_bullets must be >= 0"),
        ("keywords:existence", {"keywords": "cat"}, "keywords must be a list of strings"),
        ("keywords:existence", {"keywords": []}, "keywords must not be empty"),
        ("keywords:frequency", {"keyword": "(", "frequency": 1, "relation": "at least"}, "not a valid regular"),
        ("keywords:letter_frequency", {"letter": "ab", "let_frequency": 1, "let_relation": "at least"}, "single"),
        ("language:response_language", {"language": "xx"}, "language must be one of"),
        (
            "length_constraints:nth_paragraph_first_word",
            {"first_word": "a", "nth_paragraph": 3, "num_paragraphs": 2},
            "nth_paragraph must be in 1..num_paragraphs",
        ),
        ("combination:repeat_prompt", {"prompt_to_repeat": "  "}, "prompt_to_repeat must be a non-empty string"),
        ("combination:repeat_prompt", {"prompt_to_repeat": "Hi", "prompt": "Hi"}, "unexpected kwarg(s) prompt"),
        ("detectable_format:title", [], "kwargs must be an object"),
    ],
)
def test_bad_kwargs_raise_data_error_naming_the_id(instruction_id, kwargs, message):
    with pytest.raises(DataError) as excinfo:
        build_instruction(instruction_id, kwargs)
    assert instruction_id in str(excinfo.value)
    assert message in str(excinfo.value)
