// Client: the model a task runs on, kept across tasks (client/model_cache.h).
#include "client/model_cache.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/transfer.h"
#include "core/files.h"
#include "core/memory.h"
#include "core/printable.h"
#include "models/hf_folder.h"
#include "models/kinds.h"
#include "split/cut_policy.h"

namespace cleave {

ParameterSet LoadPersonal(const std::string& path, const std::string& key,
                          const std::vector<std::string>& names, const ParameterSet& global) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return ParameterSet();  // none saved yet
  const size_t newline = bytes->find('\n');
  if (newline == std::string::npos || bytes->compare(0, newline, key) != 0) {
    spdlog::info("{} holds personal layers of another run or model; starting afresh", path);
    return ParameterSet();
  }
  auto saved = ParameterSet::Decode(std::string_view(*bytes).substr(newline + 1));
  ParameterSet probe = global;
  Status fits = saved.ok() ? Overwrite(*saved, &probe) : saved.status();
  if (fits.ok() && saved->size() != names.size()) {
    fits = absl::InvalidArgumentError("other tensors than the model's personal ones");
  }
  if (!fits.ok()) {
    spdlog::warn("ignoring {}: {}", path, fits.ToString());
    return ParameterSet();
  }
  spdlog::info("personal layers restored from {}", path);
  return *std::move(saved);
}

StatusOr<ModelSpec> ModelCache::Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                     const v1::ModelDescription& d) {
  ModelSpec spec;
  spec.name = d.name();
  if (d.input_shape_size() > 0)
    spec.input_shape.assign(d.input_shape().begin(), d.input_shape().end());
  if (d.num_classes() > 0) spec.num_classes = d.num_classes();
  if (d.has_gpt()) {
    spec.gpt = {d.gpt().vocab(), d.gpt().context(), d.gpt().layers(),
                d.gpt().heads(), d.gpt().dim(),     d.gpt().tie()};
  }
  if (d.lora().rank() > 0) {
    spec.lora = {d.lora().rank(), d.lora().alpha(),
                 std::vector<std::string>(d.lora().targets().begin(), d.lora().targets().end()),
                 d.lora().dropout()};
  }
  const ModelTraits kind = ModelTraitsOf(spec.name);
  if (kind.hf_folder) {
    RETURN_IF_ERROR(SetHfModel(spec, d.hf_config(), "the server's config.json"));
    // Refused before it is built: a model past this device's memory (or a server's
    // config.json that states a model far larger than any it could hold).
    const bool limited = opts_.memory_limit_bytes > 0;
    RETURN_IF_ERROR(CheckHfModelFits(
        d.hf_config(), "the server's config.json",
        limited ? opts_.memory_limit_bytes : MemoryCeilingBytes() / 2,
        limited ? "this device's --memory-limit-mb" : "half the memory this device may hold"));
  }
  spec.quantize = d.quantize();
  if (d.width() > 0) spec.width = d.width();
  spec.static_bn = d.static_batch_norm();
  if (d.has_interop()) {
    spec.interop_base = d.interop().base();
    spec.interop_width = d.interop().width();
  }
  if (kind.scripted) {
    if (script_digest_ != d.torchscript_digest()) {
      ASSIGN_OR_RETURN(script_bytes_, FetchBlob(stub, w, d.torchscript_digest()));
      script_digest_ = d.torchscript_digest();
    }
    spec.torchscript = script_bytes_;
  }
  return spec;
}

StatusOr<ParameterSet> ModelCache::FetchGlobal(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                               const v1::Task& task) {
  ASSIGN_OR_RETURN(std::string blob, FetchBlob(stub, w, task.model_digest()));
  return task.model_codec().empty()
             ? ParameterSet::Decode(blob)
             : DecodeCompressedSet(blob, task.model_codec(), int64_t{1} << 31);
}

StatusOr<ModelCache::TaskModel> ModelCache::Fetch(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                                  const v1::Task& task) {
  TaskModel m;
  ASSIGN_OR_RETURN(m.spec, Spec(stub, w, task.model()));
  m.loss = task.train().loss().empty() ? "cross_entropy" : task.train().loss();
  RETURN_IF_ERROR(CheckDataFitsModel(opts_.train, m.spec, m.loss, "local data"));
  ASSIGN_OR_RETURN(m.global, FetchGlobal(stub, w, task));
  // A model with a frozen base (LoRA): the blob with it, fetched once (unless a split
  // task reads it from this device's copy of the model's folder).
  if (!task.base_digest().empty() && !BaseFromFolder(task, m.spec) &&
      base_digest_ != task.base_digest()) {
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(stub, w, task.base_digest()));
    base_ = ParameterSet();
    base_digest_.clear();
    ASSIGN_OR_RETURN(base_, ParameterSet::Decode(bytes));
    base_digest_ = task.base_digest();
  }
  if (m.spec.quantize.empty() != task.quantized_base_digest().empty()) {
    return absl::InvalidArgumentError("a quantized model needs its quantized base, and only it");
  }
  if (!task.quantized_base_digest().empty() && quantized_digest_ != task.quantized_base_digest()) {
    quantized_base_ = {};  // its bytes are freed before the next arrive
    quantized_digest_.clear();
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(stub, w, task.quantized_base_digest()));
    ASSIGN_OR_RETURN(quantized_base_,
                     QuantizedSet::Parse(std::make_shared<const std::string>(std::move(bytes)),
                                         m.spec.quantize));
    quantized_digest_ = task.quantized_base_digest();
  }
  return m;
}

