// Client: what a simulated attacker sends instead of its honest update (--attack;
// client/attacks.h names them).
#include "client/client_impl.h"

namespace cleave {

Status Client::Impl::Attack(const ParameterSet& global, const LocalTrainOptions& o,
                            ParameterSet* delta) {
  const std::string& a = opts.attack;
  if (a == "sign-flip") {
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -v;
    }
    return absl::OkStatus();
  }
  if (a == "gaussian") {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> noise(0, 1);
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = noise(rng);
    }
    return absl::OkStatus();
  }
  if (a == "ipm") {  // our own honest update is our estimate of the benign mean
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -3.0f * v;
    }
    return absl::OkStatus();
  }
  // alie: mu is our honest update; sigma per coordinate is estimated from the updates of
  // 4 shards of our data (each times 4, as if trained on all of it).
  constexpr int kShards = 4;
  std::vector<std::vector<int64_t>> shards(kShards);
  for (int64_t i = 0; i < opts.train.size; ++i) shards[i % kShards].push_back(i);
  std::vector<ParameterSet> ds;
  for (const auto& idx : shards) {
    RETURN_IF_ERROR(models.model()->SetTrainedParameters(global));
    RETURN_IF_ERROR(models.model()->Train(opts.train.Subset(idx), o).status());
    ParameterSet d = Delta(models.model()->TrainedParameters(), global);
    for (auto& t : d.mutable_tensors()) {
      for (float& v : t.values) v *= kShards;
    }
    ds.push_back(std::move(d));
  }
  for (size_t i = 0; i < delta->size(); ++i) {
    auto& out = delta->mutable_tensors()[i].values;
    for (size_t j = 0; j < out.size(); ++j) {
      double mean = 0, sq = 0;
      for (const auto& d : ds) mean += d.tensors()[i].values[j];
      mean /= kShards;
      for (const auto& d : ds) {
        const double x = d.tensors()[i].values[j] - mean;
        sq += x * x;
      }
      out[j] = static_cast<float>(out[j] - 1.5 * std::sqrt(sq / (kShards - 1)));
    }
  }
  return absl::OkStatus();
}

}  // namespace cleave
