// The reference for tests/data/chat_template_test.cc: Hugging Face's own Jinja renderer
// (@huggingface/jinja, the one transformers.js renders chat templates with), written
// independently of ours. Reads a JSON list of {template, context}; prints, for each,
// {"text": ...} or {"error": ...}.
//   node chat_template_reference.mjs NPM_DIR CASES.json
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [npmDir, cases] = process.argv.slice(2);
const entry = join(npmDir, "node_modules", "@huggingface", "jinja", "dist", "index.js");
const { Template } = await import(pathToFileURL(entry).href);
const out = JSON.parse(readFileSync(cases, "utf8")).map(({ template, context }) => {
  try {
    return { text: new Template(template).render(context) };
  } catch (e) {
    return { error: String(e.message ?? e) };
  }
});
process.stdout.write(JSON.stringify(out));
