// QLoRA on a device: the memory a split device's part of a SmolLM2-135M-shaped model
// (llama; 30 layers, width 576, 9 heads / 3 key-value heads, FFN 1536, tied; random
// weights written by tests/models/llama_reference.py, since no hub is reachable) takes
// with a float32, int8 and NF4 frozen base, and what fine-tuning with a quantized base
// costs in perplexity.
//
//   bench_qlora memory [CUT [STEPS]]   (default 9 4) each base at cut 1 (the embedding
//       only) and at CUT, each in a fresh process that loads the part the way a split
//       client does (its frozen tensors from a base blob, its quantized weights from the
//       quantized blob, shared) and trains STEPS micro-batches of 1 x 64 tokens with the
//       server's side replaced by a random gradient. Prints peak RSS and what the blocks
//       [1, CUT) add over cut 1, and the ratio to float32.
//   bench_qlora profile [BATCH [THREADS]]  (default 4 1) each base's forward and backward
//       time per batch of the whole model and of its blocks, as the cut policy profiles it.
//   bench_qlora load [CUT]             (default 9) a device reading its part [0, CUT) from
//       the folder itself (ModelPart::LoadHfFolder: straight into the part's tensors),
//       from an F32 file and from BF16 shards, each in a fresh process, beside reading it
//       into a parameter set first (LoadHfWeights, then LoadFrom). Prints what the part
//       holds and the peak while loading, above the process's resident memory before.
//   bench_qlora perplexity [STEPS]     (default 60) the same blocks, 6 of them and a byte
//       vocabulary, LoRA-fine-tuned on fortunes for STEPS batches of 4 x 64 with each
//       base, from the same random start; the held-out perplexity of each and the ratio.
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compression/quantized_set.h"
#include "core/files.h"
#include "core/memory.h"
#include "data/dataset.h"
#include "models/hf_folder.h"
#include "models/model.h"
#include "models/part.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

const std::vector<std::pair<std::string, std::string>> kBases = {
    {"fp32", ""}, {"int8", "int8:channel"}, {"nf4", "nf4"}};

// The SmolLM2-shaped folder (F32 in one file, or `shards` files of BF16).
std::string Folder(const std::string& dtype = "F32", int shards = 1) {
  const std::string dir =
      (fs::temp_directory_path() / (dtype == "F32" ? "cleave_bench_smol" : "cleave_bench_smol_" + dtype)).string();
  const std::string script = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR + "/tests/models/llama_reference.py";
  const bool there = fs::exists(dir + "/config.json");
  if (!there && std::system(absl::StrCat(script, " make ", dir, " smol ", dtype, " ", shards, " 7").c_str()) != 0) {
    std::cerr << "could not write " << dir << "\n";
    std::exit(1);
  }
  return dir;
}

StatusOr<ModelSpec> SpecOf(const std::string& dir, const std::string& quantize, int64_t context) {
  ModelSpec spec;
  spec.seed = 1;
  spec.lora.rank = 8;
  spec.quantize = quantize;
  ASSIGN_OR_RETURN(std::string config, ReadHfConfig(dir));
  RETURN_IF_ERROR(SetHfModel(spec, std::move(config), dir + "/config.json"));
  spec.gpt.context = context;
  return spec;
}

// The blobs a server sends a device cut at `cut`: the part's frozen float32 tensors and
// its quantized weights, written to files.
Status WriteBlobs(const std::string& dir, const std::string& quantize, int cut, const std::string& out) {
  ASSIGN_OR_RETURN(ModelSpec spec, SpecOf(dir, quantize, 64));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelPart> part, ModelPart::Create(spec, 0, cut));
  ParameterSet layout = part->Parameters();
  ParameterSet frozen;
  for (const Tensor& t : layout.tensors()) {
    if (t.name.find(".lora_") == std::string::npos) RETURN_IF_ERROR(frozen.Add(t));
  }
  ASSIGN_OR_RETURN(ParameterSet base, LoadHfWeights(dir, frozen, spec.gpt.layers));
  RETURN_IF_ERROR(WriteFileAtomic(out + ".base", base.Encode()));
  QuantizedSet q;
  q.spec = quantize;
  if (!part->QuantizedBase().empty()) {
    ASSIGN_OR_RETURN(q, LoadHfQuantized(dir, part->QuantizedBase(), spec.gpt.layers));
  }
  return WriteFileAtomic(out + ".quantized", q.Encode());
}

