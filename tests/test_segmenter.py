"""Tests of speech.stream.segmenter (plain pytest, no Django)."""

import pytest

from speech.stream.segmenter import Segmenter

SENTENCE, CLAUSE = "sentence", "clause"
BOTH = (SENTENCE, CLAUSE)


def segment(chunks, granularity=SENTENCE, max_chars=400):
    seg = Segmenter(granularity, max_chars)
    out = []
    for chunk in chunks:
        out += seg.feed(chunk)
    return out + seg.flush()


def cases(*rows):
    """rows: (id, granularities, text, expected) -> pytest params, one per granularity."""
    return [pytest.param(g, text, expected, id=f"{case_id}-{g}") for case_id, grans, text, expected in rows for g in grans]


ENDS = cases(
    ("period", BOTH, "One. Two.", ["One.", "Two."]),
    ("exclamation", BOTH, "One! Two!", ["One!", "Two!"]),
    ("question", BOTH, "One? Two?", ["One?", "Two?"]),
    ("dots-run", BOTH, "Wait... What?", ["Wait...", "What?"]),
    ("interrobang-run", BOTH, "Really?! Yes.", ["Really?!", "Yes."]),
    ("unicode-ellipsis", BOTH, "Wait… Then.", ["Wait…", "Then."]),
    ("mark-then-newline", BOTH, "One.\nTwo.", ["One.", "Two."]),
    ("mark-then-tab", BOTH, "One.\tTwo.", ["One.", "Two."]),
    ("latin-mark-needs-whitespace", BOTH, "One.Two!Three?Four", ["One.Two!Three?Four"]),
    ("internal-whitespace-kept", BOTH, "  one  two.   three \t four  ", ["one  two.", "three \t four"]),
    ("cjk-full-stop", BOTH, "你好。世界", ["你好。", "世界"]),
    ("cjk-exclamation", BOTH, "好！对", ["好！", "对"]),
    ("cjk-question", BOTH, "吗？是", ["吗？", "是"]),
    ("cjk-run", BOTH, "真的？！好", ["真的？！", "好"]),
    ("cjk-then-space", BOTH, "你好。 世界", ["你好。", "世界"]),
    ("cjk-then-latin", BOTH, "好。OK", ["好。", "OK"]),
    ("latin-then-cjk-mark-run", BOTH, "好.。对", ["好.。", "对"]),
    ("blank-line", BOTH, "Title\n\nBody", ["Title", "Body"]),
    ("blank-line-with-spaces", BOTH, "Title\n \t \nBody", ["Title", "Body"]),
    ("blank-line-crlf", BOTH, "Title\r\n\r\nBody", ["Title", "Body"]),
    ("single-newline-kept", BOTH, "line one\nline two", ["line one\nline two"]),
    ("clause-marks-ignored-in-sentence", [SENTENCE], "a, b; c: d，e；f、g", ["a, b; c: d，e；f、g"]),
    ("comma", [CLAUSE], "Hello, world", ["Hello,", "world"]),
    ("semicolon", [CLAUSE], "one; two", ["one;", "two"]),
    ("colon", [CLAUSE], "Note: two", ["Note:", "two"]),
    ("cjk-comma", [CLAUSE], "你好，世界", ["你好，", "世界"]),
    ("cjk-semicolon", [CLAUSE], "你好；世界", ["你好；", "世界"]),
    ("cjk-enumeration", [CLAUSE], "甲、乙", ["甲、", "乙"]),
    ("clause-mark-needs-whitespace", [CLAUSE], "a,b;c:d", ["a,b;c:d"]),
    ("clause-and-sentence-run", [CLAUSE], "Well,... fine. Ok", ["Well,...", "fine.", "Ok"]),
)


@pytest.mark.parametrize("granularity, text, expected", ENDS)
def test_ends(granularity, text, expected):
    assert segment([text], granularity) == expected


