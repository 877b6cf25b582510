"""What makes an export folder usable outside ortft: a tokenizer without training's fixed
padding, the runtimes it was checked in, and a model card with a usage snippet.

A client of ``onnx/`` tokenizes with plain ``tokenizers`` (``Tokenizer.from_file``), builds an
all-ones attention mask for the ids it got, and runs the session. Training leaves its padding in
the tokenizer's state (``padding: {length: 128}`` after ``padding="max_length"``): such a client
would get 128 ids for every text, and with an all-ones mask the pad tokens count as text (as
reported in issue #20, the quickstart's classifier then called three news texts of three topics
"sports"). The export's
``tokenizer.json`` therefore has no padding and truncates at the model's position limit;
``tokenizer_config.json`` keeps the training length as ``training_max_length``, for reference.

An image export has no tokenizer: its image processor (``preprocessor_config.json``) is saved
as trained (its PIL backend; nothing of training's is left in it), and its card's snippet (the
family's own: ``protocols.DescribesExport``) decodes with Pillow, converts to RGB as
``ortft.data.images.to_rgb`` does (alpha over white), then runs ``preprocess.onnx`` and
``model.onnx``.

The model card (``README.md``) holds one snippet per task (a text family's own code:
``protocols.WritesSnippet``, the generation family's loops): onnxruntime + tokenizers (images:
Pillow) only, run from inside the folder. ``tests/test_consumer.py`` extracts it and runs it verbatim in a clean
venv with the onnxruntime release of ``requirements/consumer.txt``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ortft.core.reports import ExportReport, RuntimeReport, TokenizerReport
from ortft.tasks import protocols, traits

CARD_FENCE = "```python"  # the snippet's opening line (tests/test_consumer.py finds it by this)

# the text each task's snippet runs on (plain data, shown to users as the example input)
EXAMPLE = {
    "label": "a great fun movie",
    "tags": "Anna flew to Paris on Monday .",
    "fill-mask": "The company is [MASK] in Hobart.",
    "generate": "the cat sat",
}
QA_EXAMPLE = ("Where does Anna live?", "Anna lives in Paris and works in Lyon.")
PAIR_EXAMPLE = ("The plot was boring.", "A great fun movie.")  # a pair classifier's


def model_limit(config: Any) -> int | None:
    """The model's position limit (absolute position embeddings), None when it has none (T5)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def label_names(folder: Path, config: Any) -> None:
    """Write ``id2label`` into config.json even when it is transformers' default (LABEL_0, ...),
    which ``save_pretrained`` leaves out: a client reads the names from there."""
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    if "id2label" not in saved:
        saved["id2label"] = {str(k): str(v) for k, v in config.id2label.items()}
        saved["label2id"] = {str(v): int(k) for k, v in config.id2label.items()}
        path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def clean_tokenizer(
    folder: Path, limit: int | None, training_max_length: int | None
) -> TokenizerReport:
    """Rewrite the saved tokenizer for clients: no padding, truncation at ``limit``; returns
    export.json's ``tokenizer`` section."""
    path = folder / "tokenizer.json"
    spec = json.loads(path.read_text())
    spec["padding"] = None
    spec["truncation"] = (
        {"direction": "Right", "max_length": limit, "strategy": "LongestFirst", "stride": 0}
        if limit
        else None
    )
    path.write_text(json.dumps(spec, ensure_ascii=False, indent=2) + "\n")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if limit:
        config["model_max_length"] = limit
    if training_max_length:
        config["training_max_length"] = training_max_length
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    return {"padding": None, "truncation": limit, "training_max_length": training_max_length}


def training_max_length(model_dir: Path) -> int | None:
    """``data.max_length`` of the recipe saved in a run's final/ (None without one)."""
    import yaml

    try:
        raw = yaml.safe_load((model_dir / "recipe.yaml").read_text())
        value = (raw.get("data") or {}).get("max_length")
    except (OSError, AttributeError, yaml.YAMLError):
        return None
    return value if isinstance(value, int) else None


def ir_version(path: Path) -> int:
    import onnx

    return int(onnx.load(str(path), load_external_data=False).ir_version)


def checked_runtime(how: str) -> RuntimeReport:
    """The onnxruntime this process ran the export's check in (the ort profile's training
    build, or the current profile's plain one)."""
    import importlib.metadata

    import onnxruntime as ort

    package = next(
        (
            p
            for p in (
                "onnxruntime-training",
                "onnxruntime-training-cpu",
                "onnxruntime",
                "onnxruntime-gpu",
            )
            if _installed(importlib.metadata, p)
        ),
        "onnxruntime",
    )
    return {"package": package, "version": ort.__version__, "checked": how}


