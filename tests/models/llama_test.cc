// The Llama-family decoder (model.name: hf): its logits against transformers' definitions
// of llama, mistral, qwen2 and qwen3 written independently in float64 PyTorch
// (tests/models/llama_reference.py), on random tiny Hugging Face folders that script
// writes (F32 and BF16, one file and shards); malformed folders refused naming the file
// and the field; stages that compose; training that learns; LoRA on its projections.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "data/dataset.h"
#include "models/hf_config.h"
#include "models/hf_folder.h"
#include "models/model.h"
#include "models/part.h"
#include "models/safetensors.h"
#include "tests/memory_cap.h"
#include "tests/models/token_data.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

std::string Temp(const std::string& name) { return (fs::temp_directory_path() / name).string(); }

int Python(const std::string& args) {
  const std::string cmd = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR +
                          "/tests/models/llama_reference.py " + args;
  return std::system(cmd.c_str());
}

// A random folder of `family` written by the reference script, named after the test (so
// that tests running at once do not share one).
std::string MakeFolder(const std::string& family, const std::string& dtype, int shards, int seed = 1) {
  const std::string dir = Temp(absl::StrCat("cleave_hf_", ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                            "_", family, "_", dtype, "_", shards));
  fs::remove_all(dir);
  EXPECT_EQ(Python(absl::StrCat("make ", dir, " ", family, " ", dtype, " ", shards, " ", seed)), 0);
  return dir;
}

StatusOr<ModelSpec> SpecOf(const std::string& dir, const LoraConfig& lora = {}) {
  ModelSpec spec;
  spec.seed = 3;
  spec.lora = lora;
  ASSIGN_OR_RETURN(std::string config, ReadHfConfig(dir));
  RETURN_IF_ERROR(SetHfModel(spec, std::move(config), dir + "/config.json"));
  return spec;
}

// The folder's model: built from config.json, its weights loaded from the safetensors;
// CheckHfFolder first, as a server does: the shapes it expects are the model's.
StatusOr<std::unique_ptr<Model>> Load(const std::string& dir, const LoraConfig& lora = {}) {
  ASSIGN_OR_RETURN(ModelSpec spec, SpecOf(dir, lora));
  RETURN_IF_ERROR(CheckHfFolder(dir, spec.hf_config));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(spec));
  ASSIGN_OR_RETURN(ParameterSet weights, LoadHfWeights(dir, model->Parameters(), spec.gpt.layers));
  RETURN_IF_ERROR(model->SetParameters(weights));
  return model;
}

// The folder's model with its base quantized in `codec` (ModelSpec::quantize) and LoRA
// adapters, as the server loads it.
StatusOr<std::unique_ptr<Model>> LoadQuantized(const std::string& dir, const LoraConfig& lora,
                                               const std::string& codec) {
  ASSIGN_OR_RETURN(ModelSpec spec, SpecOf(dir, lora));
  spec.quantize = codec;
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(spec));
  ASSIGN_OR_RETURN(ParameterSet weights, LoadHfWeights(dir, model->Parameters(), spec.gpt.layers));
  RETURN_IF_ERROR(model->SetParameters(weights));
  ASSIGN_OR_RETURN(QuantizedSet q, LoadHfQuantized(dir, model->QuantizedBase(), spec.gpt.layers));
  RETURN_IF_ERROR(model->LoadQuantized(q));
  return model;
}

LoraConfig AllTargets(int rank, double dropout = 0) {
  LoraConfig lora;
  lora.rank = rank;
  lora.dropout = dropout;
  return lora;
}

