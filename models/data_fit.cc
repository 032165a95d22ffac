// What a model requires of data (CheckDataFitsModel) and a model's spec from its config
// (ModelSpecOf): no LibTorch here.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/losses.h"
#include "models/model.h"

namespace cleave {

namespace {

Status CheckTextFitsModel(const Dataset& data, const ModelSpec& spec, const std::string& loss,
                          const std::string& what) {
  if (!spec.text()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": text needs a language model (model.name: gpt or hf), not ", spec.name));
  }
  if (loss != "cross_entropy") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": text trains with loss cross_entropy (next token), not ", loss));
  }
  // A Hugging Face model's embedding may have rows the tokenizer never uses (Qwen pads it).
  if (spec.name == "hf" ? data.num_classes > spec.gpt.vocab : data.num_classes != spec.gpt.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the tokenizer ", data.tokenizer, " has a vocabulary of ", data.num_classes,
        " but the model's is ", spec.gpt.vocab, " (model.gpt.vocab)"));
  }
  const int64_t length = data.shape.empty() ? 0 : data.shape[0] - 1;
  if (length < 1 || length > spec.gpt.context) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": sequences of ", length, " tokens do not fit the model's context of ",
                     spec.gpt.context, " (the data's context= or model.gpt.context)"));
  }
  for (int64_t i = 0; i < data.size; ++i) {
    for (int64_t j = 0; j < data.example_elements(); ++j) {
      const int32_t id = data.token(i, j);
      if (id < 0 || id >= spec.gpt.vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": sequence ", i, " token ", j, " is id ", id,
                         ", outside the vocabulary [0, ", spec.gpt.vocab, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status CheckDataFitsModel(const Dataset& data, const ModelSpec& spec, const std::string& loss,
                          const std::string& what) {
  if (data.type == ExampleType::kToken) return CheckTextFitsModel(data, spec, loss, what);
  if (spec.text()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": model ", spec.name, " needs text (a text:PATH data spec)"));
  }
  if (data.shape != spec.input_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": examples are ", absl::StrJoin(data.shape, "x"),
                     " but the model takes ", absl::StrJoin(spec.input_shape, "x"),
                     " (model.input; resize with the data "
                     "spec's size=HxW and channels=)"));
  }
  ASSIGN_OR_RETURN(const LossKind* kind, Losses().Get(loss));
  const bool regression = kind->task == LossTask::kRegression;
  if (kind->task != LossTask::kAny && regression != !data.targets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, regression
                  ? ": loss " + loss + " needs regression targets (a table's `regression` option)"
                  : ": regression targets need loss mse or mae, not " + loss));
  }
  if ((regression || kind->task == LossTask::kBinary) && spec.num_classes != 1) {
    return absl::InvalidArgumentError(absl::StrCat("loss ", loss,
                                                   " needs a model with one output "
                                                   "(model.classes: 1), not ",
                                                   spec.num_classes));
  }
  int64_t max_label = -1;
  for (int64_t l : data.labels) max_label = std::max(max_label, l);
  if (kind->task == LossTask::kBinary && max_label > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": label ", max_label, " but loss ", loss, " takes labels 0 and 1"));
  }
  // Class labels (a TorchScript loss's too, for a model with several outputs).
  const bool classes =
      kind->task == LossTask::kClasses ||
      (kind->task == LossTask::kAny && data.targets.empty() && spec.num_classes > 1);
  if (classes && max_label >= spec.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": label ", max_label,
                                                   " but the model has ", spec.num_classes,
                                                   " classes (model.classes)"));
  }
  return absl::OkStatus();
}

ModelSpec ModelSpecOf(const ModelConfig& m, uint64_t seed) {
  ModelSpec spec;
  spec.name = m.name;
  spec.seed = seed;
  spec.input_shape = m.input;
  spec.num_classes = m.classes;
  spec.gpt = m.gpt;
  spec.lora = m.lora;
  spec.quantize = QuantizeCodec(m);
  spec.static_bn = m.batch_norm == "static";
  if (m.name == "interop") {
    spec.interop_base = m.interop.base;
    spec.interop_width = m.interop.width;
  }
  return spec;
}

}  // namespace cleave
