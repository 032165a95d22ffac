#include "models/hf_folder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "core/json.h"
#include "core/memory.h"
#include "models/hf_config.h"
#include "models/safetensors.h"

namespace cleave {
namespace {

using Json = nlohmann::json;

// The largest config.json or shard index read (a 405B model's index is under 200 KB).
constexpr int64_t kMaxHfJsonBytes = int64_t{16} << 20;

// A read-only private mapping of a whole file.
class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      ::close(fd);
      return absl::DataLossError(absl::StrCat(path, ": empty or unreadable"));
    }
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map ", path));
    return std::unique_ptr<MappedFile>(new MappedFile(static_cast<const char*>(p), st.st_size));
  }
  ~MappedFile() { ::munmap(const_cast<char*>(data_), size_); }
  std::string_view bytes() const { return {data_, size_}; }
  // Drops the pages wholly inside [p, p + n) from memory (they are re-read if touched).
  void Release(const char* p, size_t n) const {
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }

 private:
  MappedFile(const char* data, size_t size) : data_(data), size_(size) {}
  const char* data_;
  size_t size_;
};

// Which file of DIR holds each of `names`: model.safetensors, or the shard the index
// names. Shard names must be plain file names in DIR.
StatusOr<std::map<std::string, std::vector<std::string>>> FilesOf(const std::string& dir,
                                                                  const std::vector<std::string>& names) {
  namespace fs = std::filesystem;
  std::map<std::string, std::vector<std::string>> files;
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  if (!fs::exists(index_path)) {
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    if (!fs::exists(single)) {
      return absl::NotFoundError(absl::StrCat(dir, ": neither model.safetensors nor ",
                                              "model.safetensors.index.json is there"));
    }
    files[single] = names;
    return files;
  }
  ASSIGN_OR_RETURN(std::string text, ReadBoundedFile(index_path, kMaxHfJsonBytes));
  ASSIGN_OR_RETURN(const Json index, ParseJsonObject(text, index_path));
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map must be an object"));
  }
  const Json& map = index["weight_map"];
  for (const std::string& name : names) {
    if (!map.contains(name) || !map[name].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": no shard holds tensor ", name));
    }
    const std::string shard = map[name].get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor ", name, "'s shard '", shard, "' is not a file name"));
    }
    files[(fs::path(dir) / shard).string()].push_back(name);
  }
  return files;
}

// Every value of `targets` finite: NaN or infinite weights are a broken folder.
Status CheckFinite(const std::vector<HfTarget>& targets, const std::string& dir) {
  for (const HfTarget& t : targets) {
    const int64_t n = NumElements(t.shape);
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(t.values[i])) {
        return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor ", t.name,
                                                       " holds ", t.values[i], " at element ", i));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::string> ReadHfConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(path)) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read it (model.path must be a Hugging Face folder)"));
  }
  return ReadBoundedFile(path, kMaxHfJsonBytes);
}

Status CheckHfFolder(const std::string& dir, const std::string& config_json) {
  ASSIGN_OR_RETURN(const DecoderConfig c, ParseHfConfig(config_json, dir + "/config.json"));
  std::map<std::string, std::vector<int64_t>> wanted;
  std::vector<std::string> names;
  for (HfTensorShape& t : HfTensorShapes(c)) {
    names.push_back(t.name);
    wanted[t.name] = std::move(t.shape);
  }
  ASSIGN_OR_RETURN(auto files, FilesOf(dir, names));
  for (const auto& [path, in_file] : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
    ASSIGN_OR_RETURN(const std::vector<SafetensorsEntry> entries, SafetensorsEntries(file->bytes(), path));
    std::map<std::string, const SafetensorsEntry*> held;
    for (const SafetensorsEntry& e : entries) held[e.name] = &e;
    for (const std::string& name : in_file) {
      auto it = held.find(name);
      if (it == held.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is missing (config.json's ",
                                                       c.model_type, " has it)"));
      }
      if (it->second->shape != wanted[name]) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is ",
                                                       absl::StrJoin(it->second->shape, "x"), ", config.json's is ",
                                                       absl::StrJoin(wanted[name], "x")));
      }
    }
  }
  return absl::OkStatus();
}

Status CheckHfModelFits(const std::string& config_json, const std::string& what, int64_t budget_bytes,
                        const std::string& budget_name) {
  ASSIGN_OR_RETURN(const DecoderConfig c, ParseHfConfig(config_json, what));
  const int64_t bytes = HfModelBytes(c);
  if (bytes > budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": a ", c.model_type, " decoder of ", c.layers, " layers, width ", c.dim, " and ", c.vocab,
        " tokens holds ", bytes >> 20, " MiB of float32 weights, over ", budget_name, " (", budget_bytes >> 20,
        " MiB)"));
  }
  return absl::OkStatus();
}

Status SetHfModel(ModelSpec& spec, std::string config_json, const std::string& what) {
  ASSIGN_OR_RETURN(DecoderConfig c, ParseHfConfig(config_json, what));
  spec.name = "hf";
  spec.hf_config = std::move(config_json);
  spec.gpt.vocab = c.vocab;
  spec.gpt.context = spec.gpt.context > 0 ? std::min(spec.gpt.context, c.context) : c.context;
  spec.gpt.layers = c.layers;
  spec.gpt.heads = c.heads;
  spec.gpt.dim = c.dim;
  spec.gpt.tie = c.tie;
  return absl::OkStatus();
}

Status CheckHfBeforeBuilding(const std::string& dir, const std::string& config_json, bool weights_from_folder) {
  if (weights_from_folder) RETURN_IF_ERROR(CheckHfFolder(dir, config_json));
  return CheckHfModelFits(config_json, dir + "/config.json", MemoryCeilingBytes() / 2,
                          "half the memory this process may hold (the model, and a copy of its weights)");
}

