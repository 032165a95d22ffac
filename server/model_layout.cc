#include "server/model_layout.h"

namespace cleave {

StatusOr<ModelLayout> ModelLayout::Of(const ParameterSet& global, std::vector<std::string> personal,
                                      std::vector<std::string> frozen,
                                      bool (*private_tensor)(const std::string& name)) {
  if (!personal.empty() && personal.size() == global.size()) {
    return absl::InvalidArgumentError("model.personal: matches every tensor; nothing is federated");
  }
  ModelLayout l;
  l.personal_ = std::move(personal);
  l.frozen_ = std::move(frozen);
  l.not_updated_ = l.personal_;
  l.not_updated_.insert(l.not_updated_.end(), l.frozen_.begin(), l.frozen_.end());
  if (private_tensor != nullptr) {
    for (const Tensor& t : global.tensors()) {
      if (private_tensor(t.name)) l.unpublished_.push_back(t.name);
    }
  }
  l.not_updated_.insert(l.not_updated_.end(), l.unpublished_.begin(), l.unpublished_.end());
  l.unpublished_.insert(l.unpublished_.end(), l.frozen_.begin(), l.frozen_.end());
  if (!l.not_updated_.empty()) l.shared_layout_ = Without(global, l.not_updated_);
  return l;
}

const ParameterSet& ModelLayout::Published(const ParameterSet& model, ParameterSet& scratch) const {
  if (unpublished_.empty()) return model;
  scratch = Without(model, unpublished_);
  return scratch;
}

ParameterSet ModelLayout::Updated(const ParameterSet& model) const {
  return not_updated_.empty() ? model : Without(model, not_updated_);
}

}  // namespace cleave
