#include "models/torch_stages.h"

#include <torch/script.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "models/builtin_models.h"

namespace cleave {

namespace nn = torch::nn;

StatusOr<std::vector<TorchStage>> BuildTorchStages(const ModelSpec& spec, int begin, int end) {
  std::vector<TorchStage> stages;
  try {
    if (spec.name == "torchscript") {
      std::istringstream in(spec.torchscript);
      torch::jit::Module script = torch::jit::load(in);
      for (const auto& child : script.named_children()) {
        torch::jit::Module m = child.value;
        const std::string prefix = child.name + ".";
        TorchStage s;
        s.parameters = [m, prefix] {
          std::vector<std::pair<std::string, torch::Tensor>> out;
          for (const auto& p : m.named_parameters(/*recurse=*/true)) {
            out.emplace_back(prefix + p.name, p.value);
          }
          for (const auto& b : m.named_buffers(/*recurse=*/true)) {
            if (b.value.is_floating_point()) out.emplace_back(prefix + b.name, b.value);
          }
          return out;
        };
        s.forward = [m](const torch::Tensor& x) mutable { return m.forward({x}).toTensor(); };
        s.train = [m](bool on) mutable { m.train(on); };
        s.quantized = [] { return std::vector<std::pair<std::string, QuantizedWeight*>>(); };
        s.recompute = [](bool) {};
        stages.push_back(std::move(s));
      }
    } else {
      ASSIGN_OR_RETURN(nn::Sequential seq, BuildBuiltin(spec, begin, end));
      for (size_t i = 0; i < seq->size(); ++i) {
        nn::AnyModule stage = *(seq->begin() + i);  // a Stage, or a module of the decoder
        const std::string prefix = absl::StrCat(i, ".");
        TorchStage s;
        s.parameters = [stage, prefix] {
          std::vector<std::pair<std::string, torch::Tensor>> out;
          for (const auto& p : stage.ptr()->named_parameters(/*recurse=*/true)) {
            out.emplace_back(prefix + p.key(), p.value());
          }
          AppendFloatBuffers(stage.ptr()->named_buffers(/*recurse=*/true), prefix, out);
          if (torch::Tensor tied = TiedHeadWeight(*stage.ptr()); tied.defined()) {
            out.emplace_back("0.embed_tokens.weight", tied);
          }
          return out;
        };
        s.quantized = [stage, prefix] {
          auto out = QuantizedWeights(*stage.ptr());
          for (auto& [name, w] : out) name = prefix + name;
          return out;
        };
        s.forward = [stage](const torch::Tensor& x) mutable {
          return stage.forward<torch::Tensor>(x);
        };
        s.train = [stage](bool on) { stage.ptr()->train(on); };
        s.recompute = [stage](bool on) { SetRecompute(*stage.ptr(), on); };
        stages.push_back(std::move(s));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load model ", spec.name, ": ", e.what_without_backtrace()));
  }
  if (stages.empty())
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no stages"));
  return stages;
}

}  // namespace cleave