// Each family's logits equal transformers' definition in float64 to 1e-4, from a folder
// in BF16 split over shards and from one in F32 (the folders made, and the reference's
// logits computed, in one run of the script each).
TEST(LlamaTest, LogitsEqualTheHuggingFaceDefinitionsInFloat64) {
  struct Case {
    std::string family;
    int vocab;
    std::string dtype;
    int shards;
    std::string dir;
  };
  std::vector<Case> cases;
  std::string make, forward;
  const int64_t batch = 2, t = 16;
  const std::vector<int32_t> ids = RandomIds(batch * t, 83, 11);  // below every vocabulary
  const std::vector<int64_t> ids64(ids.begin(), ids.end());
  const std::string tokens = Temp("cleave_hf_logits.i64");
  ASSERT_TRUE(WriteFileAtomic(tokens, std::string(reinterpret_cast<const char*>(ids64.data()), ids64.size() * 8)).ok());
  const std::vector<std::pair<std::string, int>> families = {{"llama", 97}, {"mistral", 101}, {"qwen2", 89}, {"qwen3", 83}};
  for (const auto& [family, vocab] : families) {
    for (const auto& [dtype, shards] : {std::pair<std::string, int>{"BF16", 3}, {"F32", 1}}) {
      Case c{family, vocab, dtype, shards, Temp(absl::StrCat("cleave_hf_logits_", family, "_", dtype))};
      fs::remove_all(c.dir);
      absl::StrAppend(&make, " ", c.dir, " ", family, " ", dtype, " ", shards, " 1");
      absl::StrAppend(&forward, " ", c.dir, " ", tokens, " ", batch, " ", t, " ", c.dir, ".logits");
      cases.push_back(c);
    }
  }
  ASSERT_EQ(Python("make" + make), 0);
  ASSERT_EQ(Python("forward" + forward), 0);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.family, " ", c.dtype, " in ", c.shards, " file(s)"));
    auto model = Load(c.dir);
    ASSERT_TRUE(model.ok()) << model.status();
    auto ref = ReadFile(c.dir + ".logits");
    ASSERT_TRUE(ref.ok());
    ASSERT_EQ(ref->size(), size_t(batch * t * c.vocab * 8));
    const double* expected = reinterpret_cast<const double*>(ref->data());
    double worst = 0;
    for (int64_t b = 0; b < batch; ++b) {
      auto logits = (*model)->Logits(std::vector<int32_t>(ids.begin() + b * t, ids.begin() + (b + 1) * t));
      ASSERT_TRUE(logits.ok()) << logits.status();
      for (int64_t i = 0; i < t * c.vocab; ++i) {
        worst = std::max(worst, std::abs(double((*logits)[i]) - expected[b * t * c.vocab + i]));
      }
    }
    EXPECT_LT(worst, 1e-4);
    fs::remove_all(c.dir);
    fs::remove(c.dir + ".logits");
  }
  fs::remove(tokens);
}

TEST(LlamaTest, ReadsConfigJsonAsTransformersDoes) {
  auto c = ParseHfConfig(R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
                             "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 100,
                             "eos_token_id": [7, 8]})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->kv_heads, 4);    // num_key_value_heads defaults to the heads
  EXPECT_EQ(c->head_dim, 128);  // Qwen3Config's default, not hidden / heads
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->eos_token_id, 7);
  auto q2 = ParseHfConfig(R"({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4})", "c");
  ASSERT_TRUE(q2.ok());
  EXPECT_TRUE(q2->qkv_bias);
  EXPECT_EQ(q2->head_dim, 16);
  auto m = ParseHfConfig(R"({"model_type": "mistral", "sliding_window": null})", "c");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->sliding_window, 0);
  // What it writes it reads back.
  auto again = ParseHfConfig(HfConfigJson(*c), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->head_dim, 128);
  EXPECT_EQ(again->vocab, 100);
  EXPECT_TRUE(again->qk_norm);
}

