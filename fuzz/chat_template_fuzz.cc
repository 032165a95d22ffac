// Fuzzes chat templates (data/chat_template.h), which come from tokenizer folders and
// from a device's own template= file, over the data an instruct: file renders through
// them: the input is a template, then (after the first NUL byte) the context's JSON. Any
// input parses and renders or fails with a Status, within a small budget, never with a
// crash, a hang or memory past the budget.
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string tmpl = in.substr(0, nul);
  const std::string context =
      nul == std::string::npos
          ? R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "bos_token": "<s>"})"
          : in.substr(nul + 1);
  auto t = cleave::ChatTemplate::Parse(tmpl);
  if (!t.ok()) return 0;
  cleave::TemplateBudget budget;  // small, so that each input runs fast
  budget.steps = 200000;
  budget.bytes = 1 << 20;
  (void)t->Render(context, &budget);
  return 0;
}
