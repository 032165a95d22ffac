#include "tools/lm.h"

#include <filesystem>
#include <iostream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "aggregation/submodel.h"
#include "core/files.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "job/job.h"
#include "models/hf_folder.h"
#include "models/kinds.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "server/checkpoint.h"
#include "server/modes/width_driver.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

int Fail(const std::string& command, const Status& s, int code = 1) {
  std::cerr << "cleave " << command << ": " << s.message() << "\n";
  return code;
}

struct Loaded {
  JobConfig config;
  ModelSpec spec;
  std::unique_ptr<Model> model;
};

// A Hugging Face folder given as --checkpoint with no job config: model hf, its own
// weights, its context up to config.json's max_position_embeddings.
bool IsHfFolder(const ModelSource& src) {
  return src.run_dir.empty() && src.config.empty() && !src.checkpoint.empty() &&
         std::filesystem::is_regular_file(std::filesystem::path(src.checkpoint) / "config.json");
}

// The model a ModelSource names, built from its config and loaded with its weights.
StatusOr<Loaded> LoadModel(const ModelSource& src) {
  std::string config = src.config, checkpoint = src.checkpoint;
  if (!src.run_dir.empty()) {
    if (config.empty()) config = src.run_dir + "/config.yaml";
    if (checkpoint.empty()) checkpoint = src.run_dir + "/checkpoint.pb";
  }
  Loaded out;
  const bool folder = IsHfFolder(src);
  if (folder) {
    out.config.model.name = "hf";
    out.config.model.path = checkpoint;
    out.config.model.gpt.context = 65536;  // capped by config.json
    out.config.data.test.clear();
  } else if (config.empty() || checkpoint.empty()) {
    return absl::InvalidArgumentError(
        "give a run directory, --config and --checkpoint, or --checkpoint with a Hugging Face folder");
  } else {
    ASSIGN_OR_RETURN(out.config, LoadJob(config));
  }
  const ModelConfig& m = out.config.model;
  const ModelTraits kind = ModelTraitsOf(m.name);
  if (kind.has_private_tensors()) {
    return absl::FailedPreconditionError(
        "an interop run checkpoints its shared block only: each device keeps its own base, so no whole model "
        "exists here to load (the devices measure it: local.holdout, client_eval in metrics.jsonl)");
  }
  ModelSpec spec = ModelSpecOf(out.config.model, out.config.run.seed);
  if (kind.scripted) {
    ASSIGN_OR_RETURN(spec.torchscript, ReadFile(m.path));
  }
  if (kind.hf_folder) {
    ASSIGN_OR_RETURN(std::string hf_config, ReadHfConfig(m.path));
    RETURN_IF_ERROR(SetHfModel(spec, std::move(hf_config), m.path + "/config.json"));
    RETURN_IF_ERROR(CheckHfBeforeBuilding(m.path, spec.hf_config, m.weights.empty()));
  }
  ASSIGN_OR_RETURN(out.model, Model::Create(spec));
  // The model the run started from (its frozen base, for LoRA), then the trained tensors.
  ParameterSet weights = out.model->Parameters();
  if (kind.hf_folder && m.weights.empty()) {
    ASSIGN_OR_RETURN(weights, LoadHfWeights(m.path, weights, spec.gpt.layers));
  } else if (!m.weights.empty()) {
    ASSIGN_OR_RETURN(weights, LoadWeights(m.weights, m.name, weights));
  }
  if (folder) {
    // The folder's weights are the model's.
  } else if (absl::EndsWith(checkpoint, ".safetensors")) {
    ASSIGN_OR_RETURN(weights, LoadWeights(checkpoint, m.name, weights));
  } else {
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(checkpoint));
    auto ck = DecodeCheckpoint(bytes);
    if (!ck.ok()) return Status(ck.status().code(), absl::StrCat(checkpoint, ": ", ck.status().message()));
    // A LoRA run checkpoints its adapters only.
    const ParameterSet expected = Without(weights, out.model->FrozenTensors());
    Status fits = ck->global.SameLayout(expected) ? Overwrite(ck->global, &weights)
                                                   : absl::InvalidArgumentError("another layout");
    if (!fits.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(checkpoint, " does not hold the model ", config,
                                                     " describes: ", fits.message()));
    }
  }
  RETURN_IF_ERROR(out.model->SetParameters(weights));
  if (!spec.quantize.empty()) {  // the base as training saw it
    ASSIGN_OR_RETURN(QuantizedSet quantized, LoadHfQuantized(m.path, out.model->QuantizedBase(), spec.gpt.layers));
    RETURN_IF_ERROR(out.model->LoadQuantized(quantized));
  }
  out.spec = std::move(spec);
  return out;
}