// A device: loads its part as the split client does (keeping what it keeps: the decoded
// base, whose values the part's frozen tensors are; the quantized blob) and trains
// `steps` micro-batches.
int Device(const std::string& dir, const std::string& quantize, int cut, int steps, const std::string& blobs) {
  SetTorchThreads(1);
  auto spec = SpecOf(dir, quantize, 64);
  if (!spec.ok()) return 1;
  // The base is received and decoded (the bytes then freed) before the part is built,
  // and kept, as the client keeps it to load later rounds' parts.
  ParameterSet base;
  {
    auto base_bytes = ReadFile(blobs + ".base");
    if (!base_bytes.ok()) return 1;
    auto decoded = ParameterSet::Decode(*base_bytes);
    if (!decoded.ok()) return 1;
    base = *std::move(decoded);
  }
  auto part = ModelPart::Create(*spec, 0, cut);
  if (!part.ok()) {
    std::cerr << part.status() << "\n";
    return 1;
  }
  if (!(*part)->LoadBase(base).ok()) return 1;
  QuantizedSet q;  // held as received, as the client holds it
  if (!quantize.empty()) {
    auto bytes = ReadFile(blobs + ".quantized");
    auto parsed = QuantizedSet::Parse(std::make_shared<const std::string>(std::move(*bytes)), quantize);
    if (!parsed.ok() || !(*part)->LoadQuantized(*parsed).ok()) return 1;
    q = *std::move(parsed);
  }
  const int64_t loaded_kb = ResidentBytes() >> 10;
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-3;
  if (!(*part)->ResetOptimizer(o).ok()) return 1;
  std::mt19937 rng(3);
  Activations in;
  in.shape = {1, 64};
  for (int i = 0; i < 64; ++i) in.values.push_back(static_cast<float>(rng() % 256));
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    auto out = (*part)->Forward(s, in);
    if (!out.ok()) {
      std::cerr << out.status() << "\n";
      return 1;
    }
    Activations grad;
    grad.shape = out->shape;
    std::normal_distribution<float> d(0, 1e-3f);
    for (size_t i = 0; i < out->values.size(); ++i) grad.values.push_back(d(rng));
    if (!(*part)->Backward(s, grad).ok()) return 1;
  }
  const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
  malloc_trim(0);  // what the process holds, not what the allocator keeps for later
  std::cout << (PeakResidentBytes() >> 10) << " " << loaded_kb << " " << ms << " " << q.payload_bytes() << " "
            << (ResidentBytes() >> 10) << "\n";
  return 0;
}

struct DeviceResult {
  double peak_mib = 0, loaded_mib = 0, ms = 0, quantized_mib = 0, trained_mib = 0;
};

DeviceResult RunDevice(const char* self, const std::string& dir, const std::string& quantize, int cut, int steps) {
  const std::string blobs = (fs::temp_directory_path() / absl::StrCat("cleave_bench_qlora_", cut, quantize)).string();
  if (Status s = WriteBlobs(dir, quantize, cut, blobs); !s.ok()) {
    std::cerr << s << "\n";
    std::exit(1);
  }
  const std::string cmd = absl::StrCat(self, " device ", dir, " '", quantize, "' ", cut, " ", steps, " ", blobs);
  FILE* pipe = popen(cmd.c_str(), "r");
  DeviceResult r;
  int64_t peak = 0, loaded = 0, qbytes = 0, trained = 0;
  if (pipe == nullptr || std::fscanf(pipe, "%ld %ld %lf %ld %ld", &peak, &loaded, &r.ms, &qbytes, &trained) != 5 ||
      pclose(pipe) != 0) {
    std::cerr << "the device failed: " << cmd << "\n";
    std::exit(1);
  }
  fs::remove(blobs + ".base");
  fs::remove(blobs + ".quantized");
  r.peak_mib = peak / 1024.0;
  r.loaded_mib = loaded / 1024.0;
  r.quantized_mib = qbytes / 1048576.0;
  r.trained_mib = trained / 1024.0;
  return r;
}