// Bad folders: each error names the file and the field or tensor.
TEST(LlamaTest, RefusesMalformedFolders) {
  auto expect_error = [](const Status& s, const std::string& needle) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  expect_error(ParseHfConfig(R"({"model_type": "gpt_neox"})", "x/config.json").status(),
               "x/config.json: model_type 'gpt_neox' is not supported");
  expect_error(ParseHfConfig(R"({"model_type": "llama", "hidden_act": "gelu"})", "c.json").status(),
               "c.json: hidden_act must be silu");
  expect_error(ParseHfConfig(R"({"model_type": "llama", "num_attention_heads": 6, "num_key_value_heads": 4})",
                             "c.json").status(),
               "num_key_value_heads");
  expect_error(ParseHfConfig(R"({"model_type": "llama", "hidden_size": "big"})", "c.json").status(),
               "c.json: hidden_size must be an integer");
  expect_error(ParseHfConfig(R"({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4}})",
                             "c.json").status(),
               "rope_scaling type 'yarn'");
  expect_error(ParseHfConfig("{not json", "c.json").status(), "c.json: not valid JSON");
  expect_error(ParseHfConfig("[1]", "c.json").status(), "c.json: not a JSON object");

  const std::string dir = MakeFolder("qwen3", "F32", 2);
  auto spec = SpecOf(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(*spec);
  ASSERT_TRUE(model.ok());
  const ParameterSet layout = (*model)->Parameters();
  // A shard that is not there.
  const std::string shard = dir + "/model-00002-of-00002.safetensors";
  fs::rename(shard, shard + ".away");
  expect_error(LoadHfWeights(dir, layout, 3).status(), "model-00002-of-00002.safetensors");
  fs::rename(shard + ".away", shard);
  // A tensor of another shape than config.json makes it.
  ParameterSet wrong = layout;
  for (Tensor& t : wrong.mutable_tensors()) {
    if (t.name == "1.self_attn.q_proj.weight") {
      t.shape = {t.shape[0] / 2, t.shape[1]};
      t.values.resize(t.numel());
    }
  }
  expect_error(LoadHfWeights(dir, wrong, 3).status(), "tensor model.layers.0.self_attn.q_proj.weight is");
  // The index names a tensor no shard holds.
  std::ofstream(dir + "/model.safetensors.index.json") << R"({"weight_map": {}})";
  expect_error(LoadHfWeights(dir, layout, 3).status(), "no shard holds tensor model.embed_tokens.weight");
  fs::remove_all(dir);
}

// config.json is data nobody vetted: what Python's json writes for a NaN, numbers past
// their type, and sizes that would wrap are refused naming the file and the key.
TEST(LlamaTest, RefusesConfigValuesPastTheirRange) {
  auto error = [](const std::string& text) {
    auto c = ParseHfConfig(text, "x/config.json");
    EXPECT_FALSE(c.ok()) << text;
    return std::string(c.status().message());
  };
  EXPECT_NE(error(R"({"model_type": "llama", "rope_theta": NaN})").find("NaN and Infinity are not JSON"),
            std::string::npos);
  EXPECT_NE(error(R"({"model_type": "llama", "rope_theta": Infinity})").find("x/config.json: not valid JSON"),
            std::string::npos);
  EXPECT_NE(error(R"({"model_type": "llama", "rope_theta": 1e999})").find("x/config.json: not valid JSON"),
            std::string::npos);
  for (const char* key : {"num_attention_heads", "num_hidden_layers"}) {
    EXPECT_NE(error(absl::StrCat(R"({"model_type": "llama", ")", key, R"(": 4294967300})")).find(
                  absl::StrCat(key, " must be an integer of 32 bits")),
              std::string::npos)
        << key;
  }
  EXPECT_NE(error(R"({"model_type": "llama", "vocab_size": 18446744073709551615})").find("vocab_size"),
            std::string::npos);
}

// A tiny folder whose config.json states a large model is refused from the headers of
// its safetensors, before anything is allocated (it peaked at 6.5 GB before), and a
// config.json past the memory this process may hold (`{"model_type": "llama"}` alone:
// Llama 2 7B's shape, 25 GiB) is refused naming its size; run in a child whose memory
// is capped, where an allocation would fail.
TEST(LlamaTest, ABigConfigOverATinyFolderIsRefusedBeforeAllocating) {
  const std::string dir = Temp("cleave_hf_tiny_folder");
  fs::remove_all(dir);
  fs::create_directories(dir);
  ParameterSet tiny;
  ASSERT_TRUE(tiny.Add({"model.embed_tokens.weight", {2, 2}, {1, 2, 3, 4}}).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/model.safetensors", SerializeSafetensors(tiny)).ok());
  const std::string big = R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
                              "num_hidden_layers": 2, "num_attention_heads": 32, "vocab_size": 32000})";
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", big).ok());
  const int64_t cap = int64_t{512} << 20;
  Status s = testing::UnderMemoryCap(cap, [&] { return CheckHfBeforeBuilding(dir, big, true); });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("tensor model.embed_tokens.weight is 2x2, config.json's is 32000x4096"),
            std::string::npos) << s;
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", R"({"model_type": "llama"})").ok());
  s = testing::UnderMemoryCap(cap, [&] { return CheckHfBeforeBuilding(dir, R"({"model_type": "llama"})", false); });
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("holds 25705 MiB of float32 weights"), std::string::npos) << s;
  // A device's own limit (--memory-limit-mb) refuses it the same way.
  s = CheckHfModelFits(big, "the server's config.json", int64_t{1024} << 20, "this device's --memory-limit-mb");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("over this device's --memory-limit-mb (1024 MiB)"), std::string::npos) << s;
  fs::remove_all(dir);
}

