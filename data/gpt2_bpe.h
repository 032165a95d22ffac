// Internal to data/: GPT-2's byte-level BPE (Radford et al. 2019; Hugging Face's
// vocab.json and merges.txt), so that text can be tokenized to a GPT-2-family
// checkpoint's ids. Pre-tokenization follows GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with one approximation: every non-ASCII code point that is not a Unicode space
// counts as a letter (\p{L}), so ids can differ from GPT-2's around non-ASCII
// punctuation and digits; encoding and decoding still round-trip every byte string.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace cleave {

class Gpt2Bpe {
 public:
  // Reads DIR/vocab.json (symbol -> id) and DIR/merges.txt ("#version" line, then one
  // "a b" pair a line, by rank). Errors name the file and the line or entry.
  static StatusOr<std::unique_ptr<Gpt2Bpe>> Load(const std::string& dir);
  // From the two files' contents (tests).
  static StatusOr<std::unique_ptr<Gpt2Bpe>> FromStrings(const std::string& vocab_json,
                                                        const std::string& merges,
                                                        const std::string& what);

  int vocab_size() const { return vocab_size_; }
  int eos_id() const { return eos_; }  // <|endoftext|>, or -1
  // INVALID_ARGUMENT when a symbol BPE arrives at is not in the vocabulary (a vocabulary
  // without all 256 byte symbols).
  StatusOr<std::vector<int32_t>> Encode(const std::string& text) const;
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The pieces BPE works on (GPT-2's pattern above), in order; they concatenate to
  // `text`.
  static std::vector<std::string> PreTokenize(const std::string& text);

 private:
  std::vector<std::string> Bpe(const std::string& word) const;

  std::unordered_map<std::string, int32_t> ids_;
  std::vector<std::string> symbols_;  // by id ("" where the vocabulary has a hole)
  std::map<std::pair<std::string, std::string>, int> ranks_;
  int vocab_size_ = 0, eos_ = -1;
};

}  // namespace cleave
