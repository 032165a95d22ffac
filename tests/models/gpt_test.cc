// The built-in decoder: its forward pass against GPT-2's written independently in
// PyTorch (tests/models/gpt_reference.py) on a checkpoint saved here, GPT-2-layout
// safetensors in and out with every malformed file refused, its stages composing to
// the whole model (so split learning can cut it), and training that learns real text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/files.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/part.h"
#include "models/safetensors.h"
#include "tests/models/token_data.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

ModelSpec Gpt(bool tie, uint64_t seed = 7) {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = seed;
  spec.gpt = {/*vocab=*/61, /*context=*/16, /*layers=*/2, /*heads=*/4, /*dim=*/32, tie};
  return spec;
}

std::string Temp(const std::string& name) { return (fs::temp_directory_path() / name).string(); }

// Our logits equal those of GPT-2's definition in PyTorch, run on the checkpoint we
// saved in GPT-2's layout (with and without GPT2LMHeadModel's "transformer." prefix,
// tied and untied), and our loss per token is its cross-entropy.
TEST(GptTest, LogitsEqualGpt2InPyTorchOnASavedCheckpoint) {
  for (const bool tie : {false, true}) {
    SCOPED_TRACE(tie ? "tied head" : "untied head");
    auto model = Model::Create(Gpt(tie));
    ASSERT_TRUE(model.ok()) << model.status();
    ParameterSet file = ToGpt2Layout((*model)->Parameters());
    EXPECT_NE(file.Find("h.1.attn.c_attn.weight"), nullptr);
    EXPECT_EQ(file.Find("lm_head.weight") != nullptr, !tie);
    if (tie) {
      for (auto& t : file.mutable_tensors()) t.name = "transformer." + t.name;
    }
    const std::string ckpt = Temp("cleave_gpt_ref.safetensors"), tokens = Temp("cleave_gpt_ref.i64"),
                      out = Temp("cleave_gpt_ref.logits");
    ASSERT_TRUE(WriteFileAtomic(ckpt, SerializeSafetensors(file, {{"format", "pt"}})).ok());
    const int64_t batch = 3, t = 16;
    const std::vector<int32_t> ids = RandomIds(batch * t, 61, 11);
    const std::vector<int64_t> ids64(ids.begin(), ids.end());
    ASSERT_TRUE(WriteFileAtomic(tokens, std::string(reinterpret_cast<const char*>(ids64.data()),
                                                    ids64.size() * 8)).ok());
    const std::string cmd = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR +
                            "/tests/models/gpt_reference.py " + ckpt + " " + tokens + " 3 16 4 " + out;
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    auto ref = ReadFile(out);
    auto ref_loss = ReadFile(out + ".loss");
    for (const auto& f : {ckpt, tokens, out, out + ".loss"}) fs::remove(f);
    ASSERT_TRUE(ref.ok() && ref_loss.ok());
    ASSERT_EQ(ref->size(), size_t(batch * t * 61 * 4));
    const float* expected = reinterpret_cast<const float*>(ref->data());
    double worst = 0;
    for (int64_t b = 0; b < batch; ++b) {
      auto logits = (*model)->Logits(std::vector<int32_t>(ids.begin() + b * t, ids.begin() + (b + 1) * t));
      ASSERT_TRUE(logits.ok()) << logits.status();
      for (int64_t i = 0; i < t * 61; ++i) {
        worst = std::max(worst, double(std::abs((*logits)[i] - expected[b * t * 61 + i])));
      }
    }
    EXPECT_LT(worst, 1e-5);
    auto eval = (*model)->Evaluate(Sequences(ids, t, 61), 2);
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_NEAR(eval->loss, std::stod(*ref_loss), 1e-5);
    EXPECT_NEAR(eval->metrics.at("perplexity"), std::exp(eval->loss), 1e-9);
    EXPECT_NEAR(eval->metrics.at("bits_per_byte"), eval->loss / std::log(2.0), 1e-9);
    EXPECT_EQ(eval->metrics.at("tokens"), batch * (t - 1));
  }
}