// Weights that are not finite are a broken folder, refused naming the tensor.
TEST(LlamaTest, RefusesNonFiniteWeights) {
  const std::string dir = Temp("cleave_hf_nan_folder");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string config = R"({"model_type": "qwen2", "hidden_size": 8, "intermediate_size": 16,
                                 "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10})";
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", config).ok());
  auto spec = SpecOf(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Create(*spec);
  ASSERT_TRUE(model.ok()) << model.status();
  ParameterSet weights = (*model)->Parameters();
  ASSERT_TRUE(WriteHfFolder(dir, config, weights, 1).ok());
  EXPECT_TRUE(CheckHfFolder(dir, config).ok());
  EXPECT_TRUE(LoadHfWeights(dir, weights, 1).ok());
  weights.mutable_tensors()[1].values[3] = std::nanf("");
  ASSERT_TRUE(WriteHfFolder(dir, config, weights, 1).ok());
  auto loaded = LoadHfWeights(dir, (*model)->Parameters(), 1);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find(absl::StrCat("tensor ", weights.tensors()[1].name, " holds nan")),
            std::string::npos) << loaded.status();
  fs::remove_all(dir);
}

// The stages are the embedding, each block and norm + head: cut anywhere, the parts
// compose to the whole model.
TEST(LlamaTest, StagesComposeToTheWholeModel) {
  const std::string dir = MakeFolder("llama", "F32", 1);
  auto model = Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_stages(), 2 + 2);  // embedding, two blocks, norm + head
  auto spec = SpecOf(dir);
  ASSERT_TRUE(spec.ok());
  const std::vector<int32_t> ids = RandomIds(17, 97, 5);
  const Dataset data = Sequences(ids, 17, 97);
  auto whole = (*model)->Logits(std::vector<int32_t>(ids.begin(), ids.end() - 1));
  ASSERT_TRUE(whole.ok());
  const ParameterSet all = (*model)->Parameters();
  for (int cut = 1; cut <= 3; ++cut) {
    auto front = ModelPart::Create(*spec, 0, cut);
    auto back = ModelPart::Create(*spec, cut, 4);
    ASSERT_TRUE(front.ok() && back.ok()) << cut;
    ASSERT_TRUE((*front)->LoadFrom(all).ok());
    ASSERT_TRUE((*back)->LoadFrom(all).ok());
    auto a = (*front)->Forward(1, InputBatch(data, {0}));
    ASSERT_TRUE(a.ok()) << a.status();
    auto logits = (*back)->Forward(1, *a);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->shape, (std::vector<int64_t>{1, 16, 97}));
    for (size_t i = 0; i < whole->size(); ++i) ASSERT_NEAR(logits->values[i], (*whole)[i], 1e-4) << cut;
  }
  fs::remove_all(dir);
}