// The tokenizer= option of a data spec, or "byte".
std::string TokenizerOf(const std::string& data_spec) {
  for (absl::string_view option : absl::StrSplit(data_spec, ',')) {
    if (absl::StartsWith(option, "tokenizer=")) return std::string(option.substr(10));
  }
  return "byte";
}

}  // namespace

int RunTokenizerTrain(const TokenizerTrainOptions& o) {
  std::vector<std::string> files;
  for (const std::string& input : o.inputs) {
    auto found = TextFilesUnder(input);
    if (!found.ok()) return Fail("tokenizer train", found.status(), 2);
    files.insert(files.end(), found->begin(), found->end());
  }
  if (Status s = TrainSentencePieceModel(files, o.vocab, o.type, o.out); !s.ok()) {
    return Fail("tokenizer train", s);
  }
  std::cout << "SentencePiece model of " << o.vocab << " pieces from " << files.size()
            << " files: " << o.out << ".model (use it as tokenizer=spm:" << o.out
            << ".model and model.gpt.vocab: " << o.vocab << ")\n";
  return 0;
}

int RunTokenizerEncode(const TokenizerCodecOptions& o) {
  auto tokenizer = Tokenizer::Create(o.tokenizer);
  if (!tokenizer.ok()) return Fail("tokenizer encode", tokenizer.status(), 2);
  auto ids = (*tokenizer)->EncodeText(o.text, o.special);
  if (!ids.ok()) return Fail("tokenizer encode", ids.status(), 2);
  std::cout << absl::StrJoin(*ids, " ") << "\n";
  return 0;
}

int RunTokenizerDecode(const TokenizerCodecOptions& o) {
  auto tokenizer = Tokenizer::Create(o.tokenizer);
  if (!tokenizer.ok()) return Fail("tokenizer decode", tokenizer.status(), 2);
  auto text = (*tokenizer)->Decode(o.ids);
  if (!text.ok()) return Fail("tokenizer decode", text.status(), 2);
  std::cout << *text << "\n";
  return 0;
}

int RunGenerate(const GenerateOptions& o) {
  auto loaded = LoadModel(o.model);
  if (!loaded.ok()) return Fail("generate", loaded.status(), 2);
  const std::string spec = !o.tokenizer.empty() ? o.tokenizer
                           : IsHfFolder(o.model) ? "hf:" + o.model.checkpoint
                                                 : TokenizerOf(loaded->config.local.data);
  auto tokenizer = Tokenizer::Create(spec);
  if (!tokenizer.ok()) return Fail("generate", tokenizer.status(), 2);
  // A Hugging Face model's embedding may have rows the tokenizer never uses (Qwen pads it).
  const int64_t vocab = loaded->spec.gpt.vocab, words = (*tokenizer)->vocab_size();
  if (ModelTraitsOf(loaded->spec.name).hf_folder ? words > vocab : words != vocab) {
    return Fail("generate",
                absl::InvalidArgumentError(absl::StrCat("the tokenizer ", spec, " has a vocabulary of ",
                                                        words, " but the model's is ", vocab)),
                2);
  }
  auto prompt = (*tokenizer)->Encode({o.prompt});
  if (!prompt.ok()) return Fail("generate", prompt.status());
  // Generation ends at the tokenizer's end-of-text token, when it has one.
  auto ids = loaded->model->Generate((*prompt)[0], o.tokens, o.temperature, o.top_k, o.seed, o.top_p,
                                     (*tokenizer)->eos_id());
  if (!ids.ok()) return Fail("generate", ids.status());
  auto text = (*tokenizer)->Decode(*ids);
  if (!text.ok()) return Fail("generate", text.status());
  std::cout << o.prompt << *text << "\n";
  return 0;
}