// A checkpoint saved from one model loads into another of the same size: every tensor
// arrives. An untied model takes a file without lm_head.weight (GPT-2's own files tie
// it) with its head a copy of wte.
TEST(GptTest, LoadsAGpt2LayoutCheckpoint) {
  auto a = Model::Create(Gpt(false, 1));
  auto b = Model::Create(Gpt(false, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  const ParameterSet saved = (*a)->Parameters();
  auto parsed = ParseSafetensors(SerializeSafetensors(ToGpt2Layout(saved)), "a.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto loaded = FromGpt2Layout(*parsed, (*b)->Parameters(), "a.safetensors");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE((*b)->SetParameters(*loaded).ok());
  const ParameterSet got = (*b)->Parameters();
  ASSERT_EQ(got.size(), saved.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got.tensors()[i].values, saved.tensors()[i].values) << got.tensors()[i].name;
  }
  ParameterSet tied_file;
  for (const Tensor& t : parsed->tensors()) {
    if (t.name != "lm_head.weight") {
      ASSERT_TRUE(tied_file.Add(t).ok());
    }
  }
  auto untied = FromGpt2Layout(tied_file, (*b)->Parameters(), "gpt2.safetensors");
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_EQ(untied->Find("3.lm_head.weight")->values, saved.Find("0.wte.weight")->values);
}

// F16 and BF16 files read as float32.
TEST(GptTest, ReadsHalfPrecisionSafetensors) {
  // 1.0, -2.0, 0.5 and a subnormal (2^-24) in F16; 1.0 and -3.0 in BF16.
  const std::string header =
      R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}})";
  std::string file(8, '\0');
  file[0] = static_cast<char>(header.size());
  file += header;
  const uint16_t values[] = {0x3c00, 0xc000, 0x3800, 0x0001, 0x3f80, 0xc040};
  file.append(reinterpret_cast<const char*>(values), sizeof(values));
  auto ps = ParseSafetensors(file, "half.safetensors");
  ASSERT_TRUE(ps.ok()) << ps.status();
  EXPECT_EQ(ps->Find("a")->values, (std::vector<float>{1.0f, -2.0f, 0.5f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(ps->Find("b")->values, (std::vector<float>{1.0f, -3.0f}));
}

// Each malformed file is refused with an error naming the file and the tensor.
TEST(GptTest, RefusesMalformedCheckpoints) {
  auto model = Model::Create(Gpt(false));
  ASSERT_TRUE(model.ok());
  const ParameterSet layout = (*model)->Parameters();
  const std::string good = SerializeSafetensors(ToGpt2Layout(layout));
  auto expect_error = [&](const StatusOr<ParameterSet>& r, const std::string& part) {
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_NE(std::string(r.status().message()).find(part), std::string::npos) << r.status();
  };
  expect_error(ParseSafetensors(good.substr(0, good.size() - 5), "x.safetensors"), "truncated");
  expect_error(ParseSafetensors(good.substr(0, 30), "x.safetensors"), "header of");
  expect_error(ParseSafetensors("abc", "x.safetensors"), "not a safetensors file");
  std::string bad_json = good;
  bad_json[9] = '[';
  expect_error(ParseSafetensors(bad_json, "x.safetensors"), "the header: not valid JSON");
  auto raw = [](const std::string& header, size_t data) {
    std::string f(8, '\0');
    f[0] = static_cast<char>(header.size());
    return f + header + std::string(data, '\0');
  };
  expect_error(ParseSafetensors(raw(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16),
                                "x.safetensors"),
               "dtype I64");
  expect_error(ParseSafetensors(raw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                                "x.safetensors"),
               "do not hold 3 F32");
  expect_error(ParseSafetensors(raw(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                                    R"("data_offsets":[0,0]}})", 0),
                                "x.safetensors"),
               "more than 2^40 elements");
  expect_error(ParseSafetensors(raw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                                "x.safetensors"),
               "overlap");
  // Well-formed files that do not fit the model.
  const ParameterSet gpt2 = ToGpt2Layout(layout);
  auto edited = [&](auto edit) {
    ParameterSet out;
    for (Tensor t : gpt2.tensors()) {
      if (edit(t)) out.Add(std::move(t)).IgnoreError();
    }
    return out;
  };
  expect_error(FromGpt2Layout(edited([](Tensor& t) {
                 if (t.name == "wpe.weight") {
                   t.shape = {8, 32};
                   t.values.resize(8 * 32);
                 }
                 return true;
               }), layout, "small.safetensors"),
               "tensor wpe.weight is 8x32 but the model's is 16x32");
  expect_error(FromGpt2Layout(edited([](Tensor& t) {
                 if (t.name == "h.1.ln_1.weight") t.name = "h.2.ln_1.weight";
                 return true;
               }), layout, "deep.safetensors"),
               "tensor h.2.ln_1.weight has no place in model gpt with 2 layers");
  expect_error(FromGpt2Layout(edited([](Tensor& t) { return t.name != "ln_f.bias"; }), layout,
                              "short.safetensors"),
               "no tensor ln_f.bias");
}

// The stages (embedding, each block, head) run one after another, in parts cut
// anywhere, give the whole model's logits: split learning can cut the decoder.
TEST(GptTest, StagesComposeToTheWholeModel) {
  const ModelSpec spec = Gpt(false);
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok());
  auto stages = ParameterStages(spec);
  ASSERT_TRUE(stages.ok());
  EXPECT_EQ(stages->back(), 3);  // embedding, two blocks, head
  const std::vector<int32_t> ids = RandomIds(17, 61, 5);
  const Dataset data = Sequences(ids, 17, 61);
  auto whole = (*model)->Logits(std::vector<int32_t>(ids.begin(), ids.end() - 1));
  ASSERT_TRUE(whole.ok());
  for (int cut = 1; cut <= 3; ++cut) {
    auto front = ModelPart::Create(spec, 0, cut);
    auto back = ModelPart::Create(spec, cut, 4);
    ASSERT_TRUE(front.ok() && back.ok());
    auto a = (*front)->Forward(1, InputBatch(data, {0}));
    ASSERT_TRUE(a.ok()) << a.status();
    auto logits = (*back)->Forward(1, *a);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->shape, (std::vector<int64_t>{1, 16, 61}));
    for (size_t i = 0; i < whole->size(); ++i) ASSERT_NEAR(logits->values[i], (*whole)[i], 1e-5);
  }
}