CLOSING = cases(
    ("double-quote", BOTH, 'He said "Hi." Then', ['He said "Hi."', "Then"]),
    ("single-quote", BOTH, "'Yes!' she said", ["'Yes!'", "she said"]),
    ("curly-double", BOTH, "“Quote.” Next", ["“Quote.”", "Next"]),
    ("curly-single", BOTH, "‘Quote?’ Next", ["‘Quote?’", "Next"]),
    ("paren", BOTH, "(see above.) Next", ["(see above.)", "Next"]),
    ("bracket", BOTH, "[Done.] Next", ["[Done.]", "Next"]),
    ("brace", BOTH, "{Done.} Next", ["{Done.}", "Next"]),
    ("guillemet", BOTH, "«Oui.» Non", ["«Oui.»", "Non"]),
    ("single-guillemet", BOTH, "‹Oui.› Non", ["‹Oui.›", "Non"]),
    ("quote-in-paren", BOTH, '("Really?!") Yes', ['("Really?!")', "Yes"]),
    ("mark-after-closer", BOTH, 'He said "no.". Next', ['He said "no.".', "Next"]),
    ("closer-without-whitespace", BOTH, 'a."b c', ['a."b c']),
    ("cjk-corner", BOTH, "「你好。」他说", ["「你好。」", "他说"]),
    ("cjk-white-corner", BOTH, "『好！』对", ["『好！』", "对"]),
    ("cjk-lenticular", BOTH, "【注意。】好", ["【注意。】", "好"]),
    ("cjk-fullwidth-paren", BOTH, "（好。）对", ["（好。）", "对"]),
    ("cjk-curly", BOTH, "“好。”他", ["“好。”", "他"]),
    ("cjk-curly-single", BOTH, "‘好？’他", ["‘好？’", "他"]),
    ("clause-comma-quote", [CLAUSE], 'He said "yes," then left.', ['He said "yes,"', "then left."]),
    ("clause-cjk-comma-corner", [CLAUSE], "「好，」对", ["「好，」", "对"]),
)


@pytest.mark.parametrize("granularity, text, expected", CLOSING)
def test_closing_quotes_and_brackets_stay(granularity, text, expected):
    assert segment([text], granularity) == expected


NOT_ENDS = cases(
    ("decimal", BOTH, "Pi is 3.14 today.", ["Pi is 3.14 today."]),
    ("thousands", BOTH, "About 1,000 people came.", ["About 1,000 people came."]),
    ("thousands-millions", BOTH, "Over 1,000,000.5 units.", ["Over 1,000,000.5 units."]),
    ("dotted-name", BOTH, "Visit example.com now. Ok", ["Visit example.com now.", "Ok"]),
    ("version", BOTH, "Use v1.2 please. Ok", ["Use v1.2 please.", "Ok"]),
    ("time-colon", [CLAUSE], "At 10:30 we go", ["At 10:30 we go"]),
    ("mr", BOTH, "Ask Mr. Smith now.", ["Ask Mr. Smith now."]),
    ("mrs", BOTH, "Ask Mrs. Smith now.", ["Ask Mrs. Smith now."]),
    ("ms", BOTH, "Ask Ms. Smith now.", ["Ask Ms. Smith now."]),
    ("dr", BOTH, "Ask Dr. Smith now.", ["Ask Dr. Smith now."]),
    ("prof", BOTH, "Ask Prof. Smith now.", ["Ask Prof. Smith now."]),
    ("st", BOTH, "Go to St. Louis now.", ["Go to St. Louis now."]),
    ("vs", BOTH, "Cats vs. dogs today.", ["Cats vs. dogs today."]),
    ("eg", BOTH, "Fruit e.g. apples here.", ["Fruit e.g. apples here."]),
    ("ie", BOTH, "That i.e. this one.", ["That i.e. this one."]),
    ("am", BOTH, "At 9 a.m. we start.", ["At 9 a.m. we start."]),
    ("pm", BOTH, "At 5 p.m. we stop.", ["At 5 p.m. we stop."]),
    ("lowercase-abbr", BOTH, "ask mr. smith now.", ["ask mr. smith now."]),
    ("uppercase-abbr", BOTH, "ASK DR. WHO NOW.", ["ASK DR. WHO NOW."]),
    ("abbr-in-parens", BOTH, "Ask (Dr. Smith) now.", ["Ask (Dr. Smith) now."]),
    ("abbr-at-start", BOTH, "Dr. Smith is here.", ["Dr. Smith is here."]),
    ("abbr-then-newline", BOTH, "Ask Mr.\nSmith now.", ["Ask Mr.\nSmith now."]),
    ("initials", BOTH, "J. R. R. Tolkien wrote it.", ["J. R. R. Tolkien wrote it."]),
    ("dotted-initials", BOTH, "J.R.R. Tolkien in the U.S. Army.", ["J.R.R. Tolkien in the U.S. Army."]),
    ("word-ending-like-abbr", BOTH, "I came first. Then", ["I came first.", "Then"]),
    ("ordinal-ending-like-abbr", BOTH, "He was 1st. Then", ["He was 1st.", "Then"]),
    ("single-lowercase-letter", BOTH, "It is a. B", ["It is a. B"]),
    ("uncased-letter-is-no-initial", BOTH, "好. 对", ["好.", "对"]),
    ("abbr-then-run", BOTH, "Ask Mr.! Then", ["Ask Mr.!", "Then"]),
    ("abbr-then-closer", BOTH, 'I said "Dr." Then', ['I said "Dr."', "Then"]),
    ("clause-abbr", [CLAUSE], "Ask Dr. Who, then go.", ["Ask Dr. Who,", "then go."]),
)


