"""The command line's surface is the users' contract: every command's --help and the listings
as recorded at commit 6ecb774, kvinject 0.1.0 (tests/help_texts.py). Compared word for
word: another Click or Rich release may wrap the same words otherwise."""

import pytest

from .help_texts import COMMANDS, FIXTURES, LISTINGS, fixture, help_text, listing


@pytest.mark.parametrize("command", COMMANDS)
def test_help_text_is_unchanged(command):
    assert help_text(command).split() == fixture(command).read_text().split()


@pytest.mark.parametrize("name", LISTINGS)
def test_listing_is_unchanged(name):
    assert listing(LISTINGS[name]).split() == (FIXTURES / name).read_text().split()
