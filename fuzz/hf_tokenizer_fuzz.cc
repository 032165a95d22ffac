// Fuzzes Hugging Face tokenizer files (data/hf_tokenizer.h) as a folder gives them: the
// input is tokenizer.json, then after the first NUL byte tokenizer_config.json, then after
// the next a text to encode. Whatever loads encodes the text and decodes the ids, or
// fails with a Status; nothing crashes or throws.
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/hf_tokenizer.h"

// Tokenizer's out-of-line members (data/tokenizer.cc, which also builds the SentencePiece
// and GPT-2 tokenizers this target does not need), as that file defines them.
namespace cleave {
StatusOr<std::vector<int32_t>> Tokenizer::EncodeText(const std::string& text, bool) const {
  ASSIGN_OR_RETURN(auto ids, Encode({text}));
  return std::move(ids[0]);
}
std::vector<int32_t> Tokenizer::DocumentSeparator() const { return {}; }
}  // namespace cleave

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  const size_t a = in.find('\0');
  const size_t b = a == std::string::npos ? std::string::npos : in.find('\0', a + 1);
  const std::string json = in.substr(0, a);
  const std::string config = a == std::string::npos ? "" : in.substr(a + 1, b == std::string::npos ? b : b - a - 1);
  const std::string text = b == std::string::npos ? "Hello, world! 123" : in.substr(b + 1);
  auto t = cleave::HfTokenizer::FromJson(json, config, "fuzz/tokenizer.json");
  if (!t.ok()) return 0;
  auto ids = (*t)->EncodeText(text, true);
  if (ids.ok()) (void)(*t)->Decode(*ids);
  return 0;
}