// Generation keeps the keys and values: greedy tokens equal those of running the whole
// sequence at every step, for grouped-query attention with llama3 rope scaling and for
// Mistral's sliding window (shorter than the sequence); past the context the cache starts
// again as the window moves.
TEST(LlamaTest, GenerationWithTheKeyValueCacheEqualsTheFullForward) {
  for (const auto& [family, vocab] : std::vector<std::pair<std::string, int>>{{"llama", 97}, {"mistral", 101}}) {
    SCOPED_TRACE(family);
    const std::string dir = MakeFolder(family, "F32", 1);
    auto spec = SpecOf(dir);
    ASSERT_TRUE(spec.ok());
    spec->gpt.context = 24;  // the 6-token prompt and 30 new tokens run past it
    auto model = Model::Create(*spec);
    ASSERT_TRUE(model.ok()) << model.status();
    auto weights = LoadHfWeights(dir, (*model)->Parameters(), spec->gpt.layers);
    ASSERT_TRUE(weights.ok() && (*model)->SetParameters(*weights).ok());
    const std::vector<int32_t> prompt = RandomIds(6, vocab, 3);
    auto fast = (*model)->Generate(prompt, 30, /*temperature=*/0, 0, 1);
    ASSERT_TRUE(fast.ok()) << fast.status();
    std::vector<int32_t> ids = prompt, slow;
    for (int i = 0; i < 30; ++i) {
      const size_t start = ids.size() > 24 ? ids.size() - 24 : 0;
      auto logits = (*model)->Logits(std::vector<int32_t>(ids.begin() + start, ids.end()));
      ASSERT_TRUE(logits.ok());
      const float* last = logits->data() + logits->size() - vocab;
      const int32_t next = static_cast<int32_t>(std::max_element(last, last + vocab) - last);
      ids.push_back(next);
      slow.push_back(next);
    }
    EXPECT_EQ(*fast, slow);
    // Nucleus sampling with a tiny top_p keeps only the most likely token: greedy again.
    auto nucleus = (*model)->Generate(prompt, 30, /*temperature=*/1.0, 0, 9, /*top_p=*/1e-9);
    ASSERT_TRUE(nucleus.ok()) << nucleus.status();
    EXPECT_EQ(*nucleus, slow);
    // It stops after the end-of-sequence token: here the third greedy token.
    auto stopped = (*model)->Generate(prompt, 30, 0, 0, 1, 1.0, slow[2]);
    ASSERT_TRUE(stopped.ok());
    EXPECT_EQ(*stopped, std::vector<int32_t>(slow.begin(), slow.begin() + 3));
    fs::remove_all(dir);
  }
}

// Trained on a repeating pattern, its loss falls; with LoRA only the adapters move.
TEST(LlamaTest, LearnsAndLoraTrainsOnlyItsAdapters) {
  const std::string dir = MakeFolder("qwen2", "F32", 1);
  std::vector<int32_t> ids;
  for (int i = 0; i < 17 * 16; ++i) ids.push_back((i * 7) % 89);
  const Dataset data = Sequences(ids, 17, 89);
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 3e-3;
  o.batch_size = 8;
  o.local_steps = 30;
  auto model = Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  auto before = (*model)->Evaluate(data, 16);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE((*model)->Train(data, o).ok());
  auto after = (*model)->Evaluate(data, 16);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->loss, before->loss * 0.5) << before->loss;

  LoraConfig lora;
  lora.rank = 4;
  lora.targets = {"q_proj", "v_proj", "down_proj"};
  auto adapted = Load(dir, lora);
  ASSERT_TRUE(adapted.ok()) << adapted.status();
  const ParameterSet base = (*adapted)->Parameters();
  EXPECT_NE(base.Find("1.self_attn.q_proj.lora_A"), nullptr);
  EXPECT_NE(base.Find("2.mlp.down_proj.lora_B"), nullptr);
  EXPECT_EQ(base.Find("1.self_attn.k_proj.lora_A"), nullptr);
  ASSERT_TRUE((*adapted)->Train(data, o).ok());
  const ParameterSet trained = (*adapted)->Parameters();
  int moved = 0;
  for (const Tensor& t : base.tensors()) {
    const bool adapter = t.name.find(".lora_") != std::string::npos;
    if (!adapter) {
      EXPECT_EQ(trained.Find(t.name)->values, t.values) << t.name;
    }
    moved += adapter && trained.Find(t.name)->values != t.values;
  }
  EXPECT_GT(moved, 0);
  LoraConfig gpt_names;
  gpt_names.rank = 2;
  gpt_names.targets = {"attn.c_attn"};
  auto refused = SpecOf(dir, gpt_names);
  ASSERT_TRUE(refused.ok());
  auto bad = Model::Create(*refused);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("hf has no projection attn.c_attn"), std::string::npos) << bad.status();
  fs::remove_all(dir);
}