// What the cut policy learns of the decoder's memory: a block keeps far more for its
// backward pass than the activations it hands on (attention probabilities, heads x
// tokens^2 a sequence, grow with the square of the context; the MLP's hidden layer is 4x
// as wide), and under LoRA only the adapters train, so only they get optimizer state.
TEST(GptTest, ProfilesMeasureWhatEachStageKeepsAndWhatTrains) {
  ModelSpec spec = Gpt(false);
  spec.gpt.context = 64;
  auto short_ctx = ProfileStages(spec, {64}, 8, 1);
  spec.gpt.context = 256;
  auto long_ctx = ProfileStages(spec, {256}, 8, 1);
  ASSERT_TRUE(short_ctx.ok() && long_ctx.ok());
  const StageProfile& block = (*short_ctx)[1];
  EXPECT_EQ(block.out_elements, 64 * 32);
  EXPECT_GT(block.saved_bytes, 8 * 4 * block.out_elements) << "more than 8 copies of its output";
  // Quadrupling the context: the per-token terms grow 4x, the attention terms 16x.
  EXPECT_GT((*long_ctx)[1].saved_bytes, 6 * block.saved_bytes);
  for (const auto& st : *short_ctx) {
    EXPECT_GE(st.saved_bytes, 4 * st.out_elements) << "the output is kept";
    EXPECT_EQ(st.trainable_elements, st.param_elements);
  }

  ModelSpec lora = Gpt(false);
  lora.lora.rank = 4;
  lora.lora.alpha = 8;
  auto profile = ProfileStages(lora, {16}, 4, 1);
  ASSERT_TRUE(profile.ok());
  // Each block: A (4 x in) and B (out x 4) on its four projections, 32 wide, MLP 128.
  const int64_t adapters = 4 * (32 + 96) + 4 * (32 + 32) + 4 * (32 + 128) + 4 * (128 + 32);
  EXPECT_EQ((*profile)[1].trainable_elements, adapters);
  EXPECT_EQ((*profile)[0].trainable_elements, 0) << "the embedding is frozen";
  EXPECT_GT((*profile)[1].param_elements, 5 * adapters);
  auto part = ModelPart::Create(lora, 0, 2);
  ASSERT_TRUE(part.ok());
  LocalTrainOptions o;
  o.optimizer = "adamw";
  ASSERT_TRUE((*part)->ResetOptimizer(o).ok());
  EXPECT_EQ((*part)->OptimizerStateElements(), 2 * adapters) << "two moments, adapters only";
  o.optimizer = "sgd";
  o.momentum = 0.9;
  ASSERT_TRUE((*part)->ResetOptimizer(o).ok());
  EXPECT_EQ((*part)->OptimizerStateElements(), adapters);
  o.momentum = 0;
  ASSERT_TRUE((*part)->ResetOptimizer(o).ok());
  EXPECT_EQ((*part)->OptimizerStateElements(), 0);
}