int Memory(const char* self, int cut, int steps) {
  const std::string dir = Folder();
  std::cout << "SmolLM2-135M shape, LoRA rank 8 on all seven projections, adamw, 1 x 64 tokens, one thread.\n"
            << "Held: RSS after loading the part and training (the loading's temporaries freed, malloc_trim);\n"
            << "peak: the process's high-water mark, loading included. Blocks 1.." << cut - 1 << ": cut " << cut << " less cut 1.\n\n"
            << "| base | held, cut 1 (MiB) | held, cut " << cut << " | blocks held | vs fp32 | peak, cut 1 | peak, cut "
            << cut << " | blocks at peak | vs fp32 | quantized weights (MiB) | ms / step |\n"
            << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  double fp32_held = 0, fp32_peak = 0;
  for (const auto& [name, codec] : kBases) {
    const DeviceResult one = RunDevice(self, dir, codec, 1, steps), at = RunDevice(self, dir, codec, cut, steps);
    const double held = at.trained_mib - one.trained_mib, peak = at.peak_mib - one.peak_mib;
    if (codec.empty()) {
      fp32_held = held;
      fp32_peak = peak;
    }
    std::cout << absl::StrFormat("| %s | %.1f | %.1f | %.1f | %.2fx | %.1f | %.1f | %.1f | %.2fx | %.1f | %.0f |\n", name,
                                 one.trained_mib, at.trained_mib, held, held / fp32_held, one.peak_mib, at.peak_mib, peak,
                                 peak / fp32_peak, at.quantized_mib, at.ms);
  }
  return 0;
}

// What the cut policy sees: each base's forward and backward time per stage of the whole
// model (ProfileStages), summed, and the part the blocks take.
int Profile(int batch, int threads) {
  const std::string dir = Folder();
  SetTorchThreads(threads);
  std::cout << "SmolLM2-135M shape, LoRA rank 8, " << batch << " x 64 tokens, " << threads
            << " thread(s): forward + backward per batch (ProfileStages)\n\n| base | whole model (ms) | blocks (ms) | vs fp32 |\n| --- | --- | --- | --- |\n";
  double fp32 = 0;
  for (const auto& [name, codec] : kBases) {
    auto spec = SpecOf(dir, codec, 64);
    if (!spec.ok()) return 1;
    auto profile = ProfileStages(*spec, {64}, batch, 2);
    if (!profile.ok()) {
      std::cerr << profile.status() << "\n";
      return 1;
    }
    double whole = 0, blocks = 0;
    for (size_t i = 0; i < profile->size(); ++i) {
      whole += (*profile)[i].seconds;
      if (i > 0 && i + 1 < profile->size()) blocks += (*profile)[i].seconds;
    }
    if (codec.empty()) fp32 = blocks;
    std::cout << absl::StrFormat("| %s | %.0f | %.0f | %.2fx |\n", name, 1e3 * whole, 1e3 * blocks, blocks / fp32);
  }
  return 0;
}

// A device loading its part [0, cut) of the fp32 model with LoRA from `dir`, `into` the
// part's tensors or through a parameter set. Prints the resident KiB before, after (the
// temporaries freed) and at the peak, and the part's tensors' KiB.
int LoadChild(const std::string& dir, int cut, bool into) {
  SetTorchThreads(1);
  auto spec = SpecOf(dir, "", 64);
  if (!spec.ok()) return 1;
  malloc_trim(0);
  const int64_t before = ResidentBytes();
  auto part = ModelPart::Create(*spec, 0, cut);
  if (!part.ok()) return 1;
  Status s;
  if (into) {
    s = (*part)->LoadHfFolder(dir);
  } else {
    auto weights = LoadHfWeights(dir, (*part)->Parameters(), spec->gpt.layers);
    s = weights.ok() ? (*part)->LoadFrom(*weights) : weights.status();
  }
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  malloc_trim(0);
  const int64_t held = ResidentBytes(), peak = PeakResidentBytes();
  const int64_t tensors = 4 * (*part)->Parameters().total_elements();  // a copy: after the peak is read
  std::cout << (before >> 10) << " " << (held >> 10) << " " << (peak >> 10) << " " << (tensors >> 10) << "\n";
  return 0;
}

int Load(const char* self, int cut) {
  std::cout << "SmolLM2-135M shape, fp32 with LoRA rank 8, a device's part [0, " << cut
            << "): resident memory above the process's before loading (MiB)\n\n"
            << "| folder | how | the part's tensors | held after | peak while loading | peak / held |\n"
            << "| --- | --- | --- | --- | --- | --- |\n";
  for (const auto& [dtype, shards] : std::vector<std::pair<std::string, int>>{{"F32", 1}, {"BF16", 3}}) {
    const std::string dir = Folder(dtype, shards);
    for (const bool into : {true, false}) {
      const std::string cmd = absl::StrCat(self, " loadchild ", dir, " ", cut, " ", into ? 1 : 0);
      FILE* pipe = popen(cmd.c_str(), "r");
      int64_t before = 0, held = 0, peak = 0, tensors = 0;
      if (pipe == nullptr || std::fscanf(pipe, "%ld %ld %ld %ld", &before, &held, &peak, &tensors) != 4 ||
          pclose(pipe) != 0) {
        std::cerr << "the device failed: " << cmd << "\n";
        return 1;
      }
      std::cout << absl::StrFormat("| %s%s | %s | %.1f | %.1f | %.1f | %.2fx |\n", dtype,
                                   shards > 1 ? absl::StrCat(", ", shards, " shards") : "",
                                   into ? "into the part (LoadHfFolder)" : "a parameter set, then LoadFrom",
                                   tensors / 1024.0, (held - before) / 1024.0, (peak - before) / 1024.0,
                                   static_cast<double>(peak - before) / (held - before));
    }
  }
  return 0;
}