@pytest.mark.parametrize("granularity, text, expected", NOT_ENDS)
def test_not_ends(granularity, text, expected):
    assert segment([text], granularity) == expected


NO_LETTER = cases(
    ("leading-dots", BOTH, "... Hello.", ["... Hello."]),
    ("bangs-between", BOTH, "Hello. !! World.", ["Hello.", "!! World."]),
    ("several-joined", BOTH, "Hello. ... !! World.", ["Hello.", "... !! World."]),
    ("whitespace-collapsed", BOTH, "Hello. ...\n\n  !!   World.", ["Hello.", "... !! World."]),
    ("dash-paragraph", BOTH, "—\n\nEnd", ["— End"]),
    ("cjk-no-gap", BOTH, "。你好。", ["。你好。"]),
    ("flush-drops-remainder", BOTH, "Hello. ...", ["Hello."]),
    ("flush-drops-carry", BOTH, "Hello. !! ", ["Hello."]),
    ("flush-drops-both", BOTH, "Hello. !! ...", ["Hello."]),
    ("nothing-speakable", BOTH, "... !! ?", []),
    ("digits-are-speakable", BOTH, "Hello. 42. Bye.", ["Hello.", "42.", "Bye."]),
    ("clause-lone-comma", [CLAUSE], "Hi, , yes", ["Hi,", ", yes"]),
)


@pytest.mark.parametrize("granularity, text, expected", NO_LETTER)
def test_segments_without_letters_join_the_next(granularity, text, expected):
    assert segment([text], granularity) == expected


def words(n):
    return " ".join(["word"] * n)