// A split device's LoRA part uses its frozen base's values in place (LoadBase): no copy
// beside the base it keeps for later rounds. The base's values show through at once, a
// training step leaves them as they were (only the adapters move), and a base tensor of
// another shape is refused.
TEST(GptTest, ALoraPartUsesItsFrozenBaseInPlace) {
  ModelSpec lora = Gpt(false);
  lora.lora.rank = 4;
  lora.lora.alpha = 8;
  auto part = ModelPart::Create(lora, 0, 2);
  ASSERT_TRUE(part.ok());
  ParameterSet base;
  const ParameterSet initial = (*part)->Parameters();
  for (Tensor t : initial.tensors()) {
    if (t.name.find("lora_") != std::string::npos) continue;
    for (float& v : t.values) v += 0.5f;
    ASSERT_TRUE(base.Add(std::move(t)).ok());
  }
  ASSERT_GT(base.size(), 4u);
  ASSERT_TRUE((*part)->LoadBase(base).ok());
  const Tensor& wte = base.tensors()[0];
  EXPECT_EQ((*part)->Parameters().Find(wte.name)->values, wte.values);
  base.mutable_tensors()[0].values[3] = 42.0f;  // in place: the part sees it
  EXPECT_EQ((*part)->Parameters().Find(wte.name)->values[3], 42.0f);

  const ParameterSet before_base = base;
  const ParameterSet before = (*part)->Parameters();
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 0.01;
  ASSERT_TRUE((*part)->ResetOptimizer(o).ok());
  Activations in;
  in.shape = {2, 16};
  for (int i = 0; i < 32; ++i) in.values.push_back(static_cast<float>(i % 61));
  auto out = (*part)->Forward(0, in);
  ASSERT_TRUE(out.ok()) << out.status();
  Activations grad;
  grad.shape = out->shape;
  grad.values.assign(out->values.size(), 0.01f);
  ASSERT_TRUE((*part)->Backward(0, grad).ok());
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(base.tensors()[i].values, before_base.tensors()[i].values) << base.tensors()[i].name;
  }
  bool adapters_moved = false;
  const ParameterSet after = (*part)->Parameters();
  for (const Tensor& t : after.tensors()) {
    if (t.name.find("lora_B") != std::string::npos) adapters_moved |= t.values != before.Find(t.name)->values;
  }
  EXPECT_TRUE(adapters_moved);

  ParameterSet wrong;
  ASSERT_TRUE(wrong.Add({wte.name, {2, 2}, {1, 2, 3, 4}}).ok());
  EXPECT_EQ((*part)->LoadBase(wrong).code(), absl::StatusCode::kInvalidArgument);
}