std::string HfTensorName(const std::string& stage_name, int layers) {
  const size_t dot = stage_name.find('.');
  int stage = -1;
  if (dot == std::string::npos || !absl::SimpleAtoi(stage_name.substr(0, dot), &stage)) return "";
  const std::string rest = stage_name.substr(dot + 1);
  if (stage == 0) return "model." + rest;
  if (stage >= 1 && stage <= layers) return absl::StrCat("model.layers.", stage - 1, ".", rest);
  if (stage == layers + 1) return rest == "lm_head.weight" ? rest : "model." + rest;
  return "";
}

StatusOr<ParameterSet> LoadHfWeights(const std::string& dir, const ParameterSet& layout, int layers) {
  ParameterSet out = layout;  // LoRA adapters keep layout's values
  RETURN_IF_ERROR(LoadHfInto(dir, HfTargetsOf(out), layers));
  return out;
}

std::vector<HfTarget> HfTargetsOf(ParameterSet& set) {
  std::vector<HfTarget> targets;
  for (Tensor& t : set.mutable_tensors()) {
    if (!absl::StrContains(t.name, ".lora_")) targets.push_back({t.name, t.shape, t.values.data()});
  }
  return targets;
}

Status LoadHfInto(const std::string& dir, const std::vector<HfTarget>& targets, int layers) {
  std::map<std::string, const HfTarget*> wanted;  // by the folder's name
  std::vector<std::string> names;
  for (const HfTarget& t : targets) {
    const std::string hf = HfTensorName(t.name, layers);
    if (hf.empty() || absl::StrContains(t.name, ".lora_")) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is not a decoder's"));
    }
    wanted[hf] = &t;
    names.push_back(hf);
  }
  ASSIGN_OR_RETURN(auto files, FilesOf(dir, names));
  for (const auto& [path, in_file] : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
    std::set<std::string> missing(in_file.begin(), in_file.end());
    SafetensorsFilter filter;
    filter.wanted = [&missing](const std::string& name) { return missing.count(name) > 0; };
    filter.done = [&file](const char* p, size_t n) { file->Release(p, n); };
    filter.into = [&](const std::string& name, const std::vector<int64_t>& shape) -> StatusOr<float*> {
      const HfTarget& want = *wanted.at(name);
      if (shape != want.shape) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is ", absl::StrJoin(shape, "x"),
                                                       ", the model's is ", absl::StrJoin(want.shape, "x")));
      }
      missing.erase(name);
      return want.values;
    };
    RETURN_IF_ERROR(ParseSafetensors(file->bytes(), path, filter).status());
    if (!missing.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", *missing.begin(), " is missing"));
  }
  return CheckFinite(targets, dir);
}

StatusOr<QuantizedSet> LoadHfQuantized(const std::string& dir, const QuantizedSet& layout, int layers) {
  if (layout.empty()) return layout;
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeStatelessCodec(layout.spec, 0));
  if (codec == nullptr) return absl::InvalidArgumentError("a quantized base needs a codec");
  std::map<std::string, const QuantizedTensor*> wanted;  // by the folder's name
  std::vector<std::string> names;
  for (const QuantizedTensor& t : layout.tensors) {
    const std::string hf = HfTensorName(t.name, layers);
    if (hf.empty()) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is not a decoder's"));
    wanted[hf] = &t;
    names.push_back(hf);
  }
  ASSIGN_OR_RETURN(auto files, FilesOf(dir, names));
  std::map<std::string, QuantizedTensor> loaded;  // by stage name
  for (const auto& [path, in_file] : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
    // One tensor at a time: its float32 values exist only until they are quantized.
    for (const std::string& name : in_file) {
      SafetensorsFilter filter;
      filter.wanted = [&name](const std::string& n) { return n == name; };
      filter.done = [&file](const char* p, size_t n) { file->Release(p, n); };
      ASSIGN_OR_RETURN(ParameterSet got, ParseSafetensors(file->bytes(), path, filter));
      const QuantizedTensor& want = *wanted.at(name);
      if (got.size() != 1) return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is missing"));
      const Tensor& t = got.tensors()[0];
      if (t.shape != want.shape) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", name, " is ",
                                                       absl::StrJoin(t.shape, "x"), ", the model's is ",
                                                       absl::StrJoin(want.shape, "x")));
      }
      loaded[want.name] = QuantizeTensor(*codec, want.name, want.shape, t.values.data());
    }
  }
  QuantizedSet out;
  out.spec = layout.spec;
  for (const QuantizedTensor& t : layout.tensors) out.tensors.push_back(std::move(loaded.at(t.name)));
  return out;
}

Status WriteHfFolder(const std::string& dir, const std::string& config_json,
                     const ParameterSet& model, int layers) {
  ParameterSet named;
  for (const Tensor& t : model.tensors()) {
    if (absl::StrContains(t.name, ".lora_")) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": merge the LoRA adapters first"));
    }
    Tensor copy = t;
    copy.name = HfTensorName(t.name, layers);
    if (copy.name.empty()) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " is not a decoder's"));
    RETURN_IF_ERROR(named.Add(std::move(copy)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  namespace fs = std::filesystem;
  RETURN_IF_ERROR(WriteFileAtomic((fs::path(dir) / "config.json").string(), config_json));
  return WriteFileAtomic((fs::path(dir) / "model.safetensors").string(),
                         SerializeSafetensors(named, {{"format", "pt"}}));
}

}  // namespace cleave
