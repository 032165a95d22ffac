// The model commands of `cleave`: train a tokenizer, sample text from a trained
// language model, evaluate a trained model (per group or client too), export a model as
// safetensors.
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

// cleave tokenizer encode / decode: a text's ids on one line, separated by spaces, or the
// text of ids.
struct TokenizerCodecOptions {
  std::string tokenizer = "byte";  // a tokenizer spec (data/tokenizer.h): hf:PATH, ...
  std::string text;                // encode
  std::vector<int32_t> ids;        // decode
  bool special = false;            // encode: add the model's special tokens
};
int RunTokenizerEncode(const TokenizerCodecOptions& o);
int RunTokenizerDecode(const TokenizerCodecOptions& o);

// Where a trained model comes from: a run directory (its config.yaml and checkpoint.pb),
// a config and a checkpoint (a checkpoint.pb or a safetensors file) given apart, or a
// Hugging Face folder as the checkpoint with no config (model hf; generate takes its
// tokenizer from it unless --tokenizer says otherwise).
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
  double top_p = 1.0;  // nucleus sampling; 1 = off
  uint64_t seed = 0;
};
int RunGenerate(const GenerateOptions& o);

struct EvaluateOptions {
  ModelSource model;
  std::string data;         // a data spec, test part; "" = the config's data.test
  std::string by;           // "" = the whole set; "group": each of the data's groups;
                            //   "client:N": the N clients of the natural partition
  int batch_size = 64;
  double width = 1;         // < 1: the model's width-scaled submodel (its leading window)
};
// Prints a Markdown table: examples, loss, accuracy and the task's metrics (perplexity,
// bits per byte for text), for the whole set and each group or client.
int RunEvaluate(const EvaluateOptions& o);

struct ExportOptions {
  ModelSource model;
  std::string out;  // a .safetensors file; for model hf, a Hugging Face folder
};
int RunExport(const ExportOptions& o);

}  // namespace cleave