StatusOr<std::vector<std::string>> ModelCache::Set(v1::Coordinator::Stub* stub,
                                                   const v1::Welcome& w, const v1::Task& task,
                                                   TaskModel& m) {
  ParameterSet& global = m.global;
  RETURN_IF_ERROR(Build(task, m.spec));
  // A model with a frozen base: its frozen tensors are the base's values (held once);
  // the blob, and `global`, hold the rest.
  if (!task.base_digest().empty()) {
    RETURN_IF_ERROR(model_->LoadBase(base_));
  } else if (!model_->FrozenTensors().empty()) {
    return absl::InvalidArgumentError(
        "a model with frozen tensors needs its base (Task.base_digest)");
  }
  if (ScriptedLoss(m.loss) && loss_digest_ != task.train().loss_digest()) {
    ASSIGN_OR_RETURN(std::string archive, FetchBlob(stub, w, task.train().loss_digest()));
    RETURN_IF_ERROR(model_->SetTorchScriptLoss(archive));
    loss_digest_ = task.train().loss_digest();
  }
  // Personal layers: this client's own values replace the global model's (the server's
  // initial values, until the client has trained them).
  std::vector<std::string> personal_names(task.model().personal().begin(),
                                          task.model().personal().end());
  for (const std::string& n : personal_names) {
    if (global.Find(n) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("personal tensor '", Printable(n), "' is not in the model"));
    }
  }
  if (const ModelTraits kind = ModelTraitsOf(m.spec.name); kind.has_private_tensors()) {
    // Interoperable architectures: the blob is the shared block; this device's base and
    // fusion are personal layers the blob does not hold, from its model's initialisation
    // until it has trained them.
    ParameterSet whole = model_->Parameters();
    for (const Tensor& t : whole.tensors()) {
      if (kind.private_tensor(t.name)) personal_names.push_back(t.name);
    }
    RETURN_IF_ERROR(Overwrite(global, &whole));
    global = std::move(whole);
  }
  const ParameterSet& personal =
      personal_names.empty() ? personal_ : Personal(task, personal_names, global);
  if (personal.size() > 0) RETURN_IF_ERROR(Overwrite(personal, &global));
  RETURN_IF_ERROR(model_->SetTrainedParameters(global));
  if (!task.quantized_base_digest().empty())
    RETURN_IF_ERROR(model_->LoadQuantized(quantized_base_));
  return personal_names;
}

Status ModelCache::Build(const v1::Task& task, const ModelSpec& spec) {
  const std::string key = task.model().DebugString();
  if (model_ && key == model_key_) return absl::OkStatus();
  ASSIGN_OR_RETURN(model_, Model::Create(spec));
  // Personal layers of another description do not fit (a model dropped after its last
  // task, with task slots, is rebuilt to the same one).
  if (key != model_key_) personal_ = ParameterSet();
  model_key_ = key;
  loss_digest_.clear();
  return absl::OkStatus();
}

Status ModelCache::CheckMemory(const v1::Task& task, const ModelSpec& spec,
                               const FitSettings& fit) {
  if (opts_.memory_limit_bytes <= 0) return absl::OkStatus();
  const std::string key = absl::StrCat(task.model().SerializeAsString(), "|", fit.batch_size, "|",
                                       fit.optimizer, "|", fit.momentum, "|", fit.recompute);
  if (key != memory_key_) {
    std::vector<int64_t> sample = opts_.train.shape;
    if (opts_.train.type == ExampleType::kToken) sample = {opts_.train.shape[0] - 1};
    ASSIGN_OR_RETURN(const TrainingCost cost, WholeModelCost(spec, sample, fit, 1));
    memory_need_ = cost.memory_bytes;
    memory_key_ = key;
  }
  const int64_t held = opts_.count_resident ? ResidentBytes() : 0;
  if (held + memory_need_ > opts_.memory_limit_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("training this model (batch %d, %s) needs about %d MiB beside the %d MiB "
                        "this client holds, "
                        "over its --memory-limit-mb %d",
                        fit.batch_size, fit.optimizer, memory_need_ >> 20, held >> 20,
                        opts_.memory_limit_bytes >> 20));
  }
  return absl::OkStatus();
}

bool ModelCache::BaseFromFolder(const v1::Task& task, const ModelSpec& spec) const {
  return !opts_.model_dir.empty() && ModelTraitsOf(spec.name).hf_folder && task.has_split() &&
         !task.base_digest().empty() &&
         task.split().tail_begin() >= task.split().num_stages();  // not U-shaped
}

const ParameterSet& ModelCache::Personal(const v1::Task& task,
                                         const std::vector<std::string>& names,
                                         const ParameterSet& model) {
  if (personal_.size() == 0 && !PersonalFile().empty()) {
    personal_ = LoadPersonal(PersonalFile(), PersonalKey(task), names, model);
  }
  return personal_;
}

void ModelCache::KeepPersonal(const v1::Task& task, ParameterSet personal) {
  personal_ = std::move(personal);
  if (PersonalFile().empty()) return;
  if (Status s = WriteFileAtomic(PersonalFile(), PersonalKey(task) + "\n" + personal_.Encode());
      !s.ok()) {
    spdlog::warn("personal layers not saved: {}", s.ToString());
  }
}

std::string ModelCache::PersonalFile() const {
  return opts_.state_dir.empty() ? "" : opts_.state_dir + "/personal.pb";
}

std::string ModelCache::PersonalKey(const v1::Task& task) {
  return Sha256Hex(task.run_id() + "|" + task.model().SerializeAsString());
}

StatusOr<std::string> ModelCache::FetchBlob(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                            const std::string& digest) {
  return cleave::FetchBlob(stub, w.client_id(), w.session_token(), digest, 600, emulator_);
}

}  // namespace cleave
