// A transformers.js client of any ortft export it has a pipeline for, as a Node user writes it:
// the folder as ortft wrote it (onnx/model*.onnx, config.json, tokenizer.json or
// preprocessor_config.json), offline, in one process for all of a job's inputs.
//
//   node pipeline.mjs NODE_MODULES JOB
//
// NODE_MODULES: scripts/node-consumer-env.sh's install (outside the clone, so not found by
// Node's own lookup from this file). JOB: a JSON file {"task": a transformers.js pipeline name,
// "folder": the export folder, "dtype": "fp32" (onnx/model.onnx) or another dtype (its
// onnx/model_<suffix>.onnx), "options": the pipeline call's options, "inputs": [...]}. An input
// is what the pipeline takes: a text, an image path, or {"question", "context"} for
// question-answering. One JSON line per input on stdout: {"input", "output": the pipeline's
// answer, "input_ids": the tokens the pipeline's tokenizer gives a text input}.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, jobFile] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "..", "package.json"));
const { pipeline, env } = require("@huggingface/transformers");

const job = JSON.parse(readFileSync(jobFile, "utf8"));
env.allowRemoteModels = false; // never the Hub: the folder only
env.localModelPath = path.dirname(path.resolve(job.folder)) + path.sep;
const run = await pipeline(job.task, path.basename(path.resolve(job.folder)), {
  dtype: job.dtype ?? "fp32",
});

// a tensor (feature-extraction) as nested lists; bigints (token ids) as numbers
const plain = (x) =>
  typeof x?.tolist === "function"
    ? plain(x.tolist())
    : Array.isArray(x)
      ? x.map(plain)
      : typeof x === "bigint"
        ? Number(x)
        : x;

for (const input of job.inputs) {
  let output;
  let text = input;
  if (job.task === "question-answering") {
    output = await run(input.question, input.context, job.options);
    text = null;
  } else {
    output = await run(input, job.options);
    if (job.task === "image-classification") text = null;
  }
  const row = { input, output: plain(output) };
  if (typeof text === "string") row.input_ids = plain(run.tokenizer(text).input_ids)[0];
  console.log(JSON.stringify(row));
}