// A quantized base (QLoRA) computes exactly as a float32 model holding its dequantized
// weights, forward and in training (the adapters' gradients pass through the dequantized
// matmul); its weights are not parameters, and NF4 holds them in about an eighth of the
// bytes.
TEST(LlamaTest, AQuantizedBaseComputesAsItsDequantizedWeights) {
  const std::string dir = MakeFolder("qwen2", "F32", 1);  // q/k/v biases, a tied head
  std::vector<int32_t> ids;
  for (int i = 0; i < 17 * 8; ++i) ids.push_back((i * 5) % 89);
  const Dataset data = Sequences(ids, 17, 89);
  const std::vector<int32_t> probe(ids.begin(), ids.begin() + 16);
  auto original = Load(dir, AllTargets(4));
  ASSERT_TRUE(original.ok()) << original.status();
  auto exact = (*original)->Logits(probe);
  ASSERT_TRUE(exact.ok());
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.batch_size = 4;
  o.local_steps = 4;
  std::map<std::string, double> errors;  // mean |logit - float32 logit|
  for (const std::string codec : {"int8:channel", "nf4", "nf4:dq"}) {
    SCOPED_TRACE(codec);
    auto q = LoadQuantized(dir, AllTargets(4), codec);
    ASSERT_TRUE(q.ok()) << q.status();
    const QuantizedSet base = (*q)->QuantizedBase();
    ASSERT_EQ(base.tensors.size(), 2u * 7);  // two blocks' seven projections
    EXPECT_EQ((*q)->Parameters().Find("1.self_attn.q_proj.weight"), nullptr);
    EXPECT_NE((*q)->Parameters().Find("1.self_attn.q_proj.bias"), nullptr);
    int64_t values = 0;
    for (const auto& t : base.tensors) values += NumElements(t.shape);
    const double bytes_per_value = double(base.payload_bytes()) / values;
    // Rows of 32 and 48 values: int8's scale per row and nf4's absmax per 64 weigh more than
    // they would in a real model (1.004 and 0.5625 bytes a value at width 576).
    EXPECT_LT(bytes_per_value, codec == "int8:channel" ? 1.13 : codec == "nf4" ? 0.57 : 0.53);

    // The float32 twin: the dequantized weights, the same adapters and the rest.
    auto twin = Load(dir, AllTargets(4));
    ASSERT_TRUE(twin.ok());
    ParameterSet weights = (*twin)->Parameters();
    auto dequantized = DequantizeSet(base);
    ASSERT_TRUE(dequantized.ok()) << dequantized.status();
    ASSERT_TRUE(Overwrite(*dequantized, &weights).ok());
    ASSERT_TRUE(Overwrite((*q)->Parameters(), &weights).ok());
    ASSERT_TRUE((*twin)->SetParameters(weights).ok());
    auto a = (*q)->Logits(probe), b = (*twin)->Logits(probe);
    ASSERT_TRUE(a.ok() && b.ok());
    double err = 0, moved = 0;
    for (size_t i = 0; i < a->size(); ++i) {
      ASSERT_NEAR((*a)[i], (*b)[i], 1e-4) << i;
      moved = std::max(moved, double(std::abs((*a)[i] - (*exact)[i])));
      err += std::abs((*a)[i] - (*exact)[i]);
    }
    EXPECT_GT(moved, 1e-6);  // quantization changed the weights
    errors[codec] = err / a->size();
    ASSERT_TRUE((*q)->Train(data, o).ok());
    ASSERT_TRUE((*twin)->Train(data, o).ok());
    const ParameterSet tq = (*q)->Parameters(), tt = (*twin)->Parameters();
    int adapters = 0;
    for (const Tensor& t : tq.tensors()) {
      const Tensor* u = tt.Find(t.name);
      ASSERT_NE(u, nullptr) << t.name;
      for (size_t i = 0; i < t.values.size(); ++i) ASSERT_NEAR(t.values[i], u->values[i], 1e-4) << t.name;
      adapters += t.name.find(".lora_") != std::string::npos;
    }
    EXPECT_EQ(adapters, 2 * 7 * 2);
    // Another shape or codec is refused and changes nothing.
    QuantizedSet wrong = base;
    wrong.tensors[3].shape = {1, 2};
    auto refused = (*q)->LoadQuantized(wrong);
    EXPECT_NE(refused.message().find("is shaped [1, 2]"), std::string::npos) << refused;
    wrong = base;
    wrong.spec = codec == "nf4" ? "nf4:dq" : "nf4";
    EXPECT_FALSE((*q)->LoadQuantized(wrong).ok());
    wrong = base;
    wrong.tensors.pop_back();
    EXPECT_NE((*q)->LoadQuantized(wrong).message().find("has no tensor"), std::string::npos);
    auto again = (*q)->Logits(probe);
    ASSERT_TRUE(again.ok());
    auto trained = (*twin)->Logits(probe);
    for (size_t i = 0; i < again->size(); ++i) ASSERT_NEAR((*again)[i], (*trained)[i], 1e-3);
  }
  // 8 bits a weight err less than 4, and double quantization adds little.
  EXPECT_LT(errors["int8:channel"] * 5, errors["nf4"]);
  EXPECT_LT(errors["nf4:dq"], errors["nf4"] * 1.2);
  fs::remove_all(dir);
}

