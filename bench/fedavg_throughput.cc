// Streaming FedAvg throughput against memcpy of the same bytes, in the same run.
//   bench_fedavg_throughput [--params N] [--reps R]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "aggregation/strategy.h"

using namespace cleave;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int64_t params = 10'000'000;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--params")) params = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  // A model of 10 tensors, and one client update for it.
  ParameterSet global, delta;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 0.01f);
  for (int t = 0; t < 10; ++t) {
    const int64_t n = params / 10;
    Tensor g{"t" + std::to_string(t), {n}, std::vector<float>(n)};
    Tensor d = g;
    for (auto& v : d.values) v = normal(rng);
    global.Add(std::move(g)).IgnoreError();
    delta.Add(std::move(d)).IgnoreError();
  }
  const std::string bytes = delta.Encode();
  auto views = *ParseParameterSet(bytes);
  auto strategy = *CreateStrategy(StrategyJob{});
  strategy->BeginRound(global, 1);
  std::string sink(bytes.size(), '\0');

  auto seconds = [](auto f, int n) {
    double best = 1e30;
    for (int r = 0; r < n; ++r) {
      auto t0 = Clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  };
  // Interleave so both see the same machine state; best of `reps` each.
  double t_memcpy = 1e30, t_acc = 1e30, t_full = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_memcpy = std::min(t_memcpy, seconds([&] { std::memcpy(sink.data(), bytes.data(), bytes.size()); }, 1));
    t_acc = std::min(t_acc, seconds([&] { strategy->Accumulate(ClientUpdate::Unnamed(views, 100), 0); }, 1));
    t_full = std::min(t_full, seconds([&] {
      auto v = ParseParameterSet(bytes);
      if (!CheckViews(global, *v).ok()) std::abort();
      strategy->Accumulate(ClientUpdate::Unnamed(*v, 100), 0);
    }, 1));
  }
  const double gb = bytes.size() / 1e9;
  std::printf("update: %lld params, %.1f MB; best of %d\n", static_cast<long long>(params),
              bytes.size() / 1e6, reps);
  std::printf("memcpy (reference)                 %7.2f GB/s\n", gb / t_memcpy);
  std::printf("FedAvg accumulate                  %7.2f GB/s  ratio %.2f\n", gb / t_acc,
              t_memcpy / t_acc);
  std::printf("parse + validate + accumulate      %7.2f GB/s  ratio %.2f\n", gb / t_full,
              t_memcpy / t_full);
  std::printf("ratio (accumulate / memcpy): %.2f (target >= 0.5)\n", t_memcpy / t_acc);
  return 0;
}