namespace {

// `cleave evaluate --by`: the name and test indices of each group (group) or of each of
// N clients of the natural partition (client:N); none without --by.
StatusOr<std::vector<std::pair<std::string, std::vector<int64_t>>>> EvaluationRows(const Dataset& data,
                                                                                  const std::string& by,
                                                                                  const std::string& spec) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> rows;
  if (by == "group" || absl::StartsWith(by, "client:")) {
    if (data.groups.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec, " has no groups (text files, folder ...,groups, csv ...,group=COLUMN have them)"));
    }
    if (by == "group") {
      rows.resize(data.group_names.size());
      for (size_t g = 0; g < rows.size(); ++g) rows[g].first = data.group_names[g];
      for (int64_t i = 0; i < data.size; ++i) rows[data.groups[i]].second.push_back(i);
    } else {
      int clients = 0;
      if (!absl::SimpleAtoi(by.substr(7), &clients) || clients < 1) {
        return absl::InvalidArgumentError("--by client:N needs N >= 1");
      }
      auto parts = PartitionDataset(data, "natural", clients, 0);
      if (!parts.ok()) return parts.status();
      for (int c = 0; c < clients; ++c) {
        std::set<int32_t> held;  // the groups the partition gave client c
        for (int64_t i : (*parts)[c]) held.insert(data.groups[i]);
        std::vector<std::string> names;
        for (int32_t g : held) names.push_back(data.group_names[g]);
        rows.emplace_back(absl::StrCat("client-", c, " (", absl::StrJoin(names, ", "), ")"),
                          (*parts)[c]);
      }
    }
  } else if (!by.empty()) {
    return absl::InvalidArgumentError("--by is group or client:N");
  }
  return rows;
}

}  // namespace

int RunEvaluate(const EvaluateOptions& o) {
  auto loaded = LoadModel(o.model);
  if (!loaded.ok()) return Fail("evaluate", loaded.status(), 2);
  const std::string spec = o.data.empty() ? loaded->config.data.test : o.data;
  if (spec.empty()) {
    return Fail("evaluate", absl::InvalidArgumentError("the config has no data.test: give --data"), 2);
  }
  auto data = LoadDataSpec(spec, /*train=*/false);
  if (!data.ok()) return Fail("evaluate", data.status(), 2);
  const std::string& loss = loaded->config.train.loss;
  if (o.width < 1) {  // the submodel a device of that width trains (HeteroFL's leading one)
    ModelSpec sub_spec = loaded->spec;
    sub_spec.width = o.width;
    auto sub = Model::Create(sub_spec);
    if (!sub.ok()) return Fail("evaluate", sub.status(), 2);
    const ParameterSet whole = loaded->model->Parameters();
    const ParameterSet layout = (*sub)->Parameters();
    auto kept = SubmodelKeptOf(loaded->spec, whole, layout, 0);
    if (!kept.ok()) return Fail("evaluate", kept.status(), 2);
    if (Status s = (*sub)->SetParameters(Gather(whole, layout, PositionsOf(whole, *kept))); !s.ok()) {
      return Fail("evaluate", s, 2);
    }
    loaded->model = *std::move(sub);
    loaded->spec = sub_spec;
  }
  if (Status s = CheckDataFitsModel(*data, loaded->spec, loss, spec); !s.ok()) {
    return Fail("evaluate", s, 2);
  }
  // The rows: the whole set, then each group or client with the indices it holds.
  auto rows = EvaluationRows(*data, o.by, spec);
  if (!rows.ok()) return Fail("evaluate", rows.status(), 2);
  std::vector<std::pair<std::string, EvalStats>> results;
  auto eval = [&](const std::string& name, const Dataset& d) -> Status {
    ASSIGN_OR_RETURN(EvalStats e, loaded->model->Evaluate(d, o.batch_size, loss));
    results.emplace_back(name, std::move(e));
    return absl::OkStatus();
  };
  if (Status s = eval("all", *data); !s.ok()) return Fail("evaluate", s);
  for (const auto& [name, indices] : *rows) {
    if (indices.empty()) continue;  // a group with no test part
    if (Status s = eval(name, data->Subset(indices)); !s.ok()) return Fail("evaluate", s);
  }
  std::vector<std::string> keys;  // the task's metrics, as the first row has them
  for (const auto& [k, v] : results[0].second.metrics) {
    if (k != "tokens") keys.push_back(k);
  }
  std::cout << "| " << (o.by.empty() ? "data" : o.by == "group" ? "group" : "client")
            << " | examples | loss | accuracy";
  for (const auto& k : keys) std::cout << " | " << k;
  std::cout << " |\n| --- | --- | --- | ---";
  for (size_t i = 0; i < keys.size(); ++i) std::cout << " | ---";
  std::cout << " |\n";
  for (const auto& [name, e] : results) {
    std::cout << "| " << name << " | " << e.examples << " | " << absl::StrFormat("%.4f", e.loss)
              << " | " << absl::StrFormat("%.4f", e.accuracy);
    for (const auto& k : keys) {
      auto it = e.metrics.find(k);
      std::cout << " | " << (it == e.metrics.end() ? "" : absl::StrFormat("%.4f", it->second));
    }
    std::cout << " |\n";
  }
  return 0;
}

