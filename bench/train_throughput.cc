// Client local-training throughput (LeNet-5, batch 64, one thread) against the same loop
// in PyTorch on /usr/bin/python3, in the same run; then evaluation (batches of 256, as
// the client's federated evaluation and the server run it) against PyTorch's, and
// against training per example.
//   bench_train_throughput [--examples N] [--epochs E] [--reps R] [--eval-batch B]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "models/model.h"

using namespace cleave;

namespace {

double PyTorchSamplesPerSecond(int64_t n, int epochs, int batch, bool eval = false) {
  // One thread on both sides: torch.set_num_threads does not reach OpenBLAS's own pool.
  const std::string cmd = "OPENBLAS_NUM_THREADS=1 /usr/bin/python3 " + std::string(CLEAVE_SOURCE_DIR) +
                          "/bench/train_reference.py " + std::to_string(n) + " " +
                          std::to_string(epochs) + " " + std::to_string(batch) +
                          (eval ? " eval" : "");
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return 0;
  double rate = 0, loss = 0;
  if (std::fscanf(p, "%lf %lf", &rate, &loss) != 2) rate = 0;
  pclose(p);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 20000;
  int epochs = 1, reps = 3, eval_batch = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--examples")) n = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--epochs")) epochs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--eval-batch")) eval_batch = std::atoi(argv[i + 1]);
  }
  SetTorchThreads(1);
  auto data = LoadFashionMnist("/usr/share/datasets/fashion-mnist", true, n);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().ToString().c_str());
    return 1;
  }
  LocalTrainOptions o;
  o.local_epochs = epochs;
  o.batch_size = 64;
  o.lr = 0.01;
  o.momentum = 0.9;
  o.weight_decay = 1e-5;
  // Like the reference, time only the training loop: the first call converts the data
  // set to a tensor (cached by the model), so it is a warm-up and not counted.
  auto model = *Model::Create({"lenet5", "", 0});
  if (!model->Train(*data, o).ok()) return 1;
  double best_ours = 0, best_ref = 0;
  for (int r = 0; r < reps; ++r) {  // interleaved, best of each
    auto stats = model->Train(*data, o);
    if (!stats.ok()) return 1;
    best_ours = std::max(best_ours, n * epochs / stats->seconds);
    best_ref = std::max(best_ref, PyTorchSamplesPerSecond(n, epochs, 64));
  }
  std::printf("LeNet-5, %lld examples x %d epoch(s), batch 64, 1 thread, best of %d\n",
              static_cast<long long>(n), epochs, reps);
  std::printf("PyTorch (python3, reference)  %9.0f examples/s\n", best_ref);
  std::printf("cleave (LibTorch C++)         %9.0f examples/s\n", best_ours);
  std::printf("ratio: %.2f (target >= 1.5)\n", best_ref > 0 ? best_ours / best_ref : 0.0);

  double best_eval = 0, best_ref_eval = 0;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      if (!model->Evaluate(*data, eval_batch).ok()) return 1;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best_eval = std::max(best_eval, n * epochs / s);
    best_ref_eval = std::max(best_ref_eval, PyTorchSamplesPerSecond(n, epochs, eval_batch, true));
  }
  std::printf("evaluation, batch %d:\n", eval_batch);
  std::printf("PyTorch (python3, reference)  %9.0f examples/s\n", best_ref_eval);
  std::printf("cleave (LibTorch C++)         %9.0f examples/s\n", best_eval);
  std::printf("ratio: %.2f; one example evaluated costs %.2f of one trained\n",
              best_ref_eval > 0 ? best_eval / best_ref_eval : 0.0, best_ours / best_eval);
  return 0;
}