def _installed(metadata: Any, name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


# --------------------------------------------------------------------------- the model card

_HEAD = """import json
import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

tok = Tokenizer.from_file("tokenizer.json")
{sessions}
config = json.load(open("config.json"))
"""

_RUN = """ids = np.array([enc.ids], dtype=np.int64)
logits = session.run(["logits"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
"""

# a sentence-pair model's graph with segment embeddings: which text each token is from
_RUN_TYPES = """ids = np.array([enc.ids], dtype=np.int64)
types = np.array([enc.type_ids], dtype=np.int64)
feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": types}
logits = session.run(["logits"], feeds)[0]
"""

_BODY = {
    "label": """enc = tok.encode({text})
{run}print(config["id2label"][str(logits[0].argmax())])
""",
    "label-pair": """enc = tok.encode({text}, {text_pair})  # the pair as one sequence
{run}print(config["id2label"][str(logits[0].argmax())])
""",
    "tags": """words = {text}.split()
enc = tok.encode(words, is_pretokenized=True)
{run}tags = {{}}  # a word's tag is its first sub-token's
for pos, word in enumerate(enc.word_ids):
    if word is not None and word not in tags:
        tags[word] = config["id2label"][str(logits[0, pos].argmax())]
print(" ".join(f"{{w}}/{{tags.get(i, '-')}}" for i, w in enumerate(words)))
""",
    "answer": """question, context = {question}, {context}
enc = tok.encode(question, context)
ids = np.array([enc.ids], dtype=np.int64)
feeds = {{"input_ids": ids, "attention_mask": np.ones_like(ids)}}
start_logits, end_logits = session.run(["start_logits", "end_logits"], feeds)
score = start_logits[0][:, None] + end_logits[0][None, :]  # start + end, [seq, seq]
in_context = np.array(enc.sequence_ids) == 1
i, j = np.indices(score.shape)
score[~((j >= i) & (j - i < 30) & in_context[:, None] & in_context[None, :])] = -np.inf
start, end = np.unravel_index(score.argmax(), score.shape)
print(context[enc.offsets[start][0] : enc.offsets[end][1]])
""",
    "fill-mask": """enc = tok.encode({text})
{run}mask = tok.token_to_id({mask})
filled = [int(logits[0, i].argmax()) if t == mask else t for i, t in enumerate(enc.ids)]
print(tok.decode(filled))
""",
}

_SESSION = 'session = ort.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])'


def head(sessions: str = _SESSION) -> str:
    """A text snippet's first lines: the imports, the tokenizer, ``sessions`` (default:
    model.onnx's) and the config."""
    return _HEAD.format(sessions=sessions)


def snippet(task: Any, tokenizer: Any, inputs: tuple[str, ...] | None = None) -> str:
    """The usage snippet for ``task`` (a ``tasks.Task``); ``inputs``: a sentence-pair
    classifier's graph inputs (None: not a pair model)."""
    body = kind = traits.predicts(task)
    text = EXAMPLE.get(kind or "label", "")
    if inputs is not None:
        body, text = "label-pair", PAIR_EXAMPLE[0]
    question, context = QA_EXAMPLE
    code = _BODY[str(body)].format(
        run=_RUN_TYPES if "token_type_ids" in (inputs or ()) else _RUN,
        **{  # as JSON strings: valid Python literals, in double quotes
            k: json.dumps(v, ensure_ascii=False)
            for k, v in {
                "text": text,
                "text_pair": PAIR_EXAMPLE[1],
                "question": question,
                "context": context,
                "mask": getattr(tokenizer, "mask_token", None) or "[MASK]",
            }.items()
        },
    )
    return head() + code


def example_input(task: Any, tokenizer: Any, pair: bool = False) -> dict[str, str]:
    """The snippet's input as an ``ortft predict`` JSON line (what the consumer test feeds);
    ``pair``: a sentence-pair classifier's."""
    if pair:
        return dict(zip(("text", "text_pair"), PAIR_EXAMPLE, strict=True))
    if isinstance(task, protocols.ReadsFields):  # question answering: its two columns
        return task.example_input()
    return {"text": EXAMPLE.get(traits.predicts(task) or "label", "")}


def write_card(folder: Path, task: Any, tokenizer: Any, report: ExportReport) -> None:
    """README.md of the export folder: what it holds and the usage snippet."""
    cache = report.get("kv_cache")
    files = ", ".join(f"`{f}`" for f in report["files"].values())
    runtimes = "; ".join(
        f"{r['package']} {r['version']} ({r['checked']})" for r in report["runtimes"]
    )
    graph = {
        True: "decoder with a KV cache (inputs `past_key_values.<layer>.key/value`, outputs "
        "`present.<layer>.key/value`; the first step takes them empty)",
        False: "decoder without a KV cache (the whole sequence each step)",
        None: "",
    }[cache]
    if isinstance(task, protocols.DescribesExport):
        code, holds, inputs, usage = task.card(report)
    else:
        code, holds, inputs, usage = _text_card(task, tokenizer, report)
    call = None
    if isinstance(task, protocols.OpensInTransformersJs):
        call = task.js_call(tokenizer, report)
    js = ""
    if call is not None:  # the transformers.js pipeline that opens the folder
        from ortft.export import js_card

        js = js_card.section(*call, q4=bool(report["files"].get("int4")))
    (folder / "README.md").write_text(
        f"""---
library_name: onnxruntime
tags: [ortft, onnx, {task.name}]
---
# ONNX export (ortft)

- **Task:** {task.name}{f"; {graph}" if graph else ""}
- **Files:** {files}, {holds}, `config.json`, `export.json` (checks)
- **ONNX:** opset {report["opset"]}, IR version {report["ir_version"]}
- **Checked in:** {runtimes}{_genai_line(report)}
{inputs}

Usage with {usage} only, run from this folder:

{CARD_FENCE}
{code}```
{js}"""
    )


def _genai_line(report: ExportReport) -> str:
    """The card's line on onnxruntime-genai where the export holds its config."""
    genai = report.get("genai") or {}
    if not genai.get("config"):
        return ""
    line = (
        f"\n- **onnxruntime-genai:** `{genai['config']}` (model type {genai['model_type']}): "
        '`og.Model(".")` opens this folder'
    )
    int4 = genai.get("int4") or {}
    if int4.get("folder"):  # genai opens one graph a folder: the int4 one has its own
        line += (
            f'; `og.Model("{int4["folder"]}")` opens the int4 weights (`{int4["filename"]}`, '
            f"through `{int4['config']}`)"
        )
    return line


def _text_card(task: Any, tokenizer: Any, report: ExportReport) -> tuple[str, str, str, str]:
    """(the snippet, what else the folder holds, the tokenizer line, what the snippet needs)."""
    pair = tuple(report["inputs"]) if report.get("text_pair") else None
    if isinstance(task, protocols.WritesSnippet):  # the family's own code (generation's loops)
        code = task.snippet(tokenizer, report)
    else:
        code = snippet(task, tokenizer, pair)
    length = report["tokenizer"]["training_max_length"]
    trained = f" (trained with {length})" if length else ""
    line = (
        f"- **Tokenizer:** no padding; truncates at "
        f"{report['tokenizer']['truncation'] or 'no limit'} tokens{trained}.\n"
        "  Build the attention mask for the ids you get (all ones for one text)."
    )
    if pair:
        line += (
            "\n- **Text pairs:** encode both texts as one sequence, `tok.encode(text, text_pair)`"
            + ("; its `type_ids` are `token_type_ids`." if "token_type_ids" in pair else ".")
        )
    return code, "the tokenizer (`tokenizer.json`)", line, "`onnxruntime` and `tokenizers`"


def card_snippet(readme: str) -> str:
    """The snippet of a model card (the first python block)."""
    start = readme.index(CARD_FENCE) + len(CARD_FENCE) + 1
    return readme[start : readme.index("```", start)]


# --------------------------------------------------------------------------- another runtime

# Run in the other runtime's Python (``python -I``: nothing of ortft or its venv): each graph on
# the feeds saved for it, outputs saved back; the version and the package it came from too.
_RUNNER = """
import importlib.metadata as md, json, sys
import numpy as np, onnxruntime as ort
folder, feeds_path, out_path = sys.argv[1:4]
feeds = np.load(feeds_path)
out = {}
for name in sorted({k.rsplit("/", 1)[0] for k in feeds.files}):  # a graph's path may hold "/"
    sess = ort.InferenceSession(f"{folder}/{name}", providers=["CPUExecutionProvider"])
    given = {k.rsplit("/", 1)[1]: feeds[k] for k in feeds.files if k.rsplit("/", 1)[0] == name}
    for o, v in zip(sess.get_outputs(), sess.run(None, given)):
        out[f"{name}/{o.name}"] = v
np.savez(out_path, **out)
package = next((p for p in ("onnxruntime", "onnxruntime-gpu", "onnxruntime-training")
                if p in {d.metadata["Name"] for d in md.distributions()}), "onnxruntime")
print(json.dumps({"package": package, "version": ort.__version__}))
"""


def full_precision(files: dict[str, str]) -> list[str]:
    """The export's fp32 graphs: the ones compared across runtimes to the fp32 tolerance (the
    fp16 and int8 variants' outputs move by more between builds: 1.1e-4 measured for fp16)."""
    return [f for k, f in files.items() if f.endswith(".onnx") and k not in ("fp16", "int8")]


def graph_feeds(folder: Path, files: dict[str, str], feeds: dict[str, Any]) -> dict[str, Any]:
    """``{"<graph>/<input>": array}`` for every graph of the export: the parity rows (at most
    8), an empty past, for a seq2seq decoder the encoder's output and 4 target tokens, for an
    image export's preprocess.onnx one decoded ``image`` (uint8 [height, width, 3]), for a
    speech export's features.onnx one clip's ``samples``. The encoder is listed before the
    decoder in ``files``."""
    import numpy as np

    from ortft.export import parity

    one = ("image", "samples")  # one decoded image or clip, not rows
    rows = {k: v if k in one else v[:8] for k, v in feeds.items()}
    out: dict[str, Any] = {}
    hidden = None
    for name in full_precision(files):
        sess = parity.session(folder / name)
        takes = {i.name for i in sess.get_inputs()}
        given = {k: rows[k] for k in takes if k in rows}
        given.update(parity.empty_past(sess, len(rows.get("input_ids", ()))))
        if "encoder_hidden_states" in takes:  # a speech decoder has no encoder mask
            given["input_ids"] = np.ascontiguousarray(rows["input_ids"][:, :4])
            given["encoder_hidden_states"] = hidden
            if "encoder_attention_mask" in takes:
                given["encoder_attention_mask"] = rows["attention_mask"]
        if "use_cache_branch" in takes:  # a merged decoder's first step (the empty past)
            given["use_cache_branch"] = np.array([False])
        if name.startswith("encoder"):
            hidden = sess.run(None, given)[0]
        out.update({f"{name}/{k}": v for k, v in given.items()})
    return out


def check_runtime(
    python: str, folder: Path, files: dict[str, str], feeds: dict[str, Any], tolerance: float
) -> RuntimeReport:
    """Load every graph of the export in another onnxruntime (``python``: a Python with it
    installed) and compare its outputs with this runtime's on the same feeds. Returns a
    ``runtimes`` entry; ``passed`` says whether every output was within ``tolerance``."""
    import subprocess
    import tempfile

    import numpy as np

    from ortft.core.errors import InputError
    from ortft.export import parity

    given = graph_feeds(folder, files, feeds)
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(f"{tmp}/feeds.npz", **given)
        try:
            proc = subprocess.run(
                [python, "-I", "-c", _RUNNER, str(folder), f"{tmp}/feeds.npz", f"{tmp}/out.npz"],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except OSError as err:
            raise InputError(f"--check-runtime {python}: cannot run it ({err.strerror})") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise InputError(f"--check-runtime {python}: the export did not run there: {last}")
        got = dict(np.load(f"{tmp}/out.npz"))
    diff = 0.0
    for name in sorted({k.rsplit("/", 1)[0] for k in given}):  # onnx/vision_encoder.onnx/...
        sess = parity.session(folder / name)
        mine = {k.rsplit("/", 1)[1]: v for k, v in given.items() if k.rsplit("/", 1)[0] == name}
        for o, v in zip(sess.get_outputs(), sess.run(None, mine), strict=True):
            diff = max(diff, float(np.max(np.abs(got[f"{name}/{o.name}"] - v), initial=0.0)))
    entry = json.loads(proc.stdout.strip().splitlines()[-1])
    entry.update(
        checked=f"loaded {', '.join(full_precision(files))}; outputs compared with this "
        "build's on the parity rows",
        max_abs_diff=diff,
        passed=diff <= tolerance,
    )
    return entry