// The part [0, 2) then the part [2, 4) on a sequence of the model's ids give `whole`'s
// logits, to 1e-4.
void ExpectPartsComposeTo(Model& whole, ModelPart& front, ModelPart& back, int vocab) {
  const std::vector<int32_t> ids = RandomIds(17, vocab, 7);
  auto expected = whole.Logits(std::vector<int32_t>(ids.begin(), ids.end() - 1));
  ASSERT_TRUE(expected.ok());
  auto a = front.Forward(1, InputBatch(Sequences(ids, 17, vocab), {0}));
  ASSERT_TRUE(a.ok()) << a.status();
  auto logits = back.Forward(1, *a);
  ASSERT_TRUE(logits.ok()) << logits.status();
  for (size_t i = 0; i < expected->size(); ++i) ASSERT_NEAR(logits->values[i], (*expected)[i], 1e-4);
}

// A part of a model builds only its own stages: a device's part of a quantized model holds
// its blocks' weights and no others, and a part with a tied head (qwen2) holds the
// embedding's weight too, so that split learning cuts such a model (LoRA leaves the
// shared weight frozen on both sides).
TEST(LlamaTest, PartsBuildOnlyTheirStagesAndATiedHeadKeepsItsWeight) {
  const std::string dir = MakeFolder("qwen2", "F32", 1);
  auto whole = LoadQuantized(dir, AllTargets(2), "nf4");
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto spec = SpecOf(dir, AllTargets(2));
  ASSERT_TRUE(spec.ok());
  spec->quantize = "nf4";
  auto front = ModelPart::Create(*spec, 0, 2), back = ModelPart::Create(*spec, 2, 4);
  ASSERT_TRUE(front.ok() && back.ok());
  for (const auto& t : (*front)->QuantizedBase().tensors) EXPECT_EQ(t.name.substr(0, 2), "1.") << t.name;
  EXPECT_EQ((*front)->QuantizedBase().tensors.size(), 7u);
  const auto back_names = (*back)->TensorNames();
  EXPECT_NE(std::find(back_names.begin(), back_names.end(), "0.embed_tokens.weight"), back_names.end());
  for (auto* part : {front->get(), back->get()}) {
    ASSERT_TRUE(part->LoadFrom((*whole)->Parameters(), /*partial=*/true).ok());
    ASSERT_TRUE(part->LoadQuantized((*whole)->QuantizedBase()).ok());
  }
  ExpectPartsComposeTo(**whole, **front, **back, 89);
  fs::remove_all(dir);
}

// A device with the folder reads its part's tensors from it straight into the part
// (ModelPart::LoadHfFolder): from BF16 shards, a tied head's weight included, the parts
// hold exactly the whole model's values and compose to its logits; LoRA adapters keep
// their own. A tensor of another shape is refused naming the file and the tensor, and a
// model that is not hf has no folder to read.
TEST(LlamaTest, APartReadsItsTensorsFromTheFolderIntoItsOwn) {
  const std::string dir = MakeFolder("qwen2", "BF16", 2);  // q/k/v biases, a tied head
  auto whole = Load(dir, AllTargets(2));
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto spec = SpecOf(dir, AllTargets(2));
  ASSERT_TRUE(spec.ok());
  const ParameterSet all = (*whole)->Parameters();
  auto front = ModelPart::Create(*spec, 0, 2), back = ModelPart::Create(*spec, 2, 4);
  ASSERT_TRUE(front.ok() && back.ok());
  for (auto* part : {front->get(), back->get()}) {
    const ParameterSet before = part->Parameters();
    ASSERT_TRUE(part->LoadHfFolder(dir).ok());
    int read = 0;
    const ParameterSet loaded = part->Parameters();
    for (const Tensor& t : loaded.tensors()) {
      const bool adapter = t.name.find(".lora_") != std::string::npos;
      EXPECT_EQ(t.values, adapter ? before.Find(t.name)->values : all.Find(t.name)->values) << t.name;
      read += !adapter;
    }
    EXPECT_GT(read, 4);
  }
  ExpectPartsComposeTo(**whole, **front, **back, 89);

  std::vector<float> room(64);
  const Status misshapen = LoadHfInto(dir, {{"1.self_attn.q_proj.weight", {8, 8}, room.data()}}, spec->gpt.layers);
  EXPECT_EQ(misshapen.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misshapen.message().find(".safetensors: tensor model.layers.0.self_attn.q_proj.weight is"),
            std::string::npos) << misshapen;
  ModelSpec gpt;
  gpt.name = "gpt";
  gpt.gpt = {61, 16, 2, 2, 32};
  auto plain = ModelPart::Create(gpt, 0, 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->LoadHfFolder(dir).code(), absl::StatusCode::kFailedPrecondition);
  fs::remove_all(dir);
}