int Perplexity(int steps) {
  const std::string dir = (fs::temp_directory_path() / "cleave_bench_smol6").string();
  const std::string script = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR + "/tests/models/llama_reference.py";
  if (!fs::exists(dir + "/model.safetensors") &&
      std::system((script + " make " + dir + " smol6 F32 1 7").c_str()) != 0) {
    std::cerr << "could not write " << dir << "\n";
    return 1;
  }
  SetTorchThreads(2);
  auto data = LoadDataSpec("text:/usr/share/games/fortunes,context=64,tokenizer=byte", true);
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=64,tokenizer=byte", false);
  if (!data.ok() || !test.ok()) {
    std::cerr << "fortunes: " << data.status() << "\n";
    return 1;
  }
  std::vector<int64_t> held(512);
  for (int i = 0; i < 512; ++i) held[i] = i * (test->size / 512);
  const Dataset eval = test->Subset(held);
  std::cout << "SmolLM2 blocks (width 576, 9 / 3 heads, FFN 1536), 6 layers, bytes, LoRA rank 8, adamw 2e-3, "
            << steps << " batches of 4 x 64 tokens of fortunes, 2 threads\n\n"
            << "| base | perplexity before | after | vs fp32 | s / step |\n| --- | --- | --- | --- | --- |\n";
  double fp32 = 0;
  for (const auto& [name, codec] : kBases) {
    auto spec = SpecOf(dir, codec, 64);
    if (!spec.ok()) return 1;
    auto model = Model::Create(*spec);
    if (!model.ok()) return 1;
    auto weights = LoadHfWeights(dir, (*model)->Parameters(), spec->gpt.layers);
    if (!weights.ok() || !(*model)->SetParameters(*weights).ok()) return 1;
    if (!codec.empty()) {
      auto q = LoadHfQuantized(dir, (*model)->QuantizedBase(), spec->gpt.layers);
      if (!q.ok() || !(*model)->LoadQuantized(*q).ok()) return 1;
    }
    auto before = (*model)->Evaluate(eval, 32);
    LocalTrainOptions o;
    o.optimizer = "adamw";
    o.lr = 2e-3;
    o.batch_size = 4;
    o.local_steps = steps;
    o.seed = 1;
    auto trained = (*model)->Train(*data, o);
    auto after = (*model)->Evaluate(eval, 32);
    if (!before.ok() || !trained.ok() || !after.ok()) {
      std::cerr << trained.status() << "\n";
      return 1;
    }
    const double ppl = after->metrics.at("perplexity");
    if (codec.empty()) fp32 = ppl;
    std::cout << absl::StrFormat("| %s | %.3f | %.3f | %.4fx | %.2f |\n", name, before->metrics.at("perplexity"), ppl,
                                 ppl / fp32, trained->seconds / steps);
  }
  return 0;
}

}  // namespace
}  // namespace cleave

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "memory";
  if (mode == "device" && argc == 7) {
    return cleave::Device(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]), argv[6]);
  }
  if (mode == "loadchild" && argc == 5) return cleave::LoadChild(argv[2], std::atoi(argv[3]), std::atoi(argv[4]) != 0);
  if (mode == "load") return cleave::Load(argv[0], argc > 2 ? std::atoi(argv[2]) : 9);
  if (mode == "memory") return cleave::Memory(argv[0], argc > 2 ? std::atoi(argv[2]) : 9, argc > 3 ? std::atoi(argv[3]) : 4);
  if (mode == "perplexity") return cleave::Perplexity(argc > 2 ? std::atoi(argv[2]) : 60);
  if (mode == "profile") return cleave::Profile(argc > 2 ? std::atoi(argv[2]) : 4, argc > 3 ? std::atoi(argv[3]) : 1);
  std::cerr << "usage: bench_qlora memory [CUT [STEPS]] | load [CUT] | profile [BATCH [THREADS]] | perplexity [STEPS]\n";
  return 2;
}
