"""The model card's transformers.js snippet: the pipeline that opens the export folder as ortft
wrote it (``onnx/model.onnx``, config.json, tokenizer.json or preprocessor_config.json), in Node,
offline, run from the folder. A family whose export transformers.js has a pipeline for gives the
call (``protocols.OpensInTransformersJs``); the consumer tier runs the snippet verbatim and
checks that it prints what ``tests/node/pipeline.mjs`` gets for the same call."""

from __future__ import annotations

import json
from typing import Any

JS_FENCE = "```js"  # the snippet's opening line (tests/test_consumer.py finds it by this)
VERSION = "4.3.1"  # the transformers.js release the consumer tier runs (tests/node/)

_CODE = """import path from "node:path";
import {{ pipeline, env }} from "@huggingface/transformers";

env.allowRemoteModels = false; // this folder only, never the Hub
env.localModelPath = path.dirname(process.cwd()) + path.sep; // the folder that holds this one
const run = await pipeline({pipeline}, path.basename(process.cwd()), {{ dtype: {dtype} }});
const out = await run({args});
console.log(JSON.stringify(out?.tolist ? out.tolist() : out));
"""


def snippet(pipeline: str, args: list[Any], options: dict[str, Any], dtype: str = "fp32") -> str:
    """The code: ``pipeline`` on the folder's ``dtype`` file, called on ``args``, then
    ``options`` (as JSON literals)."""
    call = [json.dumps(a, ensure_ascii=False) for a in args]
    if options:
        call.append(json.dumps(options, ensure_ascii=False))
    return _CODE.format(
        pipeline=json.dumps(pipeline), dtype=json.dumps(dtype), args=", ".join(call)
    )


def section(pipeline: str, args: list[Any], options: dict[str, Any], q4: bool = False) -> str:
    """The card's transformers.js part: the install line and the snippet; ``q4``: the folder
    holds model.int4.onnx (``--quantize int4``), and a second snippet opens it."""
    q4_part = ""
    if q4:  # the int4 weights under the name dtype "q4" picks (onnx/model_q4.onnx)
        q4_part = f"""
The int4 weights (`model.int4.onnx`, linked as `onnx/model_q4.onnx`) open with `dtype: "q4"`:

{JS_FENCE}
{snippet(pipeline, args, options, "q4")}```
"""
    return f"""
Usage with transformers.js (Node 20), run from this folder (`dtype: "fp16"` or `"q8"` opens an
`--fp16` or `--quantize int8` variant, linked in `onnx/`):

```
npm install --ignore-scripts @huggingface/transformers@{VERSION}
```

{JS_FENCE}
{snippet(pipeline, args, options)}```
{q4_part}"""


def card_js(readme: str, dtype: str = "fp32") -> str:
    """The transformers.js snippet of a model card that opens the ``dtype`` file (a js block)."""
    blocks = readme.split(JS_FENCE + "\n")[1:]
    codes = [b[: b.index("```")] for b in blocks]
    found = [c for c in codes if f"{{ dtype: {json.dumps(dtype)} }}" in c]
    if len(found) != 1:
        raise ValueError(f"the card has {len(found)} transformers.js snippets of dtype {dtype}")
    return found[0]
