// Training throughput of the built-in decoder (model gpt), tokens per second on one
// thread, against the same model in PyTorch on /usr/bin/python3 (bench/gpt_reference.py)
// in the same run: AdamW, next-token cross-entropy, random token ids.
//   bench_gpt_throughput [--steps S] [--batch B] [--context T] [--layers L] [--heads H]
//                        [--dim D] [--vocab V] [--reps R]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "models/model.h"

using namespace cleave;

int main(int argc, char** argv) {
  int64_t steps = 60, batch = 32, context = 64, dim = 128, vocab = 256;
  int layers = 4, heads = 4, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (flag == "--steps") steps = v;
    if (flag == "--batch") batch = v;
    if (flag == "--context") context = v;
    if (flag == "--layers") layers = static_cast<int>(v);
    if (flag == "--heads") heads = static_cast<int>(v);
    if (flag == "--dim") dim = v;
    if (flag == "--vocab") vocab = v;
    if (flag == "--reps") reps = static_cast<int>(v);
  }
  SetTorchThreads(1);
  const int64_t n = steps * batch;  // one pass
  Dataset data;
  data.type = ExampleType::kToken;
  data.shape = {context + 1};
  data.size = n;
  data.num_classes = static_cast<int>(vocab);
  data.labels.assign(n, 0);
  data.bytes.resize(n * (context + 1) * 4);
  std::mt19937 rng(0);
  for (int64_t i = 0; i < n * (context + 1); ++i) {
    const int32_t id = static_cast<int32_t>(rng() % vocab);
    std::memcpy(&data.bytes[i * 4], &id, 4);
  }
  ModelSpec spec;
  spec.name = "gpt";
  spec.gpt = {vocab, context, layers, heads, dim, false};
  auto model = Model::Create(spec);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-3;
  o.weight_decay = 0.01;
  o.batch_size = static_cast<int>(batch);
  o.local_steps = steps;
  if (!(*model)->Train(data, o).ok()) return 1;  // warm-up: the data becomes a tensor
  // One thread on both sides: torch.set_num_threads does not reach OpenBLAS's own pool,
  // which would otherwise use every core for the reference's matrix products.
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 /usr/bin/python3 " + std::string(CLEAVE_SOURCE_DIR) +
                          "/bench/gpt_reference.py " + std::to_string(n) + " " +
                          std::to_string(steps) + " " + std::to_string(batch) + " " +
                          std::to_string(context) + " " + std::to_string(layers) + " " +
                          std::to_string(heads) + " " + std::to_string(dim) + " " +
                          std::to_string(vocab);
  double best_ours = 0, best_ref = 0;
  for (int r = 0; r < reps; ++r) {  // interleaved, best of each
    auto stats = (*model)->Train(data, o);
    if (!stats.ok()) return 1;
    best_ours = std::max(best_ours, steps * batch * context / stats->seconds);
    FILE* p = popen(cmd.c_str(), "r");
    double rate = 0, loss = 0;
    if (p == nullptr || std::fscanf(p, "%lf %lf", &rate, &loss) != 2) rate = 0;
    if (p != nullptr) pclose(p);
    best_ref = std::max(best_ref, rate);
  }
  std::printf("gpt: %d layers, %d heads, dim %lld, context %lld, vocab %lld; batch %lld, %lld "
              "AdamW steps, 1 thread, best of %d\n",
              layers, heads, static_cast<long long>(dim), static_cast<long long>(context),
              static_cast<long long>(vocab), static_cast<long long>(batch),
              static_cast<long long>(steps), reps);
  std::printf("PyTorch (python3, reference)  %9.0f tokens/s\n", best_ref);
  std::printf("cleave (LibTorch C++)         %9.0f tokens/s\n", best_ours);
  std::printf("ratio: %.2f (target >= 1.3)\n", best_ref > 0 ? best_ours / best_ref : 0.0);
  return 0;
}
