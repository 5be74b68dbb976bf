"""The command line's surface is the users' contract: every command's --help as recorded
before the package was laid out in layers (tests/help_texts.py)."""

import pytest

from .help_texts import COMMANDS, fixture, help_text


@pytest.mark.parametrize("command", COMMANDS)
def test_help_text_is_unchanged(command):
    assert help_text(command) == fixture(command).read_text()
