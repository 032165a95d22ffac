// Greedy generation with a key/value cache from a Llama-family model of SmolLM2-135M's
// shape (30 layers, width 576, 9 heads / 3 key-value heads, FFN 1536, tied; random
// weights written by tests/models/llama_reference.py, since no hub is reachable): ours
// (Model::Generate, models/llama.h's cache) against PyTorch eager with a cache written
// from transformers' definition (llama_reference.py generate), one thread each, the same
// prompt. Both must pick the same tokens. Prints tokens/s of each and the ratio.
//   bench_llama_generate [PROMPT_TOKENS [NEW_TOKENS]]   (default 32 64)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "bench/hf_model.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const int prompt_len = argc > 1 ? std::atoi(argv[1]) : 32, new_tokens = argc > 2 ? std::atoi(argv[2]) : 64;
  const std::string script = std::string("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 ") +
                             CLEAVE_SOURCE_DIR + "/tests/models/llama_reference.py";
  const std::string dir = (fs::temp_directory_path() / "cleave_bench_smol").string();
  if (!fs::exists(dir + "/model.safetensors") &&
      std::system((script + " make " + dir + " smol F32 1 7").c_str()) != 0) {
    std::cerr << "could not write " << dir << "\n";
    return 1;
  }
  // The reference first: its prompt is ours.
  FILE* pipe = popen((script + " generate " + dir + " " + std::to_string(prompt_len) + " " +
                      std::to_string(new_tokens) + " 1").c_str(), "r");
  std::string line;
  char buf[1 << 16];
  while (pipe != nullptr && std::fgets(buf, sizeof(buf), pipe) != nullptr) line += buf;
  if (pipe == nullptr || pclose(pipe) != 0) {
    std::cerr << "the reference failed\n";
    return 1;
  }
  std::istringstream in(line);
  double ref_rate = 0;
  in >> ref_rate;
  std::vector<int32_t> prompt, ref_out;
  std::string word;
  bool after = false;
  while (in >> word) {
    if (word == "|") {
      after = true;
    } else {
      (after ? ref_out : prompt).push_back(std::stoi(word));
    }
  }
  cleave::SetTorchThreads(1);
  cleave::ModelSpec spec;
  auto model = cleave::LoadHfModel(dir, 2048, &spec);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  (void)(*model)->Generate(prompt, 2, 0, 0, 1);  // warm-up
  const auto start = std::chrono::steady_clock::now();
  auto out = (*model)->Generate(prompt, new_tokens, /*temperature=*/0, 0, 1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!out.ok()) {
    std::cerr << out.status() << "\n";
    return 1;
  }
  size_t same = 0;
  while (same < out->size() && same < ref_out.size() && (*out)[same] == ref_out[same]) ++same;
  const double ours = new_tokens / seconds;
  std::printf("SmolLM2-135M shape, prompt %d, %d new tokens, greedy, 1 thread\n", prompt_len, new_tokens);
  std::printf("ours %.1f tokens/s, PyTorch eager with a cache %.1f tokens/s: %.2fx; the first %zu of %d tokens agree\n",
              ours, ref_rate, ours / ref_rate, same, new_tokens);
  return 0;
}