// The same for a whole model, as a federated client holds it: its frozen tensors are the
// base's values (a change to the base shows through), updates carry only the rest
// (TrainedParameters), training leaves the base alone, and a base that is not exactly
// the frozen tensors is refused with nothing changed.
TEST(GptTest, ALoraModelUsesItsFrozenBaseInPlace) {
  ModelSpec spec = Gpt(false);
  spec.lora = {/*rank=*/4, /*alpha=*/8, {"attn.c_attn", "mlp.c_proj"}, /*dropout=*/0};
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<std::string> frozen = (*model)->FrozenTensors();
  const ParameterSet initial = (*model)->Parameters();
  ParameterSet base = Only(initial, frozen);
  for (Tensor& t : base.mutable_tensors()) {
    for (float& v : t.values) v += 0.5f;
  }
  ParameterSet missing = Without(base, {frozen[1]});
  ParameterSet misshapen = base;
  misshapen.mutable_tensors()[1].shape = {static_cast<int64_t>(misshapen.tensors()[1].values.size())};
  for (const ParameterSet* bad : {&missing, &misshapen}) {
    EXPECT_EQ((*model)->LoadBase(*bad).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*model)->Parameters().Find(frozen[0])->values, initial.Find(frozen[0])->values);
  }

  ASSERT_TRUE((*model)->LoadBase(base).ok());
  const ParameterSet trained = (*model)->TrainedParameters();
  EXPECT_EQ(trained.size() + frozen.size(), initial.size());
  for (const std::string& n : frozen) EXPECT_EQ(trained.Find(n), nullptr) << n;
  EXPECT_EQ(trained.Find("1.attn.c_attn.lora_A")->values, initial.Find("1.attn.c_attn.lora_A")->values);
  const Tensor& wte = base.tensors()[0];
  EXPECT_EQ((*model)->Parameters().Find(wte.name)->values, wte.values);
  base.mutable_tensors()[0].values[3] = 42.0f;  // in place: the model sees it
  EXPECT_EQ((*model)->Parameters().Find(wte.name)->values[3], 42.0f);

  const ParameterSet before_base = base;
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.batch_size = 2;
  o.local_steps = 3;
  ASSERT_TRUE((*model)->Train(Sequences(RandomIds(68, 61, 4), 17, 61), o).ok());
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(base.tensors()[i].values, before_base.tensors()[i].values) << base.tensors()[i].name;
  }
  const ParameterSet after = (*model)->TrainedParameters();
  EXPECT_NE(after.Find("2.mlp.c_proj.lora_B")->values, trained.Find("2.mlp.c_proj.lora_B")->values);
  // The trained tensors go back in alone; the whole layout is not theirs.
  ASSERT_TRUE((*model)->SetTrainedParameters(trained).ok());
  EXPECT_EQ((*model)->TrainedParameters().Find("2.mlp.c_proj.lora_B")->values,
            trained.Find("2.mlp.c_proj.lora_B")->values);
  EXPECT_EQ((*model)->SetTrainedParameters(initial).code(), absl::StatusCode::kInvalidArgument);
}

// Bad input: ids outside the vocabulary, sequences longer than the context, a
// tokenizer whose vocabulary is not the model's, text for a model that is not a
// language model; each refused before anything trains.
TEST(GptTest, RefusesTextThatDoesNotFit) {
  const ModelSpec spec = Gpt(false);
  std::vector<int32_t> ids = RandomIds(34, 61, 3);
  EXPECT_TRUE(CheckDataFitsModel(Sequences(ids, 17, 61), spec, "cross_entropy", "text").ok());
  ids[20] = 61;
  auto s = CheckDataFitsModel(Sequences(ids, 17, 61), spec, "cross_entropy", "text");
  EXPECT_NE(std::string(s.message()).find("sequence 1 token 3 is id 61, outside"), std::string::npos) << s;
  s = CheckDataFitsModel(Sequences(RandomIds(34, 61, 3), 34, 61), spec, "cross_entropy", "text");
  EXPECT_NE(std::string(s.message()).find("33 tokens do not fit the model's context of 16"),
            std::string::npos) << s;
  s = CheckDataFitsModel(Sequences(RandomIds(34, 61, 3), 17, 256), spec, "cross_entropy", "text");
  EXPECT_NE(std::string(s.message()).find("vocabulary of 256 but the model's is 61"), std::string::npos) << s;
  s = CheckDataFitsModel(Sequences(RandomIds(34, 61, 3), 17, 61), {"mlp", "", 1, {17}, 10},
                         "cross_entropy", "text");
  EXPECT_NE(std::string(s.message()).find("needs a language model"), std::string::npos) << s;
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok());
  EXPECT_FALSE((*model)->Logits({1, 2, 99}).ok());
  EXPECT_FALSE((*model)->Logits(RandomIds(17, 61, 1)).ok());  // longer than the context
  EXPECT_FALSE((*model)->Generate({}, 3, 1.0, 0, 1).ok());
  Dataset bad = Sequences(ids, 17, 61);
  EXPECT_FALSE((*model)->Train(bad, LocalTrainOptions{}).ok());  // id 61 reaches the embedding
}