LONG = [
    pytest.param(SENTENCE, 10, "aaa bbb ccc ddd", ["aaa bbb", "ccc ddd"], id="small-window"),
    pytest.param(CLAUSE, 10, "aaa bbb ccc ddd", ["aaa bbb", "ccc ddd"], id="small-window-clause"),
    pytest.param(SENTENCE, 400, words(100), [words(80), words(20)], id="500-chars"),
    pytest.param(CLAUSE, 400, words(100), [words(80), words(20)], id="500-chars-clause"),
    pytest.param(SENTENCE, 400, words(200), [words(80), words(80), words(40)], id="repeated"),
    pytest.param(SENTENCE, 400, "ab " * 133 + "a", [("ab " * 133 + "a").strip()], id="exactly-400-not-cut"),
    pytest.param(SENTENCE, 400, "ab " * 133 + "ab", [("ab " * 133).strip(), "ab"], id="401-cut"),
    pytest.param(SENTENCE, 400, "x" * 399 + " " + "y" * 10, ["x" * 399, "y" * 10], id="whitespace-at-399"),
    pytest.param(SENTENCE, 400, "x" * 400 + " " + "y" * 10, ["x" * 400, "y" * 10], id="first-whitespace-after-window"),
    pytest.param(SENTENCE, 400, "x" * 1000, ["x" * 1000], id="no-whitespace-not-cut"),
    pytest.param(CLAUSE, 400, "x" * 1000, ["x" * 1000], id="no-whitespace-not-cut-clause"),
    pytest.param(SENTENCE, 400, "好" * 1000, ["好" * 1000], id="cjk-run-not-cut"),
    pytest.param(SENTENCE, 400, "x" * 1000 + " tail", ["x" * 1000, "tail"], id="run-then-whitespace"),
    pytest.param(SENTENCE, 400, "1,000," * 100 + " a", ["1,000," * 100, "a"], id="commas-without-space-not-cut"),
    pytest.param(SENTENCE, 10, "aaa, bbbbbbbbbb", ["aaa,", "bbbbbbbbbb"], id="after-clause-mark"),
    pytest.param(SENTENCE, 8, "好好好，好好好好好好好", ["好好好，", "好好好好好好好"], id="after-cjk-clause-mark"),
    pytest.param(SENTENCE, 8, "好好好，好好 好好好", ["好好好，好好", "好好好"], id="later-whitespace-wins"),
    pytest.param(SENTENCE, 8, "好" * 12 + "，好", ["好" * 12 + "，", "好"], id="cjk-clause-mark-after-window"),
    pytest.param(SENTENCE, 400, "y " + "x" * 397 + ". z", ["y " + "x" * 397 + ".", "z"], id="end-at-window-edge-wins"),
    pytest.param(SENTENCE, 400, "y " + "x" * 396 + "!!! z", ["y " + "x" * 396 + "!!!", "z"], id="run-across-window-edge"),
    pytest.param(SENTENCE, 400, "y " + "x" * 397 + '.") z', ["y " + "x" * 397 + '.")', "z"], id="closers-across-window-edge"),
    pytest.param(SENTENCE, 400, "y " + "x" * 399 + "!!! z", ["y", "x" * 399 + "!!!", "z"], id="run-after-window"),
    pytest.param(
        SENTENCE,
        400,
        "Hello. " + words(100) + ". Bye.",
        ["Hello.", words(80), words(20) + ".", "Bye."],
        id="window-starts-after-end",
    ),
    pytest.param(SENTENCE, 10, "Hi. —— ——— bbbbbbbbbbbb", ["Hi.", "—— ——— bbbbbbbbbbbb"], id="cut-part-without-letters"),
    pytest.param(SENTENCE, 5, "，" * 6 + "好" * 6, ["，" * 6 + "好" * 6], id="cut-part-without-letters-cjk"),
]


@pytest.mark.parametrize("granularity, max_chars, text, expected", LONG)
def test_long_text_without_end(granularity, max_chars, text, expected):
    assert segment([text], granularity, max_chars) == expected


# Each step: (text fed, segments that feed must return); then what flush must return.
WAITING = [
    pytest.param(SENTENCE, [("It is 3.", []), ("14 now. ", ["It is 3.14 now."])], [], id="decimal-across-chunks"),
    pytest.param(CLAUSE, [("About 1,", []), ("000 people, ok", ["About 1,000 people,"])], ["ok"], id="thousands-clause"),
    pytest.param(SENTENCE, [("Hello.", []), (" ", ["Hello."])], [], id="mark-waits-for-whitespace"),
    pytest.param(SENTENCE, [("Hello.", [])], ["Hello."], id="mark-at-flush"),
    pytest.param(SENTENCE, [("Really?", []), ("!", []), (" Yes", ["Really?!"])], ["Yes"], id="run-waits"),
    pytest.param(SENTENCE, [('He said "Hi.', []), ('"', []), (" Then", ['He said "Hi."'])], ["Then"], id="closer-waits"),
    pytest.param(SENTENCE, [("Ask Mr.", []), (" Smith. ", ["Ask Mr. Smith."])], [], id="abbreviation"),
    pytest.param(SENTENCE, [("你好。", []), ("世界", ["你好。"])], ["世界"], id="cjk-waits-one-char"),
    pytest.param(SENTENCE, [("「你好。", []), ("」", []), ("他说", ["「你好。」"])], ["他说"], id="cjk-closer"),
    pytest.param(SENTENCE, [("你好。", [])], ["你好。"], id="cjk-at-flush"),
    pytest.param(CLAUSE, [("你好，", []), ("世界", ["你好，"])], ["世界"], id="cjk-clause-waits"),
    pytest.param(CLAUSE, [("Hello,", []), (" world", ["Hello,"])], ["world"], id="clause-waits"),
    pytest.param(SENTENCE, [("Title\n", []), ("  ", []), ("\nBody", ["Title"])], ["Body"], id="newline-waits"),
    pytest.param(SENTENCE, [("one\n", []), ("two", [])], ["one\ntwo"], id="newline-no-blank-line"),
    pytest.param(SENTENCE, [("x" * 500, []), (" ", ["x" * 500]), ("y", [])], ["y"], id="uncut-run-until-whitespace"),
    pytest.param(SENTENCE, [(words(100), [words(80)])], [words(20)], id="cut-returned-by-feed"),
    pytest.param(SENTENCE, [("... ", []), ("Hi. ", ["... Hi."])], [], id="carry-held-until-next"),
]


