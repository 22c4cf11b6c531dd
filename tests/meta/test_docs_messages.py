"""Every log or error line docs/operations.md and the README quote is one the code can print (issue 14 §5).

How a quote is matched against the code's format strings: ``tests/kit/doc_quotes.py``.
A failure names the quote and the words no format string accounts for; either the
code's wording changed (fix the docs) or the docs quote a line nothing prints.
"""

from __future__ import annotations

import pytest

from tests.kit.code_templates import templates
from tests.kit.doc_quotes import Explainer, Quote, matches_code, quoted_messages, uncovered_words

QUOTES = quoted_messages()


def test_the_docs_quote_messages_where_expected() -> None:
    """The extraction itself finds the table and the prose quotes (else the next test proves nothing)."""
    texts = {q.text for q in QUOTES}
    assert len([q for q in QUOTES if q.source.startswith("operations.md")]) > 60
    assert any(t.startswith("presence write failed (") for t in texts)
    assert "consumer: Connection to broker lost" in texts  # from section 2.4's prose
    assert "switchyard celery worker: invalid configuration: REDIS_URL: ..." in texts  # from the README
    assert not any(t.startswith(("make ", "celery -A", "heroku ")) for t in texts)


@pytest.mark.parametrize("quote", QUOTES, ids=[f"{q.source}" for q in QUOTES])
def test_each_quoted_line_is_one_the_code_prints(quote: Quote) -> None:
    words = uncovered_words(quote.text)
    assert not words, f"{quote.source}: no format string in the code prints `{quote.text}` ({words})"


@pytest.mark.parametrize("reworded", [
    "presence write failed (TimeoutError); giving up",
    "NATS unavailable: presence not written",
    "Voicy API unreachable (...); retrying in 2.0s",                    # "unreachable" is a word of the code
    "term ...: max_deliveries: failed on 4 of 5 deliveries; retrying",  # so is "retrying"
    "Voicy rejected VOICY_WORKER_TOKEN: claiming stopped for good",
    "nak ... : the task vanished",
    "beat: lost the lock for ever",
])
def test_a_line_the_code_does_not_print_is_caught(reworded: str) -> None:
    """Strict enough to fail: a reworded line does not pass on words scattered over the code."""
    assert not matches_code(reworded)


def test_a_quote_fails_once_the_code_stops_printing_it() -> None:
    """The docs' presence line matches while its format string exists, and not once it is gone."""
    quote = next(q.text for q in QUOTES if q.text.startswith("presence write failed ("))
    assert matches_code(quote)
    without = tuple(t for t in templates() if "presence write failed" not in t)
    assert not Explainer(quote, without).explain()
