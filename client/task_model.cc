// Client: the model a task runs on, kept across tasks: its description, the global
// model and frozen or quantized base fetched (once where they do not change), personal
// layers restored, the memory check before training.
#include "client/client_impl.h"

#include "core/memory.h"
#include "models/kinds.h"
#include "models/part.h"
#include "proto/train_config.h"
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

StatusOr<ModelSpec> Client::Impl::Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                      const v1::ModelDescription& d) {
  ModelSpec spec;
  spec.name = d.name();
  if (d.input_shape_size() > 0) spec.input_shape.assign(d.input_shape().begin(), d.input_shape().end());
  if (d.num_classes() > 0) spec.num_classes = d.num_classes();
  if (d.has_gpt()) {
    spec.gpt = {d.gpt().vocab(), d.gpt().context(), d.gpt().layers(), d.gpt().heads(),
                d.gpt().dim(), d.gpt().tie()};
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
    const bool limited = opts.memory_limit_bytes > 0;
    RETURN_IF_ERROR(CheckHfModelFits(d.hf_config(), "the server's config.json",
                                     limited ? opts.memory_limit_bytes : MemoryCeilingBytes() / 2,
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
    if (script_digest != d.torchscript_digest()) {
      ASSIGN_OR_RETURN(script_bytes, FetchBlob(stub, w.client_id(), w.session_token(),
                                               d.torchscript_digest(), 600, &emulator));
      script_digest = d.torchscript_digest();
    }
    spec.torchscript = script_bytes;
  }
  return spec;
}

StatusOr<ParameterSet> Client::Impl::FetchModel(v1::Coordinator::Stub* stub,
                                                const v1::Welcome& w, const v1::Task& task) {
  ASSIGN_OR_RETURN(std::string blob, FetchBlob(stub, w.client_id(), w.session_token(),
                                               task.model_digest(), 600, &emulator));
  return task.model_codec().empty()
             ? ParameterSet::Decode(blob)
             : DecodeCompressedSet(blob, task.model_codec(), int64_t{1} << 31);
}

StatusOr<Client::Impl::TaskModel> Client::Impl::FetchTaskModel(const TaskCall& c) {
  TaskModel m;
  ASSIGN_OR_RETURN(m.spec, Spec(c.stub, c.w, c.task.model()));
  m.loss = c.task.train().loss().empty() ? "cross_entropy" : c.task.train().loss();
  RETURN_IF_ERROR(CheckDataFitsModel(opts.train, m.spec, m.loss, "local data"));
  ASSIGN_OR_RETURN(m.global, FetchModel(c.stub, c.w, c.task));
  // A model with a frozen base (LoRA): the blob with it, fetched once (unless a split
  // task reads it from this device's copy of the model's folder).
  if (!c.task.base_digest().empty() && !BaseFromFolder(c.task, m.spec) && base_digest != c.task.base_digest()) {
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                                                  c.task.base_digest(), 600, &emulator));
    base = ParameterSet();
    base_digest.clear();
    ASSIGN_OR_RETURN(base, ParameterSet::Decode(bytes));
    base_digest = c.task.base_digest();
  }
  if (m.spec.quantize.empty() != c.task.quantized_base_digest().empty()) {
    return absl::InvalidArgumentError("a quantized model needs its quantized base, and only it");
  }
  if (!c.task.quantized_base_digest().empty() && quantized_digest != c.task.quantized_base_digest()) {
    quantized_base = {};  // its bytes are freed before the next arrive
    quantized_digest.clear();
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                                                  c.task.quantized_base_digest(), 600, &emulator));
    ASSIGN_OR_RETURN(quantized_base, QuantizedSet::Parse(std::make_shared<const std::string>(std::move(bytes)),
                                                         m.spec.quantize));
    quantized_digest = c.task.quantized_base_digest();
  }
  return m;
}

StatusOr<std::vector<std::string>> Client::Impl::SetTaskModel(const TaskCall& c, TaskModel& m) {
  const v1::Task& task = c.task;
  ParameterSet& global = m.global;
  RETURN_IF_ERROR(BuildModel(task, m.spec));
  // A model with a frozen base: its frozen tensors are the base's values (held once);
  // the blob, and `global`, hold the rest.
  if (!task.base_digest().empty()) {
    RETURN_IF_ERROR(model->LoadBase(base));
  } else if (!model->FrozenTensors().empty()) {
    return absl::InvalidArgumentError("a model with frozen tensors needs its base (Task.base_digest)");
  }
  if (ScriptedLoss(m.loss) && loss_digest != task.train().loss_digest()) {
    ASSIGN_OR_RETURN(std::string archive,
                     FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                               task.train().loss_digest(), 600, &emulator));
    RETURN_IF_ERROR(model->SetTorchScriptLoss(archive));
    loss_digest = task.train().loss_digest();
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
    ParameterSet whole = model->Parameters();
    for (const Tensor& t : whole.tensors()) {
      if (kind.private_tensor(t.name)) personal_names.push_back(t.name);
    }
    RETURN_IF_ERROR(Overwrite(global, &whole));
    global = std::move(whole);
  }
  if (personal.size() == 0 && !personal_names.empty() && !PersonalFile().empty()) {
    personal = LoadPersonal(PersonalFile(), PersonalKey(task), personal_names, global);
  }
  if (personal.size() > 0) RETURN_IF_ERROR(Overwrite(personal, &global));
  RETURN_IF_ERROR(model->SetTrainedParameters(global));
  if (!task.quantized_base_digest().empty()) RETURN_IF_ERROR(model->LoadQuantized(quantized_base));
  return personal_names;
}

Status Client::Impl::BuildModel(const v1::Task& task, const ModelSpec& spec) {
  const std::string key = task.model().DebugString();
  if (model && key == model_key) return absl::OkStatus();
  ASSIGN_OR_RETURN(model, Model::Create(spec));
  // Personal layers of another description do not fit (a model dropped after its last
  // task, with task slots, is rebuilt to the same one).
  if (key != model_key) personal = ParameterSet();
  model_key = key;
  loss_digest.clear();
  return absl::OkStatus();
}

Status Client::Impl::CheckMemory(const v1::Task& task, const ModelSpec& spec, const FitSettings& fit) {
  if (opts.memory_limit_bytes <= 0) return absl::OkStatus();
  const std::string key = absl::StrCat(task.model().SerializeAsString(), "|", fit.batch_size, "|", fit.optimizer,
                                       "|", fit.momentum, "|", fit.recompute);
  if (key != memory_key) {
    std::vector<int64_t> sample = opts.train.shape;
    if (opts.train.type == ExampleType::kToken) sample = {opts.train.shape[0] - 1};
    ASSIGN_OR_RETURN(const TrainingCost cost, WholeModelCost(spec, sample, fit, 1));
    memory_need = cost.memory_bytes;
    memory_key = key;
  }
  const int64_t held = opts.count_resident ? ResidentBytes() : 0;
  if (held + memory_need > opts.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "training this model (batch %d, %s) needs about %d MiB beside the %d MiB this client holds, "
        "over its --memory-limit-mb %d",
        fit.batch_size, fit.optimizer, memory_need >> 20, held >> 20, opts.memory_limit_bytes >> 20));
  }
  return absl::OkStatus();
}

}  // namespace cleave
