"""Chat prompts are the model's own Jinja chat template, rendered as transformers renders it."""

from __future__ import annotations

import jinja2
from llama_cpp import llama_cpp as ll

from kvinject.engine.model import _ChatTemplate


def test_a_chat_prompt_is_the_model_s_jinja_template_with_its_default_system_prompt(tiny):
    """SmolLM2's template opens with a system turn of its own when the messages have none,
    which llama.cpp's built-in chatml rendering leaves out; a given system turn replaces it."""
    template = ll.llama_model_chat_template(tiny._ptr, None).decode()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # transformers' settings

    def rendered(messages):
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")

    user = [{"role": "user", "content": "Is the sky blue?"}]
    assert tiny.chat_prompt("Is the sky blue?") == rendered(user)
    assert tiny.chat_prompt("Is the sky blue?").startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    given = tiny.chat_prompt("Is the sky blue?", system="Be brief.")
    assert given == rendered([{"role": "system", "content": "Be brief."}, *user]) and "SmolLM" not in given


def test_templates_that_print_today_s_date_print_a_fixed_one():
    """Llama 3.1's templates print today's date; a prompt must not change by the day."""
    template = "{{ strftime_now('%d %b %Y') }}: {{ messages[0]['content'] }}"
    formatter = _ChatTemplate(template, eos_token="", bos_token="")
    assert formatter(messages=[{"role": "user", "content": "hi"}]).prompt == "26 Jul 2024: hi"


def test_a_bos_the_template_writes_is_left_to_the_tokenizer(tiny, monkeypatch):
    """Llama 3's template writes <|begin_of_text|> and its vocabulary adds one on tokenizing:
    one BOS, not two. A vocabulary that adds none keeps the template's."""
    bos = tiny.piece(ll.llama_vocab_bos(tiny.vocab), special=True).decode()
    monkeypatch.setattr(tiny, "_chat", _ChatTemplate("{{ bos_token }}{{ messages[0]['content'] }}", eos_token="", bos_token=bos))
    monkeypatch.setattr(ll, "llama_vocab_get_add_bos", lambda vocab: True)
    assert tiny.chat_prompt("hello") == "hello"
    monkeypatch.setattr(ll, "llama_vocab_get_add_bos", lambda vocab: False)
    assert tiny.chat_prompt("hello") == bos + "hello"
