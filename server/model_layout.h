// ModelLayout: which of the global model's tensors updates carry and blobs hold, one of
// the coordinator's components. Three sets of tensors leave them:
//   personal  model.personal: each device's own values (the global model keeps their
//             initial ones, which clients start from);
//   frozen    a LoRA model's base: never trained, so never in an update nor in a round's
//             model blob; clients fetch it once, as the pinned base blob;
//   private   a model kind's device-own tensors (ModelTraits::private_tensor: interop's
//             bases and fusion layers), which the server never trains nor sends.
// An update carries the model without all three (UpdateLayout); a model blob and a
// checkpoint hold it without the frozen and private ones (Published). Immutable once made.
#pragma once

#include <string>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

class ModelLayout {
 public:
  ModelLayout() = default;  // every tensor updated and published
  // The layout of `global`: INVALID_ARGUMENT when `personal` covers every tensor
  // (nothing would be federated).
  static StatusOr<ModelLayout> Of(const ParameterSet& global, std::vector<std::string> personal,
                                  std::vector<std::string> frozen,
                                  bool (*private_tensor)(const std::string& name));

  const std::vector<std::string>& personal() const { return personal_; }
  const std::vector<std::string>& frozen() const { return frozen_; }
  // The tensors no update carries (personal, frozen and private), in that order.
  const std::vector<std::string>& not_updated() const { return not_updated_; }
  // Whether updates carry every tensor.
  bool updates_all() const { return not_updated_.empty(); }
  // Whether blobs and checkpoints hold every tensor.
  bool publishes_all() const { return unpublished_.empty(); }

  // The layout of an update (and of the strategy's sums): `global` itself when updates
  // carry every tensor, else the shared tensors, whose values are not kept up to date.
  const ParameterSet& UpdateLayout(const ParameterSet& global) const {
    return not_updated_.empty() ? global : shared_layout_;
  }
  // What a model blob and a checkpoint hold of `model`: `model` itself (no copy) when
  // every tensor is published, else that part of it, in `scratch`.
  const ParameterSet& Published(const ParameterSet& model, ParameterSet& scratch) const;
  // `model` without the tensors no update carries.
  ParameterSet Updated(const ParameterSet& model) const;

 private:
  std::vector<std::string> personal_, frozen_;
  std::vector<std::string> unpublished_;  // frozen and private
  std::vector<std::string> not_updated_;  // personal, frozen and private
  ParameterSet shared_layout_;
};

}  // namespace cleave
