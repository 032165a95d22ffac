#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "data/dataset.h"

namespace cleave {
namespace {

using Parts = std::vector<std::vector<int64_t>>;

Parts Iid(int64_t n, int k, std::mt19937_64& rng) {
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::shuffle(idx.begin(), idx.end(), rng);
  Parts parts(k);
  for (int c = 0; c < k; ++c) {
    int64_t begin = n * c / k, end = n * (c + 1) / k;
    parts[c].assign(idx.begin() + begin, idx.begin() + end);
  }
  return parts;
}

std::vector<std::vector<int64_t>> ByClass(const std::vector<int64_t>& labels, int num_classes) {
  std::vector<std::vector<int64_t>> by(num_classes);
  for (size_t i = 0; i < labels.size(); ++i) by[labels[i]].push_back(static_cast<int64_t>(i));
  return by;
}

// NIID-Bench's Dirichlet label skew: redraw until every client has >= 10 examples.
StatusOr<Parts> Dirichlet(const std::vector<int64_t>& labels, int num_classes, int k,
                          double alpha, std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(labels.size());
  if (n < int64_t{10} * k) {
    return absl::InvalidArgumentError("dirichlet partition needs >= 10 examples per client");
  }
  auto by_class = ByClass(labels, num_classes);
  std::gamma_distribution<double> gamma(alpha, 1.0);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    Parts parts(k);
    for (auto cls : by_class) {
      std::shuffle(cls.begin(), cls.end(), rng);
      std::vector<double> p(k);
      double sum = 0;
      for (int c = 0; c < k; ++c) {
        p[c] = gamma(rng);
        // Balance: a client that already holds its fair share gets no more.
        if (static_cast<int64_t>(parts[c].size()) >= n / k) p[c] = 0;
        sum += p[c];
      }
      if (sum <= 0) {
        for (auto& x : p) x = 1.0 / k;
        sum = 1;
      }
      int64_t start = 0;
      double cum = 0;
      for (int c = 0; c < k; ++c) {
        cum += p[c] / sum;
        int64_t end = (c == k - 1) ? static_cast<int64_t>(cls.size())
                                   : static_cast<int64_t>(cum * cls.size());
        end = std::max(start, std::min<int64_t>(end, cls.size()));
        parts[c].insert(parts[c].end(), cls.begin() + start, cls.begin() + end);
        start = end;
      }
    }
    size_t min_size = parts[0].size();
    for (const auto& p : parts) min_size = std::min(min_size, p.size());
    if (min_size >= 10) {
      for (auto& p : parts) std::shuffle(p.begin(), p.end(), rng);
      return parts;
    }
  }
  return absl::FailedPreconditionError("dirichlet partition: no split with >= 10 examples each");
}

Parts Shards(const std::vector<int64_t>& labels, int k, int per_client, std::mt19937_64& rng) {
  const int64_t n = static_cast<int64_t>(labels.size());
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return labels[a] < labels[b]; });
  const int64_t num_shards = int64_t{k} * per_client;
  std::vector<int64_t> shard_ids(num_shards);
  std::iota(shard_ids.begin(), shard_ids.end(), 0);
  std::shuffle(shard_ids.begin(), shard_ids.end(), rng);
  Parts parts(k);
  for (int64_t s = 0; s < num_shards; ++s) {
    int64_t shard = shard_ids[s];
    int64_t begin = n * shard / num_shards, end = n * (shard + 1) / num_shards;
    auto& part = parts[s / per_client];
    part.insert(part.end(), idx.begin() + begin, idx.begin() + end);
  }
  return parts;
}

