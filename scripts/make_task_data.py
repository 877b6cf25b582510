"""Write the small synthetic data sets the task recipes train on (recipes/data/).

Every sentence is generated here from the word lists below (written for ortft; CC0 1.0,
public domain). Re-running writes the same files: the generator is seeded.
    python scripts/make_task_data.py            # write them
    python scripts/make_task_data.py --check    # exit 1 if a committed file differs
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "recipes" / "data"
PEOPLE = ["Ada Moreno", "Ben Okafor", "Chen Wei", "Dana Kowalski", "Eli Haddad", "Fay Lindqvist",
          "Gus Tanaka", "Hana Novak", "Ivo Petrov", "Jun Park", "Kira Mensah", "Leo Duarte"]
PLACES = ["Lisbon", "Nairobi", "Osaka", "Quito", "Tallinn", "Hobart", "Accra", "Bergen", "Cusco", "Dakar"]
ORGS = ["Northwind Labs", "Bluefin Press", "Acme Rail", "Copper Valley Bank", "Orbit Foods",
        "Redstone Clinic", "Silverline Studios"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _tag(words: str, kind: str) -> list[tuple[str, str]]:
    parts = words.split()
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(parts)]


def ner(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        p, o, loc = rng.choice(PEOPLE), rng.choice(ORGS), rng.choice(PLACES)
        form = rng.randrange(3)
        if form == 0:
            seq = [*_tag(p, "PER"), ("works", "O"), ("at", "O"), *_tag(o, "ORG"), ("in", "O"),
                   *_tag(loc, "LOC"), (".", "O")]
        elif form == 1:
            seq = [("Yesterday", "O"), *_tag(p, "PER"), ("flew", "O"), ("to", "O"), *_tag(loc, "LOC"),
                   ("for", "O"), *_tag(o, "ORG"), (".", "O")]
        else:
            seq = [*_tag(o, "ORG"), ("hired", "O"), *_tag(p, "PER"), ("last", "O"), ("week", "O"), (".", "O")]
        rows.append({"tokens": [w for w, _ in seq], "tags": [t for _, t in seq]})
    return rows


def qa(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        p, o, loc = rng.choice(PEOPLE), rng.choice(ORGS), rng.choice(PLACES)
        year = str(rng.randint(1990, 2024))
        context = f"{p} joined {o} in {year}. The company is based in {loc}, where {p.split()[0]} now lives."
        question, answer = rng.choice([(f"Where is {o} based?", loc), (f"When did {p} join {o}?", year),
                                       (f"Which company did {p} join?", o)])
        rows.append({"context": context, "question": question, "answer_text": answer,
                     "answer_start": context.index(answer)})
    return rows


def numbers(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        digits = [rng.randrange(10) for _ in range(rng.randint(2, 5))]
        rows.append({"source": " ".join(NUMBERS[d] for d in digits), "target": " ".join(map(str, digits))})
    return rows


def instructions(rng: random.Random, n: int) -> list[dict]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        p, loc = rng.choice(PEOPLE), rng.choice(PLACES)
        kind = rng.randrange(3)
        if kind == 0:
            rows.append({"prompt": f"Add {a} and {b}.", "response": f"{a} plus {b} is {a + b}."})
        elif kind == 1:
            rows.append({"prompt": f"Write a greeting from {p} to {loc}.",
                         "response": f"Hello {loc}, warm wishes from {p}!"})
        else:
            rows.append({"messages": [{"role": "user", "content": f"Is {a} larger than {b}?"},
                                      {"role": "assistant", "content": "Yes." if a > b else "No."}]})
    return rows


def wrong_digits(rng: random.Random, digits: list[int]) -> list[int]:
    """A plausible wrong answer: one digit changed, two unequal neighbours swapped, or one dropped
    (doubled in a two-digit answer: a one-digit answer is a bare JSON number, which datasets
    decodes as a number in a file that mixes strings and message lists)."""
    out = list(digits)
    swaps = [i for i in range(len(out) - 1) if out[i] != out[i + 1]]
    kind = rng.choice(["change", "drop"] + (["swap"] if swaps else []))
    if kind == "change":
        i = rng.randrange(len(out))
        out[i] = rng.choice([d for d in range(10) if d != out[i]])
    elif kind == "swap":
        i = rng.choice(swaps)
        out[i], out[i + 1] = out[i + 1], out[i]
    elif len(out) > 2:
        del out[rng.randrange(len(out))]
    else:
        i = rng.randrange(len(out))
        out.insert(i, out[i])
    return out


def preference(rng: random.Random, n: int, seen: set[str]) -> list[dict]:
    """Number words to digits as preference pairs: chosen the right digits, rejected a plausible
    wrong answer; one row in four in conversation form (message lists sharing the user turn).
    Every prompt is new (not in ``seen``, which grows): the eval prompts are held out."""
    rows: list[dict] = []
    while len(rows) < n:
        digits = [rng.randrange(10) for _ in range(rng.randint(2, 5))]
        prompt = "Write in digits: " + " ".join(NUMBERS[d] for d in digits)
        if prompt in seen:
            continue
        seen.add(prompt)
        chosen, rejected = " ".join(map(str, digits)), " ".join(map(str, wrong_digits(rng, digits)))
        if rng.random() < 0.25:
            user = {"role": "user", "content": prompt}
            rows.append({"chosen": [user, {"role": "assistant", "content": chosen}],
                         "rejected": [user, {"role": "assistant", "content": rejected}]})
        else:
            rows.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return rows


def sft(rows: list[dict]) -> list[dict]:
    """The preference rows' chosen answers as instruction rows (the under-trained start's data)."""
    return [{"messages": r["chosen"]} if isinstance(r["chosen"], list)
            else {"prompt": r["prompt"], "response": r["chosen"]} for r in rows]


def digit_questions(split: str) -> list[dict]:
    """Two questions about each scanned digit of digits/<split>.csv (the image task's split, so
    the held-out rows are held-out images): which digit, as a word (the simple
    image/question/answer form), and whether it is even or odd (a conversation with an image
    part). Their own folder, digit-questions/ (digits/ is make-digits.py's, which --check
    compares whole); image paths are relative to it, into digits/images/."""
    lines = (OUT / "digits" / f"{split}.csv").read_text().splitlines()[1:]
    rows = []
    for line in lines:
        image, label = line.split(",")
        digit = int(label)
        image = f"../digits/{image}"
        rows.append({"image": image, "question": "Which digit is this?", "answer": NUMBERS[digit]})
        parity = "even" if digit % 2 == 0 else "odd"
        rows.append({"image": image, "messages": [
            {"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "Is this digit even or odd?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": parity}]}]})
    return rows


LICENSE = (
    "The files in this folder are synthetic, generated by scripts/make_task_data.py from word\n"
    "lists written for ortft. They are dedicated to the public domain under CC0 1.0:\n"
    "https://creativecommons.org/publicdomain/zero/1.0/\n"
    "Except digits/: real scanned handwriting (UCI, via scikit-learn); digits/README.md\n"
    "gives its source and terms.\n"
    "Except speech/: spoken digit strings synthesised with espeak-ng; speech/README.md\n"
    "gives its source and terms.\n"
    "Except bbc-pairs/: short excerpts of BBC News articles (the quickstart's corpus);\n"
    "bbc-pairs/README.md gives their source and terms.\n"
    "Except preference-start/: a tiny GPT-2 trained on preference-sft-train.jsonl by\n"
    "scripts/make-preference-start.py; CC0 1.0 like the data it learned.\n")


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def files() -> dict[str, str]:
    """Every file this script writes, by name, with its text."""
    out: dict[str, str] = {}
    rng = random.Random(0)
    for name, make, n_train, n_eval in (("ner", ner, 240, 40), ("qa", qa, 240, 40),
                                        ("numbers", numbers, 400, 40), ("instructions", instructions, 300, 30)):
        out[f"{name}-train.jsonl"] = jsonl(make(rng, n_train))
        out[f"{name}-eval.jsonl"] = jsonl(make(rng, n_eval))
    rng, seen = random.Random(50), set()  # its own seed: the files above stay as they were
    train, held_out = preference(rng, 320, seen), preference(rng, 60, seen)
    out["preference-train.jsonl"], out["preference-eval.jsonl"] = jsonl(train), jsonl(held_out)
    out["preference-sft-train.jsonl"] = jsonl(sft(train))
    out["preference-sft-eval.jsonl"] = jsonl(sft(held_out))
    out["digit-questions/train.jsonl"] = jsonl(digit_questions("train"))
    out["digit-questions/eval.jsonl"] = jsonl(digit_questions("eval"))
    out["LICENSE.txt"] = LICENSE
    return out


def main() -> None:
    check = sys.argv[1:] == ["--check"]
    stale = []
    for name, text in files().items():
        path = OUT / name
        if check and (not path.is_file() or path.read_text() != text):
            stale.append(name)
        elif not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        sys.exit(f"recipes/data: {', '.join(stale)} differ from what scripts/make_task_data.py "
                 "writes; run it and commit the files")


if __name__ == "__main__":
    main()
