"""What docs/operations.md and the README quote, and whether the code can print it (test kit).

``tests/meta/test_docs_messages.py`` runs it over every quote; ``python -m tests.kit.doc_quotes``
lists the quotes that do not match, with the words nothing in the code accounts for.

An operator searches the troubleshooting table for the line in front of them;
a quoted line the code no longer prints sends them nowhere (issue 14 §5: the
table also blamed NATS for a presence failure with another cause; what a line
*means* stays the docs' job, its wording is checked here). Each quoted message
is matched against the format strings of the code that could print it:

* **Quoted messages**: every backtick span of the first column of the
  troubleshooting table (section 7) outside its "(where, LEVEL)" parentheses,
  and every other span of both files that reads as a message (two or more
  lowercase words, not a command line, not a configuration snippet).
* **Format strings**: what our code and the libraries whose lines the docs
  quote can print, their fields read as holes (``tests/kit/code_templates.py``).
* **A match** reads the quote as format strings placed one after the other or
  inside each other's fields: a format string's literal text must appear as
  quoted; each field holds a value (a number, ``TimeoutError``, ``CAIRN_JOBS``,
  a URL, or one of the code's own single-word constants such as ``nak``) or
  another placed format string; a placeholder of the docs (``...``, ``…``,
  ``<id>``, ``N``) stands for anything. A quote may be part of a longer line,
  cut where a clause ends. Words of prose are never values: each must come
  from a format string, so a quote the code's wording no longer matches fails.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from tests.kit.code_templates import EXTERNAL_TEMPLATES, HOLE, ROOT, our_templates, templates, values

OPERATIONS_MD = ROOT / "docs" / "operations.md"
README_MD = ROOT / "README.md"
TROUBLESHOOTING = "## 7. Troubleshooting"

STAR = "\x02"  # a placeholder of the docs: ..., …, <name>
MAX_CANDIDATES = 24  # format strings tried per quoted line: those sharing the most word pairs with it
MAX_TRIES = 6  # placements tried per stretch, best first
MAX_NESTING = 6  # a message inside a message inside ...
MIN_LITERAL_MATCH = 4  # characters a placed format string must match as written (not via a placeholder)
CLAUSE_ENDS = ".,;:"  # a quote may begin after one of these inside a longer line, and stop before one
ANCHOR_CHARS = 6  # words this long (and word pairs) rank the format strings worth trying for a quote
_DOC_PLACEHOLDER = re.compile(r"\.\.\.|…|<[^<>]+>|\bN\b")  # "seq N", "N passed": N stands for a number
_NAME_WITH_HYPHENS = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)+")  # a pool or engine name: garmin-fetcher
_EXAMPLE_VALUE = re.compile(
    r"[-+]?\d[\w.:/@*-]*"                      # 20s, 6.0s, 401, 127.0.0.1:6379/0, 33554432-byte
    r"|v\d[\w.+-]*"                           # v0.8.0
    r"|[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+"  # TimeoutError, UnexpectedEOF, ConnectError
    r"|[A-Z][A-Z0-9_]{2,}"                    # CAIRN_JOBS, REDIS_URL
    r"|True|False|None"
    r"|\S*://\S*"                             # redis://:**@host:6379/0, tasks.hardening.transport:SentinelTransport://...
)
# A logger, task or NATS subject: workers.outage, cairn.job, $KV.cairn_worker_presence.<pool>
_DOTTED_NAME = re.compile(r"\$?[A-Za-z_][\w-]*(?:\.[\w*>\x02-]+)+")
_MESSAGE_WORDS = re.compile(r"(?:^|(?<=\s))[a-z]{2,}[,;:.]?(?=\s|$)")  # whole lowercase words between spaces
# Spans outside the table that are commands, settings or expressions, not messages.
_NOT_A_MESSAGE = re.compile(
    r"^(?:make|celery|python|heroku|honcho|redis-cli|nats |ip |openssl|ruff |pytest |\.venv|GET |POST |sentinel |"
    r"appendonly|min-replicas|-|sum\(|histogram_|flower_|async def|max\(|running <|import |reason:|"
    r"authorized:|\"webhooks\")"
    r"|^switchyard (?!\w+ \w+:)"  # a switchyard verb, unless "switchyard <process>: message"
    r"|^[A-Z][A-Z0-9_]*=\S* "  # a command line with variables in front: CAIRN_PROVIDER=garmin switchyard ...
)


@dataclass(frozen=True)
class Quote:
    source: str  # file:line
    text: str


# --------------------------------------------------------------------------- the quoted lines
def _spans_at_depth_zero(cell: str) -> Iterator[str]:
    """Backtick spans of a table cell that are not inside a parenthesised remark."""
    depth, i = 0, 0
    while i < len(cell):
        ch = cell[i]
        if ch == "`":
            end = cell.index("`", i + 1)
            if depth == 0:
                yield cell[i + 1:end]
            i = end + 1
            continue
        depth += ch == "("
        depth -= ch == ")" and depth > 0
        i += 1


def quoted_messages() -> list[Quote]:
    quotes: list[Quote] = []
    for path in (OPERATIONS_MD, README_MD):
        text = path.read_text()
        in_table = False
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.startswith("## "):
                in_table = line.startswith(TROUBLESHOOTING)
            if in_table and line.startswith("| ") and not line.startswith("| message"):
                quotes += [Quote(f"{path.name}:{lineno}", s) for s in _spans_at_depth_zero(line.split(" | ")[0])]
        prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for match in re.finditer(r"`([^`]+)`", prose):
            span = " ".join(match.group(1).split())
            lineno = prose.count("\n", 0, match.start()) + 1
            first_column = path == OPERATIONS_MD and _in_troubleshooting(prose, match.start()) and (
                " | " not in prose[prose.rfind("\n", 0, match.start()):match.start()])
            if not first_column and _reads_as_message(span):
                quotes.append(Quote(f"{path.name}:{lineno}", span))
    return quotes


def _in_troubleshooting(text: str, offset: int) -> bool:
    start = text.find(TROUBLESHOOTING)
    end = text.find("\n## ", start + 1)
    return start <= offset < (end if end >= 0 else len(text))


def _reads_as_message(span: str) -> bool:
    words = _MESSAGE_WORDS.findall(_DOC_PLACEHOLDER.sub(" ", span))
    return len(words) >= 2 and not _NOT_A_MESSAGE.match(span) and "=~" not in span


# --------------------------------------------------------------------------- the matcher
@dataclass(frozen=True)
class Instance:
    """One format string placed on ``doc[start:end]``: how many of its characters match as written,
    and the stretches of the doc its fields took."""

    literal: int
    start: int
    end: int
    holes: tuple[tuple[int, int], ...]


def _align(doc: str, a: int, b: int, tpl: str, open_left: bool, open_right: bool) -> Instance | None:
    """The best placement of ``tpl`` inside ``doc[a:b]`` (most characters matched as written).

    Literal characters must be equal; a ``HOLE`` of the template takes any run of the doc (a value
    the code fills in), a ``STAR`` of the doc any run of the template (the doc's "..."). The template
    is placed whole, except that at an *open* end of the stretch (an end of the quote: a quote may be
    the start of a longer line) it may run on beyond it.
    """
    n, m = b - a, len(tpl)
    score = [[-1] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int, str] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    if open_left:  # the quote may begin after a clause of the line: "...: <quote>", "...; <quote>"
        score[0] = [0 if _clause_ends(tpl[:j]) else -1 for j in range(m + 1)]
    for i in range(n + 1):
        score[i][0] = 0
        d = doc[a + i - 1] if i else ""
        for j in range(1, m + 1):
            t = tpl[j - 1]
            best, step = score[i][j], back[i][j]
            if i and t == d and t != HOLE and score[i - 1][j - 1] >= 0 and score[i - 1][j - 1] + 1 > best:
                best, step = score[i - 1][j - 1] + 1, (i - 1, j - 1, "literal")
            if t == HOLE:
                if i and score[i - 1][j] > best:
                    best, step = score[i - 1][j], (i - 1, j, "hole")  # the field takes one more character
                if score[i][j - 1] > best:
                    best, step = score[i][j - 1], (i, j - 1, "skip")  # the field ends
            # A placeholder takes template text only inside an instance, or at an open end of the stretch:
            # "Voicy API unreachable (...)" must not start the line "Voicy API unavailable (%s)" at its "...".
            starts_here = j == 1 and not (i == 1 and open_left)
            if d == STAR:
                if score[i][j - 1] > best and not starts_here:
                    best, step = score[i][j - 1], (i, j - 1, "star")  # the placeholder takes a token
                if score[i - 1][j] > best:
                    best, step = score[i - 1][j], (i - 1, j, "skip")  # the placeholder ends
            score[i][j], back[i][j] = best, step
    ends = [(score[i][m], i, m) for i in range(n + 1)
            if (last := back[i][m]) is None or last[2] != "star"]  # nor end it (see above)
    if open_right:  # the quote may stop where a clause of the line ends: "<quote>. ...", "<quote> (..."
        ends += [(score[n][j], n, j) for j in range(m + 1) if _clause_starts(tpl[j:])]
    literal, i, j = max(ends)
    if literal < MIN_LITERAL_MATCH:
        return None
    end, start = a + i, a + i
    holes: dict[int, tuple[int, int]] = {}
    while j > 0 and back[i][j] is not None:
        pi, pj, kind = back[i][j]  # type: ignore[misc]
        if kind == "hole":
            lo, hi = holes.get(j, (a + pi, a + pi + 1))
            holes[j] = (min(lo, a + pi), max(hi, a + pi + 1))
        start = min(start, a + i - 1 if kind == "star" else a + pi)  # a "star" step uses doc[i - 1]
        i, j = pi, pj
    return Instance(literal, start, end, tuple(sorted(holes.values())))


def _clause_ends(dropped: str) -> bool:
    """The part of a line before a quote ends a clause: the quote starts one."""
    text = dropped.rstrip()
    return not text or text[-1] in CLAUSE_ENDS


def _clause_starts(dropped: str) -> bool:
    """The part of a line after a quote starts a clause (or a remark in brackets): the quote ends one."""
    text = dropped.lstrip()
    return not text or text[0] in CLAUSE_ENDS + "(["


def _value_kind(token: str) -> str | None:
    """What the code could have filled into a field here: ``"example"`` (a number, an exception class,
    a variable or a URL), ``"word"`` (one of its own constants, such as ``nak``), or None (prose)."""
    quoted = re.fullmatch(r"""[(\[]*(['"]).*\1[),;:.\]]*""", token)  # a value as repr() shows it: 'garmin'
    core = token.strip("'\"()[]{},;:.=" + STAR)
    if (quoted or not re.search(r"[A-Za-z]", core) or re.search(r"\d", core) or _EXAMPLE_VALUE.fullmatch(core)
            or _DOTTED_NAME.fullmatch(core) or _NAME_WITH_HYPHENS.fullmatch(core)):
        return "example"
    return "word" if core in values() else None


class Explainer:
    """Whether a quote is made of format-string instances (nested in each other's fields) and values.

    Each stretch (the quote, then what an instance leaves: before it, after it, inside each of its
    fields) is explained by values alone, or by placing one more format string on it. Placements are
    tried best first and undone when what they leave cannot be explained, so a nested message is
    found whichever of its instances matches more characters.
    """

    def __init__(self, quoted: str, pool: tuple[str, ...]) -> None:
        self.doc = normalise(quoted)
        self.pool = _candidates(self.doc, pool)
        self.words: list[str] = []  # the first words nothing explained, for the failure message

    def explain(self) -> bool:
        return self._explain(0, len(self.doc), True, True, 0, need_instance=True)

    def _explain(self, a: int, b: int, open_left: bool, open_right: bool, depth: int, *,
                 need_instance: bool = False) -> bool:
        kinds = [(w, _value_kind(w)) for w in self.doc[a:b].split()]
        stray = [w for w, kind in kinds if kind is None]
        items = [[_value_kind(w) for w in item.split()] for item in self.doc[a:b].split(",")]
        if not stray and all(item.count("word") <= 1 for item in items) and not need_instance:
            return True  # values alone, one word at most per item: a field holds a value or a list, not a phrase
        stray = stray or [w for w, kind in kinds if kind == "word"]
        if depth < MAX_NESTING:
            placed = [p for t in self.pool if (p := _align(self.doc, a, b, t, open_left, open_right)) is not None]
            placed.sort(key=lambda p: -p.literal)
            for inst in placed[:MAX_TRIES]:
                parts = [(a, inst.start, open_left, False), *((lo, hi, False, False) for lo, hi in inst.holes),
                         (inst.end, b, False, open_right)]
                if all(self._explain(lo, hi, ol, o_r, depth + 1) for lo, hi, ol, o_r in parts if lo < hi):
                    return True
        self.words = self.words or stray or ["(no format string at all)"]
        return False


def _anchors(doc: str) -> dict[str, int]:
    """Word pairs of ``doc`` (weighing twice their length) and its longer words (their length)."""
    words = re.findall(r"[A-Za-z][\w/'.-]*[\w/]|[A-Za-z]", doc.replace(STAR, " "))
    anchors = {w: len(w) for w in words if len(w) >= MIN_LITERAL_MATCH}
    anchors.update({f"{a} {b}": 2 * (len(a) + len(b)) for a, b in zip(words, words[1:])})
    return anchors


@functools.cache
def _word_index(pool: tuple[str, ...]) -> dict[str, list[tuple[str, str]]]:
    """Each word -> the format strings (and their literal text) that contain it."""
    index: dict[str, list[tuple[str, str]]] = {}
    for template in pool:
        text = " ".join(template.replace(HOLE, " ").split())
        for word in set(re.findall(r"[A-Za-z][\w/'.-]*[\w/]|[A-Za-z]", text)):
            index.setdefault(word, []).append((template, text))
    return index


def _candidates(doc: str, pool: tuple[str, ...]) -> list[str]:
    """The format strings sharing the most anchor text with ``doc`` (at most ``MAX_CANDIDATES``)."""
    anchors, index = _anchors(doc), _word_index(pool)
    sharing = {t: text for anchor in anchors if " " not in anchor for t, text in index.get(anchor, ())}
    for anchor in anchors:  # a pair of short words: the templates holding its first word
        if " " in anchor:
            sharing.update(index.get(anchor.split(" ", 1)[0], ()))
    scored, ours = [], our_templates()
    for template, text in sharing.items():
        weight = sum(w for anchor, w in anchors.items() if anchor in text) * (2 if template in ours else 1)
        if weight:
            scored.append((weight, template))
    scored.sort(key=lambda pair: (-pair[0], len(pair[1]), pair[1]))  # at equal weight the shortest first
    chosen = [template for _, template in scored[:MAX_CANDIDATES]]
    # The non-Python lines are short and would rank low: any that shares a word is always tried.
    return chosen + [t for t in EXTERNAL_TEMPLATES if t in sharing and t not in chosen]


def normalise(quoted: str) -> str:
    """Placeholders as ``STAR``, whitespace collapsed."""
    return " ".join(_DOC_PLACEHOLDER.sub(STAR, quoted).split())


def uncovered_words(quoted: str) -> list[str]:
    """The words of ``quoted`` no format string accounts for (empty: the code prints the line)."""
    explainer = Explainer(quoted, templates())
    return [] if explainer.explain() else explainer.words


def matches_code(quoted: str) -> bool:
    return not uncovered_words(quoted)


if __name__ == "__main__":
    for quote in quoted_messages():
        if words := uncovered_words(quote.text):
            print(f"{quote.source}: {quote.text}\n    not from the code: {words}", file=sys.stderr)