@pytest.mark.parametrize("granularity, steps, flushed", WAITING)
def test_feed_returns_only_complete_segments(granularity, steps, flushed):
    seg = Segmenter(granularity)
    for text, expected in steps:
        assert seg.feed(text) == expected, text
    assert seg.flush() == flushed
    assert seg.pending_chars == 0


def test_flush_empties_the_buffer():
    seg = Segmenter()
    assert seg.flush() == []
    assert seg.feed("Hello") == []
    assert seg.flush() == ["Hello"]
    assert seg.flush() == []
    assert seg.feed("Again. ") == ["Again."]


def test_flush_resets_state():
    seg = Segmenter()
    seg.feed("x" * 500)  # no whitespace: nothing can be cut
    assert seg.flush() == ["x" * 500]
    assert seg.feed("a b") == []  # no stale "cut at next whitespace"
    seg.feed("Hello. ...")
    assert seg.flush() == []  # "..." dropped, and not carried over
    assert seg.feed("Hi. ") == ["Hi."]


def test_clear_drops_everything():
    seg = Segmenter()
    assert seg.feed("你好。") == []
    seg.clear()
    assert seg.pending_chars == 0
    assert seg.feed("世界。x") == ["世界。"]
    seg.clear()
    assert seg.feed("Hi. ... ") == ["Hi."]
    assert seg.pending_chars == 3
    seg.clear()  # the held "..." goes too
    assert seg.pending_chars == 0
    assert seg.feed("Yo. ") == ["Yo."]
    seg.feed("x" * 500)
    seg.clear()
    assert seg.feed("Hello world") == []  # no stale "cut at next whitespace"
    assert seg.flush() == ["Hello world"]


def test_newline_cut_away_is_not_held():
    seg = Segmenter(SENTENCE, 10)
    assert seg.feed("x" * 10 + "\n  ") == ["x" * 10]  # cut at the first whitespace after the window
    assert seg.pending_chars == 0
    assert seg.feed("\nb") == []
    assert seg.pending_chars == 1
    assert seg.flush() == ["b"]


def test_pending_chars():
    seg = Segmenter()
    assert seg.pending_chars == 0
    seg.feed("  Hello")
    assert seg.pending_chars == 5  # leading whitespace is not held
    assert seg.feed(". Wor") == ["Hello."]
    assert seg.pending_chars == 3
    seg.feed("ld is big\n")
    assert seg.pending_chars == len("World is big\n")
    seg.flush()
    assert seg.pending_chars == 0
    seg.feed("x" * 1000)
    assert seg.pending_chars == 1000


@pytest.mark.parametrize("granularity", ["Sentence", "CLAUSE", " clause", "sentences", "word", ""])
def test_invalid_granularity(granularity):
    with pytest.raises(ValueError):
        Segmenter(granularity)


@pytest.mark.parametrize("max_chars", [0, -1])
def test_invalid_max_chars(max_chars):
    with pytest.raises(ValueError):
        Segmenter(SENTENCE, max_chars)


def test_default_granularity_is_sentence():
    assert segment(["one, two. three"]) == ["one, two.", "three"]
    seg = Segmenter()
    assert seg.feed("one, two. three") + seg.flush() == ["one, two.", "three"]


