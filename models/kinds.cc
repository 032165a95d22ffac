#include "models/kinds.h"

#include "absl/strings/match.h"
#include "models/model.h"

namespace cleave {

bool InteropPrivate(const std::string& name) {
  return absl::StartsWith(name, "0.") || absl::StartsWith(name, "1.");
}

Registry<ModelTraits>& ModelKinds() {
  static Registry<ModelTraits>* kinds = [] {
    auto* r = new Registry<ModelTraits>("model.name");
    ModelTraits t;
    t.scales = true;
    r->AddBuiltin("mlp", t);
    t.input = ModelInput::kImages;
    r->AddBuiltin("lenet5", t);
    r->AddBuiltin("cnn", t);
    t.batch_norm = true;
    r->AddBuiltin("resnet", t);
    ModelTraits vgg;
    vgg.input = ModelInput::kImages;
    r->AddBuiltin("vgg", vgg);
    ModelTraits gpt;
    gpt.input = ModelInput::kTokens;
    gpt.scales = true;
    gpt.gpt2 = true;
    r->AddBuiltin("gpt", gpt);
    ModelTraits hf;
    hf.input = ModelInput::kTokens;
    hf.scales = true;
    hf.hf_folder = true;
    r->AddBuiltin("hf", hf);
    ModelTraits interop;
    interop.private_tensor = InteropPrivate;
    r->AddBuiltin("interop", interop);
    ModelTraits script;  // no architecture of ours: the archive is the model
    script.scripted = true;
    r->AddBuiltin("torchscript", script);
    return r;
  }();
  return *kinds;
}

KnownTraits ModelTraitsOf(const std::string& name) {
  KnownTraits t;
  if (const ModelTraits* found = ModelKinds().Find(name)) {
    static_cast<ModelTraits&>(t) = *found;
    t.known = true;
  }
  return t;
}

bool ModelSpec::text() const { return ModelTraitsOf(name).tokens(); }

}  // namespace cleave
