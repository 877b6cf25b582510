// A transformers.js client of an ortft image-text-to-text export (LLaVA, Idefics3, Qwen2-VL), as
// a Node user writes it: the folder as ortft wrote it (onnx/vision_encoder.onnx, onnx/embed_tokens.onnx,
// onnx/decoder_model_merged.onnx; config.json, generation_config.json, processor_config.json,
// preprocessor_config.json and the tokenizer), offline.
//
//   node vlm.mjs NODE_MODULES EXPORT_DIR INPUTS MAX_NEW [ORDER]
//
// INPUTS: one JSON line per question, {"image": a PNG's path, "prompt": the chat-templated
// prompt with its image token}. Each through the folder's processor (it expands the image
// token) and the model's generate (greedy, generation_config.json's settings, up to MAX_NEW new
// tokens); one JSON line per input on stdout: {"ids": the sequence generate returns,
// "prompt_length": the processor's prompt tokens, image tokens expanded, that it starts with}.
// ORDER: how the family's processor takes its arguments: "image-text" (LlavaProcessor, the
// default) or "text-image" (Idefics3Processor and Qwen2VLProcessor: processor(text, images)).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [modules, folder, inputsFile, maxNew, order = "image-text"] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "..", "package.json"));
const { AutoProcessor, AutoModelForImageTextToText, RawImage, env } = require(
  "@huggingface/transformers",
);

env.allowRemoteModels = false; // never the Hub: the folder only
env.localModelPath = path.dirname(path.resolve(folder)) + path.sep;
const name = path.basename(path.resolve(folder));
const processor = await AutoProcessor.from_pretrained(name);
const model = await AutoModelForImageTextToText.from_pretrained(name, { dtype: "fp32" });
const lines = readFileSync(inputsFile, "utf8").split("\n").filter((t) => t.trim());
for (const line of lines) {
  const { image, prompt } = JSON.parse(line);
  const picture = await RawImage.read(image);
  const inputs =
    order === "text-image" ? await processor(prompt, [picture]) : await processor(picture, prompt);
  const out = await model.generate({ ...inputs, max_new_tokens: Number(maxNew), do_sample: false });
  const ids = out.tolist()[0].map(Number);
  console.log(JSON.stringify({ ids, prompt_length: inputs.input_ids.dims[1] }));
}
