// A transformers.js client of an ortft encoder-decoder export (seq2seq, Whisper), as a Node user
// writes it: the folder as ortft wrote it (onnx/encoder_model.onnx and
// onnx/decoder_model_merged.onnx, their links to the root files; config.json,
// generation_config.json, the tokenizer, Whisper's preprocessor_config.json), offline.
//
//   node generate.mjs NODE_MODULES EXPORT_DIR TASK INPUTS MAX_NEW
//
// TASK: text2text-generation (INPUTS: one text a line) or automatic-speech-recognition (INPUTS:
// one file a line of raw float32 little-endian samples, mono, at the feature extractor's rate:
// Node has no FLAC decoder). Each input alone, through the pipeline's own tokenizer or processor
// and its model's generate (greedy, generation_config.json's settings, up to MAX_NEW new
// tokens); one JSON line per input on stdout: {"input", "ids": the sequence generate returns,
// "text": its decoding without special tokens}. The ids, not the pipeline's text: its Whisper
// text post-processing throws on an untrained model's output (a language token mid-transcript).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, folder, task, inputsFile, maxNew] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "..", "package.json"));
const { pipeline, env } = require("@huggingface/transformers");

env.allowRemoteModels = false; // never the Hub: the folder only
env.localModelPath = path.dirname(path.resolve(folder)) + path.sep;
const run = await pipeline(task, path.basename(path.resolve(folder)), { dtype: "fp32" });
const options = { max_new_tokens: Number(maxNew), do_sample: false };
const inputs = readFileSync(inputsFile, "utf8").split("\n").filter((t) => t.trim());
for (const input of inputs) {
  let encoded;
  if (task === "automatic-speech-recognition") {
    const bytes = readFileSync(input);
    const samples = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    encoded = { inputs: (await run.processor(samples)).input_features };
  } else {
    encoded = await run.tokenizer(input);
  }
  const ids = (await run.model.generate({ ...encoded, ...options })).tolist()[0].map(Number);
  const text = run.tokenizer.decode(ids, { skip_special_tokens: true });
  console.log(JSON.stringify({ input, ids, text }));
}
