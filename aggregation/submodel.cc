#include "aggregation/submodel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregation/robust.h"

namespace cleave {
namespace {

// The window of `n` of `full` indices starting at `roll`, wrapping around.
std::vector<int64_t> Window(int64_t n, int64_t full, int64_t roll) {
  std::vector<int64_t> out(n);
  for (int64_t k = 0; k < n; ++k) out[k] = (roll + k) % full;
  return out;
}

std::vector<int64_t> All(int64_t n) { return Window(n, n, 0); }

// A device's update read into its submodel's order, checked against `positions` and a
// model of `tensors` tensors.
StatusOr<std::vector<std::vector<float>>> ReadPlaced(const std::vector<TensorView>& delta,
                                                     const std::vector<std::vector<int64_t>>& positions,
                                                     size_t tensors) {
  if (delta.size() != positions.size() || delta.size() != tensors) {
    return absl::InvalidArgumentError("a submodel update of another layout");
  }
  std::vector<std::vector<float>> values(delta.size());
  for (size_t t = 0; t < delta.size(); ++t) {
    if (static_cast<size_t>(delta[t].numel) != positions[t].size()) {
      return absl::InvalidArgumentError(absl::StrCat("submodel tensor ", std::string(delta[t].name), " has ",
                                                     delta[t].numel, " values, its place ",
                                                     static_cast<int64_t>(positions[t].size())));
    }
    values[t].resize(positions[t].size());
    delta[t].Read(0, delta[t].numel, values[t].data());
  }
  return values;
}

// The row-major positions in a tensor of shape `whole` of the elements whose index in
// each dimension d is among kept[d], in that order.
std::vector<int64_t> Product(const std::vector<int64_t>& whole, const std::vector<std::vector<int64_t>>& kept) {
  size_t n = 1;
  for (const auto& k : kept) n *= k.size();
  std::vector<int64_t> positions(n);
  std::vector<size_t> digit(kept.size(), 0);
  for (int64_t& p : positions) {
    int64_t flat = 0;
    for (size_t d = 0; d < whole.size(); ++d) flat = flat * whole[d] + kept[d][digit[d]];
    p = flat;
    for (size_t d = kept.size(); d-- > 0;) {
      if (++digit[d] < kept[d].size()) break;
      digit[d] = 0;
    }
  }
  return positions;
}

// A window of `n` of `heads` groups of `group` heads of `head_dim` elements each, as
// element indices.
std::vector<int64_t> Heads(int64_t n, int64_t heads, int64_t group, int64_t head_dim, int64_t roll) {
  std::vector<int64_t> out;
  for (int64_t g : Window(n, heads, roll % heads)) {
    for (int64_t j = 0; j < group * head_dim; ++j) out.push_back(g * group * head_dim + j);
  }
  return out;
}

// INVALID_ARGUMENT naming submodel tensor `s`, whole tensor `w` and why.
Status NotASubmodel(const Tensor& s, const Tensor& w, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("submodel tensor ", s.name, " [", absl::StrJoin(s.shape, ","), "] of ",
                                                 w.name, " [", absl::StrJoin(w.shape, ","), "]: ", why));
}

// `s` is `w`'s tensor (its name and rank), no larger and not empty in any dimension.
Status CheckSubmodelTensor(const Tensor& w, const Tensor& s) {
  if (w.name != s.name || w.shape.size() != s.shape.size() || w.shape.empty()) {
    return NotASubmodel(s, w, "not the same tensor");
  }
  for (size_t d = 0; d < w.shape.size(); ++d) {
    if (s.shape[d] < 1 || s.shape[d] > w.shape[d]) return NotASubmodel(s, w, "larger, or empty");
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<Kept>> SubmodelKept(const ParameterSet& whole, const ParameterSet& sub, int64_t roll) {
  if (whole.size() != sub.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a submodel of ", sub.size(), " tensors, the model has ", whole.size()));
  }
  std::vector<Kept> out;
  std::vector<int64_t> kept;  // the last layer's kept outputs
  int64_t outputs = 0;        // and how many it has in the whole model
  // Every earlier layer's kept outputs by their number in the whole model: a residual
  // shortcut's inputs are a block's inputs, not the last layer's outputs.
  std::map<int64_t, std::vector<int64_t>> kept_of;
  for (size_t t = 0; t < whole.size(); ++t) {
    const Tensor& w = whole.tensors()[t];
    const Tensor& s = sub.tensors()[t];
    const auto bad = [&](const std::string& why) { return NotASubmodel(s, w, why); };
    RETURN_IF_ERROR(CheckSubmodelTensor(w, s));
    std::vector<int64_t> rows;  // the kept indices of dimension 0
    if (w.shape.size() == 1) {  // a bias: its layer's outputs
      if (s.shape[0] == w.shape[0]) {
        rows = All(w.shape[0]);
      } else if (w.shape[0] == outputs && static_cast<int64_t>(kept.size()) == s.shape[0]) {
        rows = kept;
      } else {
        return bad("not its layer's outputs");
      }
      out.push_back({rows});
      continue;
    }
    rows = s.shape[0] == w.shape[0] ? All(w.shape[0]) : Window(s.shape[0], w.shape[0], roll % w.shape[0]);
    // Inputs: whole, the last layer's kept outputs, or (after a flatten) each kept
    // output's block of positions.
    std::vector<int64_t> cols;
    const int64_t in = w.shape[1], in_sub = s.shape[1];
    if (in_sub == in) {
      cols = All(in);
    } else if (outputs > 0 && in == outputs && static_cast<int64_t>(kept.size()) == in_sub) {
      cols = kept;
    } else if (outputs > 0 && in % outputs == 0 && in_sub == static_cast<int64_t>(kept.size()) * (in / outputs)) {
      const int64_t block = in / outputs;
      for (int64_t c : kept) {
        for (int64_t p = 0; p < block; ++p) cols.push_back(c * block + p);
      }
    } else if (auto earlier = kept_of.find(in);
               earlier != kept_of.end() && static_cast<int64_t>(earlier->second.size()) == in_sub) {
      cols = earlier->second;
    } else {
      return bad("its inputs are not the last layer's kept outputs");
    }
    Kept dims = {rows, cols};
    for (size_t d = 2; d < w.shape.size(); ++d) {  // a kernel, whole
      if (s.shape[d] != w.shape[d]) return bad("a kernel of another size");
      dims.push_back(All(w.shape[d]));
    }
    out.push_back(std::move(dims));
    kept = rows;
    outputs = w.shape[0];
    kept_of[outputs] = kept;
  }
  return out;
}

StatusOr<std::vector<Kept>> DecoderKept(const ParameterSet& whole, const ParameterSet& sub, int64_t head_dim,
                                        int64_t group, int64_t roll) {
  if (whole.size() != sub.size() || head_dim < 1 || group < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a submodel of ", sub.size(), " tensors, the model has ", whole.size()));
  }
  std::vector<Kept> out;
  for (size_t t = 0; t < whole.size(); ++t) {
    const Tensor& w = whole.tensors()[t];
    const Tensor& s = sub.tensors()[t];
    const auto bad = [&](const std::string& why) { return NotASubmodel(s, w, why); };
    RETURN_IF_ERROR(CheckSubmodelTensor(w, s));
    const auto named = [&](const char* part) { return w.name.find(part) != std::string::npos; };
    // Which dimension holds heads, and how many heads make one kept unit (a key/value
    // head's group of query heads); -1: none.
    int heads_dim = -1;
    int64_t unit = 1;
    bool packed = false;
    if (named("attn.c_attn.")) {  // GPT-2: q | k | v outputs
      heads_dim = static_cast<int>(w.shape.size()) - 1;
      packed = true;
    } else if (named("attn.c_proj.weight")) {  // GPT-2: the heads' outputs in
      heads_dim = 0;
    } else if (named("k_proj.") || named("v_proj.")) {
      heads_dim = 0;
    } else if (named("q_proj.")) {
      heads_dim = 0;
      unit = group;
    } else if (named("o_proj.weight")) {
      heads_dim = static_cast<int>(w.shape.size()) - 1;
      unit = group;
    }
    Kept kept(w.shape.size());
    for (size_t d = 0; d < w.shape.size(); ++d) {
      const int64_t full = w.shape[d], n = s.shape[d];
      const int64_t parts = packed ? 3 : 1, size = unit * head_dim * parts;
      if (n == full) {
        kept[d] = All(full);
      } else if (static_cast<int>(d) == heads_dim) {
        if (full % size != 0 || n % size != 0) return bad("not whole heads");
        const int64_t part = full / parts;
        for (int64_t b = 0; b < parts; ++b) {
          for (int64_t i : Heads(n / size, full / size, unit, head_dim, roll)) kept[d].push_back(b * part + i);
        }
      } else {
        kept[d] = Window(n, full, roll % full);
      }
    }
    out.push_back(std::move(kept));
  }
  return out;
}

StatusOr<std::vector<Kept>> LeadingKept(const ParameterSet& whole, const ParameterSet& sub) {
  if (whole.size() != sub.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a submodel of ", sub.size(), " tensors, the model has ", whole.size()));
  }
  std::vector<Kept> out;
  for (size_t t = 0; t < whole.size(); ++t) {
    const Tensor& w = whole.tensors()[t];
    const Tensor& s = sub.tensors()[t];
    if (w.name != s.name || w.shape.size() != s.shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("submodel tensor ", s.name, " is not ", w.name));
    }
    Kept kept;
    for (size_t d = 0; d < w.shape.size(); ++d) {
      if (s.shape[d] < 1 || s.shape[d] > w.shape[d]) {
        return absl::InvalidArgumentError(absl::StrCat("submodel tensor ", s.name, " [", absl::StrJoin(s.shape, ","),
                                                       "] is not a block of [", absl::StrJoin(w.shape, ","), "]"));
      }
      kept.push_back(All(s.shape[d]));
    }
    out.push_back(std::move(kept));
  }
  return out;
}

std::vector<std::vector<int64_t>> PositionsOf(const ParameterSet& whole, const std::vector<Kept>& kept) {
  std::vector<std::vector<int64_t>> out;
  for (size_t t = 0; t < kept.size() && t < whole.size(); ++t) out.push_back(Product(whole.tensors()[t].shape, kept[t]));
  return out;
}

StatusOr<std::vector<std::vector<int64_t>>> SubmodelPositions(const ParameterSet& whole, const ParameterSet& sub,
                                                             int64_t roll) {
  ASSIGN_OR_RETURN(const std::vector<Kept> kept, SubmodelKept(whole, sub, roll));
  return PositionsOf(whole, kept);
}

StatusOr<std::vector<std::vector<int64_t>>> DecoderPositions(const ParameterSet& whole, const ParameterSet& sub,
                                                            int64_t head_dim, int64_t group, int64_t roll) {
  ASSIGN_OR_RETURN(const std::vector<Kept> kept, DecoderKept(whole, sub, head_dim, group, roll));
  return PositionsOf(whole, kept);
}

StatusOr<std::vector<std::vector<int64_t>>> LeadingPositions(const ParameterSet& whole, const ParameterSet& sub) {
  ASSIGN_OR_RETURN(const std::vector<Kept> kept, LeadingKept(whole, sub));
  return PositionsOf(whole, kept);
}

ParameterSet Gather(const ParameterSet& whole, const ParameterSet& sub,
                    const std::vector<std::vector<int64_t>>& positions) {
  ParameterSet out = sub;
  for (size_t t = 0; t < out.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    const auto& from = whole.tensors()[t].values;
    for (size_t i = 0; i < v.size(); ++i) v[i] = from[positions[t][i]];
  }
  return out;
}

StatusOr<ParameterSet> Placed(const std::vector<TensorView>& delta, const std::vector<std::vector<int64_t>>& positions,
                              const ParameterSet& whole) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<float>> values, ReadPlaced(delta, positions, whole.size()));
  ParameterSet out = whole.ZerosLike();
  for (size_t t = 0; t < values.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    for (size_t i = 0; i < values[t].size(); ++i) v[positions[t][i]] = values[t][i];
  }
  return out;
}

