#include "models/lora_ranks.h"

#include <torch/torch.h>

#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cleave {
namespace {

constexpr char kA[] = ".lora_A";
constexpr char kB[] = ".lora_B";

// Which dimension of an adapter is its rank: the built-in decoder's Conv1D keeps
// A [in, rank] and B [rank, out]; hf's projections PEFT's A [rank, in] and B [out, rank].
StatusOr<int> RankDim(const ModelSpec& spec, const Tensor& t) {
  const bool a = absl::EndsWith(t.name, kA);
  if (!a && !absl::EndsWith(t.name, kB)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is not a LoRA adapter"));
  }
  if (t.shape.size() != 2) return absl::InvalidArgumentError(absl::StrCat("adapter ", t.name, " is not a matrix"));
  if (spec.name == "gpt") return a ? 1 : 0;
  if (spec.name == "hf") return a ? 0 : 1;
  return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no LoRA adapters"));
}

Status CheckRank(const ModelSpec& spec, int64_t rank) {
  if (rank < 1 || rank > spec.lora.rank) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank ", rank, " is not in [1, ", spec.lora.rank, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<ParameterSet> AdaptersAtRank(const ModelSpec& spec, const ParameterSet& adapters, int64_t rank) {
  RETURN_IF_ERROR(CheckRank(spec, rank));
  ParameterSet out;
  for (const Tensor& t : adapters.tensors()) {
    ASSIGN_OR_RETURN(const int dim, RankDim(spec, t));
    Tensor cut{t.name, t.shape, {}};
    cut.shape[dim] = rank;
    cut.values.assign(static_cast<size_t>(cut.numel()), 0.0f);
    RETURN_IF_ERROR(out.Add(std::move(cut)));
  }
  return out;
}

double AlphaAtRank(const LoraConfig& lora, int64_t rank) { return lora.alpha * static_cast<double>(rank) / lora.rank; }

struct FlexLoraSum::Impl {
  // One adapted projection: x left right, left = A with its rank dimension last, right =
  // B with it first; sum of the weighted products [in, out], in double.
  struct Pair {
    size_t a = 0, b = 0;
    int a_dim = 0, b_dim = 0;
    torch::Tensor sum;
  };
  int64_t rank = 0;
  ParameterSet start;
  std::vector<Pair> pairs;
  mutable std::mutex mu;
  double total = 0;

  torch::Tensor Start(size_t t) const {
    const Tensor& s = start.tensors()[t];
    return torch::from_blob(const_cast<float*>(s.values.data()), s.shape, torch::kFloat32).to(torch::kFloat64);
  }
};

FlexLoraSum::FlexLoraSum(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FlexLoraSum::~FlexLoraSum() = default;

StatusOr<std::unique_ptr<FlexLoraSum>> FlexLoraSum::Create(const ModelSpec& spec, const ParameterSet& adapters) {
  auto impl = std::make_unique<Impl>();
  impl->rank = spec.lora.rank;
  impl->start = adapters;
  const auto& ts = adapters.tensors();
  std::vector<bool> paired(ts.size(), false);
  for (size_t i = 0; i < ts.size(); ++i) {
    ASSIGN_OR_RETURN(const int dim, RankDim(spec, ts[i]));
    if (!absl::EndsWith(ts[i].name, kA)) continue;
    const std::string b_name = absl::StrCat(ts[i].name.substr(0, ts[i].name.size() - (sizeof(kA) - 1)), kB);
    size_t j = 0;
    while (j < ts.size() && ts[j].name != b_name) ++j;
    if (j == ts.size()) return absl::InvalidArgumentError(absl::StrCat("adapter ", ts[i].name, " has no ", b_name));
    ASSIGN_OR_RETURN(const int b_dim, RankDim(spec, ts[j]));
    if (ts[i].shape[dim] != spec.lora.rank || ts[j].shape[b_dim] != spec.lora.rank) {
      return absl::InvalidArgumentError(absl::StrCat("adapters ", ts[i].name, " and ", b_name, " are not of rank ",
                                                     spec.lora.rank));
    }
    Impl::Pair p{i, j, dim, b_dim, {}};
    const int64_t in = ts[i].shape[1 - dim], out = ts[j].shape[1 - b_dim];
    p.sum = torch::zeros({in, out}, torch::kFloat64);
    paired[i] = paired[j] = true;
    impl->pairs.push_back(std::move(p));
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!paired[i]) return absl::InvalidArgumentError(absl::StrCat("adapter ", ts[i].name, " has no partner"));
  }
  return std::unique_ptr<FlexLoraSum>(new FlexLoraSum(std::move(impl)));
}

Status FlexLoraSum::Add(const std::vector<TensorView>& delta, int64_t rank, double weight) {
  Impl& m = *impl_;
  if (delta.size() != m.start.size() || rank < 1 || rank > m.rank) {
    return absl::InvalidArgumentError("a LoRA update of another layout");
  }
  torch::NoGradGuard no_grad;
  // The device's trained adapters of pair p's tensor t: the start's leading block plus
  // its delta.
  const auto trained = [&](size_t t, int dim) -> StatusOr<torch::Tensor> {
    std::vector<int64_t> shape = m.start.tensors()[t].shape;
    shape[dim] = rank;
    if (delta[t].shape != shape || std::string(delta[t].name) != m.start.tensors()[t].name) {
      return absl::InvalidArgumentError(absl::StrCat("LoRA update tensor ", std::string(delta[t].name), " [",
                                                     absl::StrJoin(delta[t].shape, ","), "] is not ",
                                                     m.start.tensors()[t].name, " at rank ", rank));
    }
    std::vector<float> values(static_cast<size_t>(delta[t].numel));
    delta[t].Read(0, delta[t].numel, values.data());
    auto d = torch::from_blob(values.data(), shape, torch::kFloat32).to(torch::kFloat64);
    return m.Start(t).narrow(dim, 0, rank) + d;
  };
  std::vector<torch::Tensor> products;
  for (const Impl::Pair& p : m.pairs) {
    ASSIGN_OR_RETURN(torch::Tensor a, trained(p.a, p.a_dim));
    ASSIGN_OR_RETURN(torch::Tensor b, trained(p.b, p.b_dim));
    products.push_back(torch::matmul(a.movedim(p.a_dim, 1), b.movedim(p.b_dim, 0)));
  }
  std::lock_guard<std::mutex> l(m.mu);
  for (size_t i = 0; i < products.size(); ++i) m.pairs[i].sum.add_(products[i], weight);
  m.total += weight;
  return absl::OkStatus();
}

StatusOr<ParameterSet> FlexLoraSum::Result() const {
  const Impl& m = *impl_;
  std::lock_guard<std::mutex> l(m.mu);
  ParameterSet out = m.start;
  if (m.total <= 0) return out;
  torch::NoGradGuard no_grad;
  for (const Impl::Pair& p : m.pairs) {
    const torch::Tensor mean = p.sum / m.total;
    auto [u, s, vh] = torch::linalg::svd(mean, /*full_matrices=*/false, c10::nullopt);
    // A product of fewer than `rank` dimensions leaves the last components zero.
    const int64_t k = std::min<int64_t>(m.rank, s.size(0));
    const torch::Tensor root = s.narrow(0, 0, k).sqrt();
    torch::Tensor left = torch::zeros({mean.size(0), m.rank}, torch::kFloat64);
    torch::Tensor right = torch::zeros({m.rank, mean.size(1)}, torch::kFloat64);
    left.narrow(1, 0, k).copy_(u.narrow(1, 0, k) * root);
    right.narrow(0, 0, k).copy_(vh.narrow(0, 0, k) * root.unsqueeze(1));
    for (auto [t, factor] : {std::pair{p.a, left.movedim(1, p.a_dim)}, std::pair{p.b, right.movedim(0, p.b_dim)}}) {
      const torch::Tensor f = factor.to(torch::kFloat32).contiguous();
      auto& v = out.mutable_tensors()[t].values;
      std::copy(f.data_ptr<float>(), f.data_ptr<float>() + f.numel(), v.begin());
    }
  }
  return out;
}

}  // namespace cleave
