// SecAgg+ computation cost per round against plain aggregation, same run.
//   bench_secagg [--params N] [--k K] [--dropout F]
// For 10, 50 and 100 clients on an N-value update (default 1M): one client's time (keys,
// shares, quantize, mask) and the server's (sum and unmask, a fraction F of clients
// dropped after sharing), against quantize-and-sum without masks. Computation only;
// bench_secagg_wire measures whole rounds over gRPC, bytes included.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "privacy/secagg.h"

using namespace cleave;
using namespace cleave::secagg;
using Clock = std::chrono::steady_clock;

namespace {
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

int main(int argc, char** argv) {
  int64_t params = 1'000'000;
  int k = 8;
  double dropout = 0.1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--params")) params = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dropout")) dropout = std::atof(argv[i + 1]);
  }
  Params p;
  p.k = k;
  p.t = k / 2 + 1;
  p.bits = 16;
  p.modulus = (uint64_t{1} << 32) - 5;
  p.context = "bench|1";
  std::printf("update %lld values, k = %d, t = %d, %.0f%% of clients drop after sharing\n",
              static_cast<long long>(params), p.k, p.t, 100 * dropout);
  std::printf("| clients | client: plain ms | client: SecAgg+ ms | ratio | server: plain ms | server: SecAgg+ ms | ratio |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0, 0.3f);
  std::vector<float> x(params);
  for (auto& v : x) v = normal(rng);
  for (int n : {10, 50, 100}) {
    const auto graph = NeighbourGraph(n, p.k, 7);
    std::vector<ClientKeys> keys(n);
    std::map<int, Bytes> public_keys;
    for (int u = 0; u < n; ++u) {
      keys[u] = *NewClientKeys();
      public_keys[u] = keys[u].mask_key.public_key;
    }
    // Client 0, timed; the others' work is the same and is only needed for the sum.
    double client_plain = 1e30, client_secagg = 1e30;
    std::vector<std::vector<uint64_t>> quantized(n), masked(n);
    std::vector<std::map<int, SharesFor>> shares(n);
    for (int u = 0; u < n; ++u) {
      auto t0 = Clock::now();
      quantized[u] = Quantize(x, p, rng);
      const double tq = Since(t0);
      t0 = Clock::now();
      shares[u] = *ShareSecrets(u, keys[u], graph[u], p);
      masked[u] = *Mask(u, quantized[u], keys[u], graph[u], public_keys, p);
      const double tm = Since(t0);
      client_plain = std::min(client_plain, tq);
      client_secagg = std::min(client_secagg, tq + tm);
    }
    // Random dropouts, as many as the threshold allows up to the fraction: every client
    // keeps at least t surviving neighbours (otherwise the round aborts).
    std::set<int> dropped;
    std::vector<int> order(n);
    for (int u = 0; u < n; ++u) order[u] = u;
    std::shuffle(order.begin(), order.end(), rng);
    for (int c : order) {
      if (static_cast<int>(dropped.size()) >= static_cast<int>(dropout * n)) break;
      dropped.insert(c);
      bool ok = true;
      for (int u = 0; u < n && ok; ++u) {
        int alive = 0;
        for (int v : graph[u]) alive += !dropped.count(v);
        ok = alive >= p.t;
      }
      if (!ok) dropped.erase(c);
    }
    auto t0 = Clock::now();
    std::vector<uint64_t> plain(params, 0);
    for (int u = 0; u < n; ++u) {
      if (dropped.count(u)) continue;
      for (int64_t i = 0; i < params; ++i) plain[i] = (plain[i] + quantized[u][i]) % p.modulus;
    }
    const double server_plain = Since(t0);
    Unmasking in;
    for (int u = 0; u < n; ++u) {
      for (int v : graph[u]) {
        if (dropped.count(v)) continue;
        if (dropped.count(u)) in.mask_key[u].push_back(shares[u][v].mask_key);
        else in.self_seed[u].push_back(shares[u][v].self_seed);
      }
    }
    t0 = Clock::now();  // the server sums the masked inputs as they arrive, then unmasks
    in.masked_sum.assign(params, 0);
    for (int u = 0; u < n; ++u) {
      if (dropped.count(u)) continue;
      in.survivors.insert(u);
      AddMod(in.masked_sum, masked[u], p.modulus);
    }
    auto sum = Unmask(in, graph, public_keys, p);
    const double server_secagg = Since(t0);
    if (!sum.ok() || *sum != plain) {
      std::fprintf(stderr, "n = %d: unmasked sum is wrong: %s\n", n, sum.status().ToString().c_str());
      return 1;
    }
    std::printf("| %d (%zu dropped) | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", n,
                dropped.size(), 1e3 * client_plain, 1e3 * client_secagg,
                client_secagg / client_plain, 1e3 * server_plain, 1e3 * server_secagg,
                server_secagg / server_plain);
  }
  return 0;
}