namespace {

// A Hugging Face folder of the model: config.json, model.safetensors and the source
// folder's tokenizer files.
int ExportHfFolder(const Loaded& loaded, const ParameterSet& params, const std::string& out) {
  namespace fs = std::filesystem;
  if (Status s = WriteHfFolder(out, loaded.spec.hf_config, params, loaded.spec.gpt.layers); !s.ok()) {
    return Fail("export", s);
  }
  int copied = 0;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"}) {
    const fs::path from = fs::path(loaded.config.model.path) / file;
    std::error_code ec;
    if (fs::exists(from) && fs::copy_file(from, fs::path(out) / file, fs::copy_options::overwrite_existing, ec)) ++copied;
  }
  std::cout << params.size() << " tensors (" << params.total_elements() << " values) in " << out
            << "/model.safetensors with config.json and " << copied << " tokenizer files"
            << (loaded.config.model.lora.enabled() ? ", LoRA adapters merged" : "") << "\n";
  return 0;
}

}  // namespace

int RunExport(const ExportOptions& o) {
  auto loaded = LoadModel(o.model);
  if (!loaded.ok()) return Fail("export", loaded.status(), 2);
  ParameterSet params = loaded->model->Parameters();
  // A quantized base is exported as the float32 weights it holds (what training saw).
  auto base = DequantizeSet(loaded->model->QuantizedBase());
  if (!base.ok()) return Fail("export", base.status());
  for (Tensor& t : base->mutable_tensors()) {
    if (Status s = params.Add(std::move(t)); !s.ok()) return Fail("export", s);
  }
  const LoraConfig& lora = loaded->config.model.lora;
  if (lora.enabled()) params = MergeLora(params, lora.alpha / lora.rank);  // a plain GPT-2
  if (ModelTraitsOf(loaded->spec.name).hf_folder) return ExportHfFolder(*loaded, params, o.out);
  const bool gpt = ModelTraitsOf(loaded->config.model.name).gpt2;
  if (gpt) params = ToGpt2Layout(params);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"producer", "cleave"}, {"model", loaded->config.model.name}};
  if (Status s = WriteFileAtomic(o.out, SerializeSafetensors(params, metadata)); !s.ok()) {
    return Fail("export", s);
  }
  std::cout << params.size() << " tensors (" << params.total_elements() << " values) in " << o.out
            << (gpt ? " in GPT-2's layout" : "") << (lora.enabled() ? ", LoRA adapters merged" : "")
            << "\n";
  return 0;
}

}  // namespace cleave
