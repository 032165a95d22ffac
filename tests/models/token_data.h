// Token data for the language-model tests (gpt_test.cc, llama_test.cc).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "data/dataset.h"

namespace cleave {

// `n` ids drawn uniformly from [0, vocab), seeded.
inline std::vector<int32_t> RandomIds(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// Sequences of `length` ids as text data (the tokenizer's vocabulary `vocab`).
inline Dataset Sequences(const std::vector<int32_t>& ids, int64_t length, int vocab) {
  Dataset d;
  d.type = ExampleType::kToken;
  d.shape = {length};
  d.size = static_cast<int64_t>(ids.size()) / length;
  d.num_classes = vocab;
  d.bytes.resize(d.size * length * sizeof(int32_t));
  std::memcpy(d.bytes.data(), ids.data(), d.bytes.size());
  d.labels.assign(d.size, 0);
  d.bytes_per_token = 1;
  return d;
}

}  // namespace cleave