void CountHolders(const std::vector<std::vector<int64_t>>& positions, ParameterSet* holders) {
  for (size_t t = 0; t < positions.size() && t < holders->size(); ++t) {
    auto& v = holders->mutable_tensors()[t].values;
    for (int64_t p : positions[t]) v[p] += 1.0f;
  }
}

SubmodelSum::SubmodelSum(const ParameterSet& whole) : layout_(whole) {
  for (const Tensor& t : whole.tensors()) {
    sum_.emplace_back(t.values.size(), 0.0);
    weight_.emplace_back(t.values.size(), 0.0);
  }
}

Status SubmodelSum::Add(const std::vector<TensorView>& delta, const std::vector<std::vector<int64_t>>& positions,
                        double weight) {
  ASSIGN_OR_RETURN(const std::vector<std::vector<float>> values, ReadPlaced(delta, positions, sum_.size()));
  std::lock_guard<std::mutex> l(mu_);
  total_ += weight;
  for (size_t t = 0; t < values.size(); ++t) {
    for (size_t i = 0; i < values[t].size(); ++i) {
      sum_[t][positions[t][i]] += weight * values[t][i];
      weight_[t][positions[t][i]] += weight;
    }
  }
  return absl::OkStatus();
}

Status SubmodelSum::AddWeighted(const std::vector<TensorView>& delta, const std::vector<TensorView>& weights) {
  if (delta.size() != sum_.size() || weights.size() != sum_.size()) {
    return absl::InvalidArgumentError("a weighted sum of another layout");
  }
  std::vector<std::vector<float>> d(sum_.size()), w(sum_.size());
  for (size_t t = 0; t < sum_.size(); ++t) {
    if (static_cast<size_t>(delta[t].numel) != sum_[t].size() || static_cast<size_t>(weights[t].numel) != sum_[t].size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", layout_.tensors()[t].name, " of another size"));
    }
    d[t].resize(sum_[t].size());
    w[t].resize(sum_[t].size());
    delta[t].Read(0, delta[t].numel, d[t].data());
    weights[t].Read(0, weights[t].numel, w[t].data());
  }
  double most = 0;
  for (const auto& v : w) {
    for (float x : v) {
      if (!std::isfinite(x) || x < 0) return absl::InvalidArgumentError("an element's weight is negative or not finite");
      most = std::max(most, static_cast<double>(x));
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  total_ += most;
  for (size_t t = 0; t < d.size(); ++t) {
    for (size_t i = 0; i < d[t].size(); ++i) {
      sum_[t][i] += static_cast<double>(w[t][i]) * d[t][i];
      weight_[t][i] += w[t][i];
    }
  }
  return absl::OkStatus();
}

ParameterSet SubmodelSum::Weights() const {
  std::lock_guard<std::mutex> l(mu_);
  ParameterSet out = layout_;
  for (size_t t = 0; t < out.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(weight_[t][i]);
  }
  return out;
}

ParameterSet SubmodelSum::Mean() const {
  std::lock_guard<std::mutex> l(mu_);
  ParameterSet out = layout_;
  for (size_t t = 0; t < out.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    for (size_t i = 0; i < v.size(); ++i) v[i] = weight_[t][i] > 0 ? static_cast<float>(sum_[t][i] / weight_[t][i]) : 0.0f;
  }
  return out;
}

ParameterSet SubmodelSum::ZeroPadded(const ParameterSet& start) const {
  std::lock_guard<std::mutex> l(mu_);
  ParameterSet out = layout_;
  if (total_ <= 0) return out.ZerosLike();
  for (size_t t = 0; t < out.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    const auto& from = start.tensors()[t].values;
    // mean = (sum_ + weight_ start) / total_, less start.
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>((sum_[t][i] - (total_ - weight_[t][i]) * from[i]) / total_);
    }
  }
  return out;
}

Status SubmodelUpdates::Add(const std::vector<TensorView>& delta,
                            std::shared_ptr<const std::vector<std::vector<int64_t>>> positions, double weight) {
  ASSIGN_OR_RETURN(std::vector<std::vector<float>> values, ReadPlaced(delta, *positions, layout_.size()));
  std::lock_guard<std::mutex> l(mu_);
  updates_.push_back({std::move(positions), std::move(values), weight});
  return absl::OkStatus();
}

StatusOr<ParameterSet> SubmodelUpdates::Aggregate(const AggregationConfig& rule) const {
  const std::string& r = rule.rule;
  if (r != "median" && r != "trimmed_mean" && r != "norm_bound") {
    return absl::FailedPreconditionError(absl::StrCat(
        "aggregation.rule ", r, " compares whole updates, which submodels of different widths are not"));
  }
  std::lock_guard<std::mutex> l(mu_);
  // norm_bound: each device's factor min(1, max_norm / ||delta||).
  std::vector<double> scale(updates_.size(), 1.0);
  if (r == "norm_bound") {
    for (size_t d = 0; d < updates_.size(); ++d) {
      double sq = 0;
      for (const auto& v : updates_[d].values) {
        for (float x : v) sq += static_cast<double>(x) * x;
      }
      const double norm = std::sqrt(sq);
      if (norm > rule.max_norm) scale[d] = rule.max_norm / norm;
    }
  }
  ParameterSet out = layout_;
  for (size_t t = 0; t < out.size(); ++t) {
    auto& v = out.mutable_tensors()[t].values;
    // Each element's values from the devices that hold it (norm_bound: its weighted sum
    // and weight instead).
    std::vector<std::vector<float>> held(v.size());
    std::vector<double> sum(v.size(), 0.0), weight(v.size(), 0.0);
    for (size_t d = 0; d < updates_.size(); ++d) {
      const Update& u = updates_[d];
      const std::vector<int64_t>& where = (*u.positions)[t];
      for (size_t i = 0; i < where.size(); ++i) {
        if (r == "norm_bound") {
          sum[where[i]] += u.weight * scale[d] * u.values[t][i];
          weight[where[i]] += u.weight;
        } else {
          held[where[i]].push_back(u.values[t][i]);
        }
      }
    }
    for (size_t e = 0; e < v.size(); ++e) {
      if (r == "norm_bound") {
        v[e] = weight[e] > 0 ? static_cast<float>(sum[e] / weight[e]) : 0.0f;
        continue;
      }
      auto& h = held[e];
      if (h.empty()) {
        v[e] = 0.0f;
        continue;
      }
      std::sort(h.begin(), h.end());
      if (r == "median") {
        v[e] = robust::SortedMedian(h);
      } else if (h.size() <= 2 * static_cast<size_t>(rule.f)) {
        return absl::FailedPreconditionError(absl::StrCat("aggregation.rule trimmed_mean with f = ", rule.f,
                                                          ": an element of ", out.tensors()[t].name, " is held by ",
                                                          h.size(), " devices this round, not more than 2f"));
      } else {
        v[e] = robust::SortedTrimmedMean(h, rule.f);
      }
    }
  }
  return out;
}

}  // namespace cleave
