// What the fuzz targets and their seed-corpus generator (make_corpus.cc) agree on: the
// model layout updates are decoded against, the codecs a first byte picks, and the
// framing of the SecAgg target's operations.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/parameter_set.h"
#include "privacy/options.h"
#include "server/modes/secagg_round.h"

namespace cleave::fuzz {

// A small model with the shapes that matter to codecs: a vector, a matrix (per-row
// codecs, PowerSGD), an odd length (bit packing).
inline ParameterSet Layout() {
  ParameterSet ps;
  auto add = [&ps](const char* name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = 0.01f * static_cast<float>((i * 37) % 101 - 50);
    (void)ps.Add({name, shape, std::move(v)});
  };
  add("conv.weight", {4, 1, 3, 3});
  add("fc.weight", {10, 33});
  add("fc.bias", {10});
  add("odd", {7});
  return ps;
}

// Every codec the wire carries (compression/codec.h), the first input byte picks one.
inline const std::vector<std::string>& Codecs() {
  static const std::vector<std::string> kCodecs = {
      "fp16",  "bf16",       "int8",      "int8:sr",     "int8:channel", "int8:channel:sr",
      "qsgd:4", "qsgd:16",   "topk:0.1",  "topk:0.1:ef21", "randk:0.2",  "sign",
      "powersgd:2", "int8:token"};
  return kCodecs;
}

// The SecAgg target reads operations: one byte (op % kOps), one byte (the client, % 4),
// a 2-byte little-endian length, then that many bytes of message.
enum SecAggOp { kKeys, kShares, kMasked, kReveal, kDrop, kClose, kOps };
constexpr int kSecAggClients = 4;
constexpr int64_t kSecAggLength = 16;

inline std::vector<std::string> SecAggClients() {
  std::vector<std::string> clients;
  for (int i = 0; i < kSecAggClients; ++i) clients.push_back("c" + std::to_string(i));
  return clients;
}

// The round the SecAgg target plays: SecAggClients(), 2 neighbours, 2 shares to recover.
inline std::unique_ptr<SecAggRound> MakeSecAggRound() {
  SecureAggregationConfig c;
  c.k = 2;
  c.t = 2;
  c.bits = 8;
  c.modulus = uint64_t{1} << 16;
  return std::make_unique<SecAggRound>(c, "fuzz", SecAggClients(), kSecAggLength, 100, 1);
}

inline std::string SecAggRecord(int op, int client, const std::string& message) {
  std::string r;
  r.push_back(static_cast<char>(op));
  r.push_back(static_cast<char>(client));
  r.push_back(static_cast<char>(message.size() & 0xff));
  r.push_back(static_cast<char>((message.size() >> 8) & 0xff));
  return r + message;
}

}  // namespace cleave::fuzz