MIXED_EN = (
    "  Hello there, Mr. Smith! Pi is 3.14; about 1,000 people visit example.com (v1.2) daily... "
    'J. R. R. Tolkien said: "Not all who wander are lost." Really?! Yes… at 5 p.m. e.g. today.\n\n'
    "— \n \n!! ... Next paragraph\r\n\r\nDr. Who, i.e. the Doctor, vs. the Master? [Done.] ok"
)
MIXED_CJK = (
    "你好。世界！「真的？」他说，「是的。」『好！』【注意。】（括号。）甲、乙；丙：丁\n\nHello 你好。OK. 。。好？！“引号。”结束"
)
LONG_PLAIN = " ".join(f"word{i % 37}" for i in range(150))  # over 900 characters, no punctuation
EDGES = (
    "x" * 430
    + ". "
    + "y" * 20
    + "\n"
    + " " * 30
    + "\nz 3. 14 Ms.\t"
    + "好" * 15
    + "，"
    + "好" * 5
    + " ... "
    + "!" * 12
    + "\n\n\n a,b , c"
    + "." * 5
)
TEXTS = {"mixed-en": MIXED_EN, "mixed-cjk": MIXED_CJK, "long-plain": LONG_PLAIN, "edges": EDGES}
SEAM = [pytest.param(name, g, m, id=f"{name}-{g}-{m}") for name in TEXTS for g in BOTH for m in (400, 12)]


@pytest.mark.parametrize("name, granularity, max_chars", SEAM)
def test_any_two_chunk_split_gives_the_same_segments(name, granularity, max_chars):
    text = TEXTS[name]
    whole = segment([text], granularity, max_chars)
    assert len(whole) > 1
    for i in range(len(text) + 1):
        assert segment([text[:i], text[i:]], granularity, max_chars) == whole, i


@pytest.mark.parametrize("name, granularity, max_chars", SEAM)
def test_one_character_at_a_time_gives_the_same_segments(name, granularity, max_chars):
    text = TEXTS[name]
    assert segment(list(text), granularity, max_chars) == segment([text], granularity, max_chars)


def test_long_plain_text_is_cut():
    assert len(LONG_PLAIN) > 900
    out = segment([LONG_PLAIN])
    assert len(out) == 3
    assert all(len(s) < 400 for s in out)
    assert " ".join(out) == LONG_PLAIN


def test_mixed_english_reference():
    assert segment([MIXED_EN]) == [
        "Hello there, Mr. Smith!",
        "Pi is 3.14; about 1,000 people visit example.com (v1.2) daily...",
        'J. R. R. Tolkien said: "Not all who wander are lost."',
        "Really?!",
        "Yes…",
        "at 5 p.m. e.g. today.",
        "— !! ... Next paragraph",
        "Dr. Who, i.e. the Doctor, vs. the Master?",
        "[Done.]",
        "ok",
    ]


def test_mixed_cjk_reference():
    assert segment([MIXED_CJK], CLAUSE) == [
        "你好。",
        "世界！",
        "「真的？」",
        "他说，",
        "「是的。」",
        "『好！』",
        "【注意。】",
        "（括号。）",
        "甲、",
        "乙；",
        "丙：丁",
        "Hello 你好。",
        "OK.",
        "。。好？！",
        "“引号。”",
        "结束",
    ]


N = 262_144
RUNS = [
    pytest.param("x" * N, ["x" * N, "tail."], id="letters"),
    pytest.param("好" * N, ["好" * N, "tail."], id="cjk"),
    pytest.param("." * N, ["." * N + " tail."], id="dots"),
    pytest.param("!" * N, ["!" * N + " tail."], id="bangs"),
]


@pytest.mark.parametrize("run, expected", RUNS)
def test_long_run_fed_one_character_at_a_time(run, expected):
    seg = Segmenter()
    for ch in run:
        assert seg.feed(ch) == []
    assert seg.pending_chars == N
    assert seg.feed(" tail.") + seg.flush() == expected


def test_long_text_with_whitespace_fed_one_character_at_a_time():
    text = "ab " * (N // 3)
    seg = Segmenter()
    out = []
    for ch in text:
        out += seg.feed(ch)
    out += seg.flush()
    assert len(out) > 600
    assert all(len(s) < 400 for s in out)
    assert " ".join(out) == text.strip()