Parts LabelQuantity(const std::vector<int64_t>& labels, int num_classes, int k, int per_client,
                    std::mt19937_64& rng) {
  // Client c always holds label c % num_classes, then per_client-1 other random labels.
  std::vector<std::vector<int>> owners(num_classes);
  for (int c = 0; c < k; ++c) {
    std::vector<int> held = {c % num_classes};
    while (static_cast<int>(held.size()) < per_client) {
      int l = static_cast<int>(rng() % num_classes);
      if (std::find(held.begin(), held.end(), l) == held.end()) held.push_back(l);
    }
    for (int l : held) owners[l].push_back(c);
  }
  auto by_class = ByClass(labels, num_classes);
  Parts parts(k);
  for (int l = 0; l < num_classes; ++l) {
    auto& cls = by_class[l];
    std::shuffle(cls.begin(), cls.end(), rng);
    const int64_t m = static_cast<int64_t>(owners[l].size());
    for (int64_t j = 0; j < m; ++j) {
      int64_t begin = cls.size() * j / m, end = cls.size() * (j + 1) / m;
      auto& part = parts[owners[l][j]];
      part.insert(part.end(), cls.begin() + begin, cls.begin() + end);
    }
  }
  for (auto& p : parts) std::shuffle(p.begin(), p.end(), rng);
  return parts;
}

}  // namespace

StatusOr<std::vector<std::vector<int64_t>>> Partition(const std::vector<int64_t>& labels,
                                                      int num_classes, const std::string& spec,
                                                      int num_clients, uint64_t seed) {
  if (num_clients < 1) return absl::InvalidArgumentError("partition needs >= 1 client");
  if (static_cast<int64_t>(labels.size()) < num_clients) {
    return absl::InvalidArgumentError("partition: fewer examples than clients");
  }
  std::mt19937_64 rng(seed);
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "iid" && arg.empty()) return Iid(labels.size(), num_clients, rng);
  if (kind == "dirichlet") {
    double alpha = 0;
    if (!absl::SimpleAtod(arg, &alpha) || !(alpha > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("dirichlet needs alpha > 0: ", spec));
    }
    return Dirichlet(labels, num_classes, num_clients, alpha, rng);
  }
  int k = 0;
  if (kind == "shards") {
    if (!absl::SimpleAtoi(arg, &k) || k < 1 ||
        int64_t{k} * num_clients > static_cast<int64_t>(labels.size())) {
      return absl::InvalidArgumentError(absl::StrCat("shards needs 1 <= S <= n/clients: ", spec));
    }
    return Shards(labels, num_clients, k, rng);
  }
  if (kind == "labels") {
    if (!absl::SimpleAtoi(arg, &k) || k < 1 || k > num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels needs 1 <= K <= ", num_classes, ": ", spec));
    }
    return LabelQuantity(labels, num_classes, num_clients, k, rng);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown partition '", spec, "' (iid, dirichlet:A, shards:S, labels:K)"));
}

StatusOr<std::vector<std::vector<int64_t>>> PartitionDataset(const Dataset& data,
                                                             const std::string& spec,
                                                             int num_clients, uint64_t seed) {
  if (!data.targets.empty() && spec != "natural" && spec != "iid") {
    return absl::InvalidArgumentError("partition " + spec +
                                      ": regression data has no classes to skew (iid or natural)");
  }
  if (data.type == ExampleType::kToken && spec != "natural" && spec != "iid") {
    return absl::InvalidArgumentError("partition " + spec +
                                      ": text has no classes to skew (iid or natural: a file each)");
  }
  if (spec != "natural") return Partition(data.labels, data.num_classes, spec, num_clients, seed);
  if (data.groups.empty()) {
    return absl::InvalidArgumentError(
        "partition natural: this data has no groups (folder ...,groups or csv ...,group=COLUMN)");
  }
  const int num_groups = static_cast<int>(data.group_names.size());
  if (num_groups < num_clients) {
    return absl::InvalidArgumentError(absl::StrCat("partition natural: ", num_groups,
                                                   " groups cannot feed ", num_clients, " clients"));
  }
  // Groups in the order of their names, dealt in turn.
  std::vector<int> order(num_groups);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return data.group_names[a] < data.group_names[b]; });
  std::vector<int> client_of(num_groups);
  for (int r = 0; r < num_groups; ++r) client_of[order[r]] = r % num_clients;
  Parts parts(num_clients);
  for (int64_t i = 0; i < data.size; ++i) parts[client_of[data.groups[i]]].push_back(i);
  return parts;
}

}  // namespace cleave
