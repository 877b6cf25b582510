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
const run = await pipeline({pipeline}, path.basename(process.cwd()), {{ dtype: "fp32" }});
const out = await run({args});
console.log(JSON.stringify(out?.tolist ? out.tolist() : out));
"""


def snippet(pipeline: str, args: list[Any], options: dict[str, Any]) -> str:
    """The code: ``pipeline`` called on ``args``, then ``options`` (as JSON literals)."""
    call = [json.dumps(a, ensure_ascii=False) for a in args]
    if options:
        call.append(json.dumps(options, ensure_ascii=False))
    return _CODE.format(pipeline=json.dumps(pipeline), args=", ".join(call))


def section(pipeline: str, args: list[Any], options: dict[str, Any]) -> str:
    """The card's transformers.js part: the install line and the snippet."""
    return f"""
Usage with transformers.js (Node 20), run from this folder (`dtype: "fp16"` or `"q8"` opens an
`--fp16` or `--quantize int8` variant, linked in `onnx/`):

```
npm install --ignore-scripts @huggingface/transformers@{VERSION}
```

{JS_FENCE}
{snippet(pipeline, args, options)}```
"""


def card_js(readme: str) -> str:
    """The transformers.js snippet of a model card (its js block)."""
    start = readme.index(JS_FENCE) + len(JS_FENCE) + 1
    return readme[start : readme.index("```", start)]
