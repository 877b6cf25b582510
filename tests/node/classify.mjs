// A transformers.js client of an ortft text-classification export, as a Node user writes it:
// the folder as ortft wrote it (its onnx/model.onnx link, config.json, tokenizer.json), offline.
//
//   node classify.mjs NODE_MODULES EXPORT_DIR TEXTS
//
// NODE_MODULES: scripts/node-consumer-env.sh's install (outside the clone, so not found by
// Node's own lookup from this file); TEXTS: one text a line. Each text is classified alone (no
// batch padding), with every label's score; one JSON line per text on stdout:
// {"input", "label", "scores": {label: probability}}.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, folder, textsFile] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "..", "package.json"));
const { pipeline, env } = require("@huggingface/transformers");

env.allowRemoteModels = false; // never the Hub: the folder only
env.localModelPath = path.dirname(path.resolve(folder)) + path.sep;
const classify = await pipeline("text-classification", path.basename(path.resolve(folder)), {
  dtype: "fp32", // reads onnx/model.onnx
});
const labels = Object.keys(classify.model.config.id2label).length;
const texts = readFileSync(textsFile, "utf8").split("\n").filter((t) => t.trim());
for (const text of texts) {
  const ranked = await classify(text, { top_k: labels });
  const scores = Object.fromEntries(ranked.map((r) => [r.label, r.score]));
  console.log(JSON.stringify({ input: text, label: ranked[0].label, scores }));
}