// Trained with AdamW on real English (Debian's fortunes, bytes), the decoder's held-out
// perplexity falls far below the 256 of a uniform guess and below a unigram model's.
TEST(GptTest, LearnsEnglish) {
  auto train = LoadDataSpec("text:/usr/share/games/fortunes/wisdom,context=32", true);
  auto test = LoadDataSpec("text:/usr/share/games/fortunes/wisdom,context=32", false);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 1;
  spec.gpt = {256, 32, 2, 4, 64, false};
  auto model = Model::Create(spec);
  ASSERT_TRUE(model.ok());
  auto before = (*model)->Evaluate(*test, 64);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_NEAR(before->metrics.at("perplexity"), 256, 40);  // GPT-2's init: near uniform
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 3e-3;
  o.batch_size = 32;
  o.local_steps = 150;
  o.weight_decay = 0.01;
  auto stats = (*model)->Train(*train, o);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto after = (*model)->Evaluate(*test, 64);
  ASSERT_TRUE(after.ok());
  // A unigram model of English bytes has a perplexity of about 20 (4.3 bits per byte).
  EXPECT_LT(after->metrics.at("perplexity"), 14) << "bits per byte " << after->metrics.at("bits_per_byte");
  auto more = (*model)->Generate({'T', 'h', 'e', ' '}, 20, 0.8, 20, 3);
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(more->size(), 20u);
}

// LoRA: the adapted model starts as its base (B = 0; the base initialised as without
// adapters), trains only its adapters (every base tensor frozen, unchanged by
// training), and its merged weights give a plain model the same logits.
TEST(GptTest, LoraTrainsOnlyItsAdaptersAndMergesIntoThePlainModel) {
  ModelSpec plain_spec = Gpt(false);
  ModelSpec spec = plain_spec;
  spec.lora = {/*rank=*/4, /*alpha=*/8, {"attn.c_attn", "mlp.c_proj"}, /*dropout=*/0};
  auto plain = Model::Create(plain_spec);
  auto lora = Model::Create(spec);
  ASSERT_TRUE(plain.ok() && lora.ok()) << lora.status();
  const ParameterSet base = (*plain)->Parameters(), start = (*lora)->Parameters();
  EXPECT_EQ(start.size(), base.size() + 2 * 2 * 2);  // A and B on 2 targets in 2 blocks
  const std::vector<std::string> frozen = (*lora)->FrozenTensors();
  EXPECT_EQ(frozen.size(), base.size());
  EXPECT_TRUE((*plain)->FrozenTensors().empty());
  for (const Tensor& t : base.tensors()) EXPECT_EQ(start.Find(t.name)->values, t.values) << t.name;
  EXPECT_EQ(start.Find("1.attn.c_attn.lora_A")->shape, (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(start.Find("2.mlp.c_proj.lora_B")->shape, (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(start.Find("1.attn.c_proj.lora_A"), nullptr);  // not a target
  const std::vector<int32_t> ids = RandomIds(16, 61, 9);
  EXPECT_EQ(*(*lora)->Logits(ids), *(*plain)->Logits(ids));

  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.batch_size = 4;
  o.local_steps = 10;
  o.weight_decay = 0.1;  // decays the adapters only: frozen tensors take no step at all
  ASSERT_TRUE((*lora)->Train(Sequences(RandomIds(17 * 8, 61, 4), 17, 61), o).ok());
  const ParameterSet trained = (*lora)->Parameters();
  for (const Tensor& t : base.tensors()) EXPECT_EQ(trained.Find(t.name)->values, t.values) << t.name;
  EXPECT_NE(trained.Find("1.attn.c_attn.lora_B")->values, start.Find("1.attn.c_attn.lora_B")->values);

  const ParameterSet merged = MergeLora(trained, 8.0 / 4);
  ASSERT_TRUE(merged.SameLayout(base));
  ASSERT_TRUE((*plain)->SetParameters(merged).ok());
  auto a = (*lora)->Logits(ids), b = (*plain)->Logits(ids);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) ASSERT_NEAR((*a)[i], (*b)[i], 1e-5) << i;
  // A GPT-2 checkpoint loads under adapters, which keep their starting values.
  auto loaded = FromGpt2Layout(ToGpt2Layout(merged), start, "merged.safetensors");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->Find("1.attn.c_attn.lora_A")->values, start.Find("1.attn.c_attn.lora_A")->values);
  EXPECT_EQ(loaded->Find("1.attn.c_attn.weight")->values, merged.Find("1.attn.c_attn.weight")->values);
}

}  // namespace
}  // namespace cleave
