// Training throughput of the Llama family: full fine-tuning (every tensor trains, AdamW,
// lr 1e-3) of a SmolLM2-135M-shaped model (random weights from
// tests/models/llama_reference.py, as bench_llama_generate) on random sequences, ours
// (Model::Train) against PyTorch eager on transformers' definition
// (llama_reference.py train), the same batch, sequence length and thread count. Prints
// tokens/s of each and the ratio, and the ceiling both share: tokens/s if a step did
// nothing but its matrix products (for each weight, forward, input gradient and weight
// gradient), timed here with LibTorch's float32 GEMM on the same shapes and threads.
//   bench_llama_train [BATCH [TOKENS [STEPS [THREADS [FAMILY]]]]]   (default 4 64 4 2 smol)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>

#include <torch/torch.h>

#include "bench/hf_model.h"

namespace {

// Seconds of one step's matrix products: for every matrix weight [out, in] and n tokens,
// y = x W^T, dx = dy W and dW = dy^T x, the fastest of three timings of each shape.
double GemmSeconds(const cleave::ParameterSet& weights, int64_t n) {
  std::map<std::pair<int64_t, int64_t>, int> shapes;
  for (const auto& t : weights.tensors()) {
    if (t.shape.size() == 2) ++shapes[{t.shape[0], t.shape[1]}];
  }
  double total = 0;
  for (const auto& [shape, count] : shapes) {
    const auto w = torch::randn({shape.first, shape.second}), x = torch::randn({n, shape.second});
    const auto dy = torch::randn({n, shape.first});
    double best = 1e9;
    for (int r = 0; r < 3; ++r) {
      const auto start = std::chrono::steady_clock::now();
      auto y = torch::mm(x, w.t());
      auto dx = torch::mm(dy, w);
      auto dw = torch::mm(dy.t(), x);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    total += best * count;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const int batch = argc > 1 ? std::atoi(argv[1]) : 4, t = argc > 2 ? std::atoi(argv[2]) : 64;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 4, threads = argc > 4 ? std::atoi(argv[4]) : 2;
  const std::string family = argc > 5 ? argv[5] : "smol";
  const std::string script = std::string("OMP_NUM_THREADS=") + std::to_string(threads) + " /usr/bin/python3 " +
                             CLEAVE_SOURCE_DIR + "/tests/models/llama_reference.py";
  const std::string dir = (fs::temp_directory_path() / ("cleave_bench_" + family)).string();
  if (!fs::exists(dir + "/model.safetensors") &&
      std::system((script + " make " + dir + " " + family + " F32 1 7").c_str()) != 0) {
    std::cerr << "could not write " << dir << "\n";
    return 1;
  }
  FILE* pipe = popen((script + " train " + dir + " " + std::to_string(batch) + " " + std::to_string(t) + " " +
                      std::to_string(steps) + " " + std::to_string(threads)).c_str(), "r");
  double reference = 0;
  if (pipe == nullptr || std::fscanf(pipe, "%lf", &reference) != 1 || pclose(pipe) != 0) {
    std::cerr << "the reference failed\n";
    return 1;
  }
  cleave::SetTorchThreads(threads);
  cleave::ModelSpec spec;
  auto model = cleave::LoadHfModel(dir, t, &spec);
  if (!model.ok()) {
    std::cerr << model.status() << "\n";
    return 1;
  }
  cleave::Dataset data;
  data.type = cleave::ExampleType::kToken;
  data.shape = {t + 1};
  data.num_classes = static_cast<int>(spec.gpt.vocab);
  data.size = int64_t{batch} * (steps + 1);
  std::mt19937 rng(1);
  std::vector<int32_t> ids(static_cast<size_t>(data.size) * (t + 1));
  for (auto& id : ids) id = static_cast<int32_t>(rng() % spec.gpt.vocab);
  data.bytes.resize(ids.size() * 4);
  std::memcpy(data.bytes.data(), ids.data(), data.bytes.size());
  data.labels.assign(data.size, 0);
  cleave::LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-3;
  o.batch_size = batch;
  o.local_steps = 1;  // warm-up
  if (!(*model)->Train(data, o).ok()) return 1;
  o.local_steps = steps;
  const auto start = std::chrono::steady_clock::now();
  auto trained = (*model)->Train(data, o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!trained.ok()) {
    std::cerr << trained.status() << "\n";
    return 1;
  }
  const double ours = double(batch) * t * steps / seconds;
  const double ceiling = double(batch) * t / GemmSeconds((*model)->Parameters(), int64_t{batch} * t);
  std::printf("%s, full fine-tuning, AdamW, batch %d x %d tokens, %d steps, %d threads\n", family.c_str(), batch, t,
              steps, threads);
  std::printf("cleave:          %8.1f tokens/s\nPyTorch eager:   %8.1f tokens/s\nratio:           %8.2fx\n", ours,
              reference, ours / reference);
  std::printf("GEMM ceiling:    %8.1f tokens/s (cleave %.2f of it, PyTorch %.2f)\n", ceiling, ours / ceiling,
              reference / ceiling);
  return 0;
}
