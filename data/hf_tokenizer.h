// Internal to data/: Hugging Face tokenizers from their tokenizer.json (tokenizer spec
// "hf:PATH", PATH a folder holding tokenizer.json or the file itself), the two kinds the
// Llama family uses:
//   byte-level BPE behind a regex pre-tokenizer (GPT-2, Llama 3, Qwen 2/3): Split with
//     the file's Unicode regex (ICU), then ByteLevel's byte-to-symbol map;
//   SentencePiece-style BPE (Llama 2, Mistral): Prepend/Replace normalizers or Metaspace
//     turn spaces into ▁, byte fallback (<0xAB>) for what the vocabulary lacks.
// Added tokens are split out of the text first and keep their ids. Normalizers NFC, NFD,
// NFKC, NFKD (ICU), Prepend, Replace, Lowercase, Sequence; pre-tokenizers Split
// (Isolated, Removed), ByteLevel, Metaspace, Digits, Sequence; model BPE (merges as
// "a b" strings or pairs, ignore_merges, byte_fallback, unk_token, fuse_unk); decoders
// ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence. Anything else is
// refused naming the file and the field. Regexes follow Hugging Face's (Rust) meaning of
// \s: Unicode's White_Space.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace cleave {

// The largest tokenizer.json or tokenizer_config.json read (Llama 3's tokenizer.json is
// 9 MB, Qwen 3's 11 MB): a file past it, or not a regular file, is refused.
inline constexpr int64_t kMaxTokenizerBytes = int64_t{64} << 20;

class HfTokenizer : public Tokenizer {
 public:
  static StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& path);
  // tokenizer.json's text (and tokenizer_config.json's, or ""); `what` names the file.
  static StatusOr<std::unique_ptr<HfTokenizer>> FromJson(const std::string& json,
                                                         const std::string& config_json,
                                                         const std::string& what);
  ~HfTokenizer() override;

  int vocab_size() const override;
  int eos_id() const override;
  StatusOr<std::vector<std::vector<int32_t>>> Encode(const std::vector<std::string>& texts) const override;
  // One text; `special`: with the model's special tokens (its post-processor's template,
  // or tokenizer_config.json's add_bos_token / add_eos_token).
  StatusOr<std::vector<int32_t>> EncodeText(const std::string& text, bool special) const override;
  // Special tokens are left out; ids outside the vocabulary skipped.
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override;

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
