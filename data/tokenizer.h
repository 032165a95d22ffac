// Tokenizers for text data: bytes (a vocabulary of 256, no model needed), a
// SentencePiece model (`cleave tokenizer train` makes one; so do Debian's spm_train),
// GPT-2's byte-level BPE (a checkpoint's vocab.json and merges.txt, data/gpt2_bpe.h),
// or a Hugging Face tokenizer.json (Llama 2 and 3, Mistral, Qwen; data/hf_tokenizer.h).
// Specs: "byte", "spm:PATH", "gpt2:DIR" or "hf:PATH" (a tokenizer.json or its folder).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

class Tokenizer {
 public:
  // INVALID_ARGUMENT for an unknown spec, NOT_FOUND / DATA_LOSS for a model that does
  // not load (naming the file).
  static StatusOr<std::unique_ptr<Tokenizer>> Create(const std::string& spec);
  virtual ~Tokenizer() = default;

  virtual int vocab_size() const = 0;
  // The ids of each text (one call for many: a SentencePiece model runs in a helper
  // process, data/spm_bridge.h).
  virtual StatusOr<std::vector<std::vector<int32_t>>> Encode(
      const std::vector<std::string>& texts) const = 0;
  // One text; `special`: with the special tokens the model's tokenizer adds around a
  // sequence (a beginning-of-text id, ...); tokenizers that add none ignore it.
  virtual StatusOr<std::vector<int32_t>> EncodeText(const std::string& text, bool special) const;
  // Ids outside the vocabulary are skipped.
  virtual StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
  // The vocabulary's end-of-text id, or -1 when it has none.
  virtual int eos_id() const { return -1; }
  // What ends a document when documents are packed together: the end-of-text id, or
  // the encoding of a blank line.
  std::vector<int32_t> DocumentSeparator() const;
};

// Trains a SentencePiece model of `vocab_size` pieces on the text `files` (plain text;
// SentencePiece reads each line as a sentence) and writes PREFIX.model and PREFIX.vocab.
// `model_type`: unigram | bpe | char | word.
Status TrainSentencePieceModel(const std::vector<std::string>& files, int vocab_size,
                               const std::string& model_type, const std::string& prefix);

}  // namespace cleave
