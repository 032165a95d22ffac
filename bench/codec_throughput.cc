// Codec encode and decode throughput against memcpy of the same fp32 bytes, same run.
//   bench_codec_throughput [--rows R] [--cols C] [--reps N] [SPEC ...]
// Encode: Codec::Encode of one rows x cols tensor (with its error feedback). Decode: what
// the server does with an upload, Codec::Check and then DecodeRange block by block.
// Throughput counts the fp32 bytes in (encode) or out (decode); best of N, interleaved
// with memcpy so both see the same machine state.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compression/codec.h"

using namespace cleave;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int64_t rows = 1024, cols = 4096;
  int reps = 10;
  std::vector<std::string> specs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) rows = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--cols") && i + 1 < argc) cols = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else specs.push_back(argv[i]);
  }
  if (specs.empty()) {
    specs = {"none", "fp16", "bf16", "int8", "int8:sr", "int8:channel", "qsgd:4",
             "topk:0.01", "randk:0.01", "sign", "powersgd:2"};
  }
  const Shape shape = {rows, cols};
  const int64_t n = rows * cols;
  std::vector<float> in(n), out(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 0.01f);
  for (auto& v : in) v = normal(rng);
  const double bytes = 4.0 * n;

  auto time = [](auto f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::printf("tensor %lld x %lld (%.1f MB fp32), best of %d\n", static_cast<long long>(rows),
              static_cast<long long>(cols), bytes / 1e6, reps);
  std::printf("| codec | bytes vs fp32 | encode GB/s | decode GB/s | memcpy GB/s | encode / memcpy | decode / memcpy |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& spec : specs) {
    auto codec = MakeCodec(spec, 1);
    if (!codec.ok()) {
      std::fprintf(stderr, "%s\n", std::string(codec.status().message()).c_str());
      return 2;
    }
    Codec& c = **codec;
    std::string encoded;
    double t_enc = 1e30, t_dec = 1e30, t_copy = 1e30;
    for (int r = 0; r < reps; ++r) {
      t_copy = std::min(t_copy, time([&] { std::memcpy(out.data(), in.data(), bytes); }));
      t_enc = std::min(t_enc, time([&] {
        encoded.clear();
        c.Encode(0, in.data(), shape, &encoded);
      }));
      t_dec = std::min(t_dec, time([&] {
        if (!c.Check(encoded, shape).ok()) std::abort();
        for (int64_t b = 0; b < n; b += kViewBlock) {
          c.DecodeRange(encoded, shape, b, std::min(kViewBlock, n - b), out.data() + b);
        }
      }));
    }
    std::printf("| %s | %.4f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", spec.c_str(),
                encoded.size() / bytes, bytes / t_enc / 1e9, bytes / t_dec / 1e9,
                bytes / t_copy / 1e9, t_copy / t_enc, t_copy / t_dec);
  }
  return 0;
}