// train.recompute: each block runs again in the backward pass, under the random state of
// its first pass (LoRA dropout draws the same masks), so training is unchanged, and what
// a block keeps from forward to backward shrinks to its input.
TEST(LlamaTest, RecomputingBlocksTrainsTheSameWithLessKept) {
  const std::string dir = MakeFolder("llama", "F32", 1);
  std::vector<int32_t> ids;
  for (int i = 0; i < 17 * 8; ++i) ids.push_back((i * 3) % 97);
  const Dataset data = Sequences(ids, 17, 97);
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.batch_size = 4;
  o.local_steps = 3;
  o.seed = 5;
  std::vector<ParameterSet> trained;
  for (bool recompute : {false, true}) {
    auto model = Load(dir, AllTargets(4, /*dropout=*/0.2));  // seeds torch: the same masks
    ASSERT_TRUE(model.ok());
    o.recompute = recompute;
    auto done = (*model)->Train(data, o);
    ASSERT_TRUE(done.ok()) << done.status();
    trained.push_back((*model)->Parameters());
  }
  for (const Tensor& t : trained[0].tensors()) {
    const Tensor* u = trained[1].Find(t.name);
    for (size_t i = 0; i < t.values.size(); ++i) ASSERT_NEAR(t.values[i], u->values[i], 1e-5) << t.name;
  }
  auto spec = SpecOf(dir, AllTargets(4));
  ASSERT_TRUE(spec.ok());
  auto plain = ProfileStages(*spec, {16}, 4, 1, false), checkpointed = ProfileStages(*spec, {16}, 4, 1, true);
  ASSERT_TRUE(plain.ok() && checkpointed.ok());
  EXPECT_LT((*checkpointed)[1].saved_bytes * 3, (*plain)[1].saved_bytes)
      << (*checkpointed)[1].saved_bytes << " vs " << (*plain)[1].saved_bytes;
  fs::remove_all(dir);
}

// The cut policy's memory model counts grouped-query attention: what a block keeps for
// its backward pass (measured by ProfileStages) shrinks with its key/value heads, by the
// keys and values of the heads it no longer has (within the heap measurement's noise).
TEST(LlamaTest, ABlockKeepsKeysAndValuesOfItsKeyValueHeadsOnly) {
  auto saved = [](int kv_heads) -> int64_t {
    ModelSpec spec;
    spec.seed = 3;
    const std::string config = absl::StrCat(
        R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": )",
        kv_heads, R"(, "num_hidden_layers": 1, "intermediate_size": 96, "vocab_size": 97})");
    EXPECT_TRUE(SetHfModel(spec, config, "config.json").ok());
    auto profile = ProfileStages(spec, {64}, 4, 3, false);
    EXPECT_TRUE(profile.ok()) << profile.status();
    return profile.ok() ? (*profile)[1].saved_bytes : 0;
  };
  const int64_t mha = saved(8), gqa = saved(2), mqa = saved(1);
  const int64_t kv_head_bytes = 2 * 64 * 8 * 4;  // keys and values of one head: 64 tokens x 8 dims
  EXPECT_NEAR(mha - gqa, 6 * kv_head_bytes, 0.1 * kv_head_bytes) << mha << " vs " << gqa;
  EXPECT_NEAR(gqa - mqa, 1 * kv_head_bytes, 0.1 * kv_head_bytes) << gqa << " vs " << mqa;
}

}  // namespace
}  // namespace cleave
