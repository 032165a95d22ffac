// The language-model commands of `cleave`: train a tokenizer, sample text from a trained
// model, export a model as safetensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cleave {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // text files or directories of them
  int vocab = 4096;
  std::string type = "unigram";     // unigram | bpe | char | word
  std::string out;                  // writes OUT.model and OUT.vocab
};
int RunTokenizerTrain(const TokenizerTrainOptions& o);

// Where a trained model comes from: a run directory (its config.yaml and checkpoint.pb)
// or a config and a checkpoint (a checkpoint.pb or a safetensors file) given apart.
struct ModelSource {
  std::string run_dir;
  std::string config;
  std::string checkpoint;
};

struct GenerateOptions {
  ModelSource model;
  std::string tokenizer;  // "" = the tokenizer= of the config's local.data, else byte
  std::string prompt;
  int tokens = 200;
  double temperature = 0.8;
  int top_k = 40;
  uint64_t seed = 0;
};
int RunGenerate(const GenerateOptions& o);

struct ExportOptions {
  ModelSource model;
  std::string out;  // a .safetensors file
};
int RunExport(const ExportOptions& o);

}  // namespace cleave
