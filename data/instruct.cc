// The instruct source: instruction data in JSONL, one example a line, either Alpaca's
// fields (instruction, input, output) or a chat ("messages": [{role, content}, ...]).
// Each example is one sequence of context + 1 tokens (cut, or padded with tokens that
// are not trained), and only the response tokens are targets: the prompt's tokens are
// stored as -1 - id (data/dataset.h).
//
// A chat is rendered by the tokenizer's chat template (tokenizer_config.json's
// chat_template, data/chat_template.h) as transformers' apply_chat_template renders it;
// the response of each assistant turn is what rendering the conversation up to that turn
// adds to rendering it up to the turn before with add_generation_prompt (ChatExamples). Alpaca's fields
// become a user and an assistant turn under a chat template; with template=alpaca (or a
// tokenizer without a template) they are Stanford Alpaca's prompt, the output and the
// end-of-text token.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/json.h"
#include "data/chat_template.h"
#include "data/hf_tokenizer.h"
#include "data/sources.h"
#include "data/tokenizer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Stanford Alpaca's prompts (train.py's PROMPT_DICT).
constexpr char kAlpacaWithInput[] =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### "
    "Input:\n{input}\n\n### Response:\n";
constexpr char kAlpacaNoInput[] =
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n";

std::string Fill(std::string t, const std::string& key, const std::string& value) {
  const std::string k = "{" + key + "}";
  const size_t at = t.find(k);
  if (at != std::string::npos) t.replace(at, k.size(), value);
  return t;
}

// A special token of tokenizer_config.json: a string, or an object with "content".
std::string TokenText(const Json& config, const char* key) {
  if (!config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

struct ChatFormat {
  std::optional<ChatTemplate> tmpl;  // none: Alpaca's prompts
  std::string source;                // where the template came from, for errors
  std::string bos, eos;
};

// The chat template `option` names: "auto" (the tokenizer folder's, if it has one),
// "alpaca", or a file holding a Jinja template.
StatusOr<ChatFormat> FormatOf(const std::string& tokenizer_spec, const std::string& option) {
  ChatFormat f;
  Json config = Json::object();
  if (absl::StartsWith(tokenizer_spec, "hf:")) {
    fs::path dir = tokenizer_spec.substr(3);
    if (!fs::is_directory(dir)) dir = dir.parent_path();
    const fs::path path = dir / "tokenizer_config.json";
    if (fs::exists(path)) {
      ASSIGN_OR_RETURN(std::string text, ReadBoundedFile(path.string(), kMaxTokenizerBytes));
      ASSIGN_OR_RETURN(config, ParseJsonObject(text, path.string()));
    }
  }
  f.bos = TokenText(config, "bos_token");
  f.eos = TokenText(config, "eos_token");
  if (option == "alpaca") return f;
  std::string text;
  if (option != "auto") {
    ASSIGN_OR_RETURN(text, ReadFile(option));
    f.source = option;
  } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
    text = config["chat_template"].get<std::string>();
    f.source = "the chat_template of " + tokenizer_spec.substr(3) + "'s tokenizer_config.json";
  } else {
    return f;
  }
  auto parsed = ChatTemplate::Parse(text);
  if (!parsed.ok()) return Status(parsed.status().code(), absl::StrCat(f.source, ": ", parsed.status().message()));
  f.tmpl = *std::move(parsed);
  return f;
}

// One example's tokens, each stored as id when it is a target and -1 - id otherwise.
class Example {
 public:
  Status Add(const Tokenizer& t, const std::string& text, bool trained, bool special = false) {
    if (text.empty() && !special) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, t.EncodeText(text, special));
    for (int32_t id : ids) tokens_.push_back(trained ? id : -1 - id);
    bytes_ += static_cast<int64_t>(text.size());
    return absl::OkStatus();
  }
  void AddId(int32_t id, bool trained) { tokens_.push_back(trained ? id : -1 - id); }
  std::vector<int32_t>& tokens() { return tokens_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<int32_t> tokens_;
  int64_t bytes_ = 0;
};

// Renders with the budget of the line the chat came from.
StatusOr<std::string> Render(const ChatFormat& f, const Json& messages, bool generation, TemplateBudget* budget) {
  const Json context = {{"messages", messages}, {"bos_token", f.bos}, {"eos_token", f.eos},
                        {"add_generation_prompt", generation}};
  auto text = f.tmpl->Render(context.dump(), budget);
  if (!text.ok()) return Status(text.status().code(), absl::StrCat(f.source, ": ", text.status().message()));
  return text;
}

// A chat's examples: one with each assistant turn's response trained and the rest not,
// when the template renders each turn as a continuation of the conversation before it
// (Llama 3's, Mistral's, Qwen 2.5's). A template that renders earlier turns differently
// once the conversation goes on (Qwen 3's drops their reasoning) gives one example per
// assistant turn instead: the conversation up to it as its prompt, then its response, as
// the model sees them when it generates that turn.
// Every render of one chat draws on one budget (TemplateBudget's defaults): a chat of
// thousands of turns, rendered once per assistant turn, ends in an error, not in minutes.
StatusOr<std::vector<Example>> ChatExamples(const Tokenizer& t, const ChatFormat& f, const Json& messages) {
  TemplateBudget budget;
  struct Turn {
    std::string prompt, full;  // rendered up to the turn (with the generation prompt), and with it
  };
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, " needs a string role and content"));
    }
    if (m["role"] != "assistant") continue;
    Turn turn;
    ASSIGN_OR_RETURN(turn.prompt, Render(f, Json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i)),
                                         true, &budget));
    ASSIGN_OR_RETURN(turn.full, Render(f, Json(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1),
                                       false, &budget));
    if (!absl::StartsWith(turn.full, turn.prompt)) {
      return absl::InvalidArgumentError(absl::StrCat("the chat template does not render assistant turn ", i,
                                                     " after its generation prompt"));
    }
    turns.push_back(std::move(turn));
  }
  if (turns.empty()) return absl::InvalidArgumentError("a chat without an assistant turn has nothing to train on");
  bool continues = true;  // each turn's prompt extends the turn before
  for (size_t k = 1; k < turns.size(); ++k) continues = continues && absl::StartsWith(turns[k].prompt, turns[k - 1].full);
  std::vector<Example> out;
  if (continues) {
    Example ex;
    std::string done;
    for (const Turn& turn : turns) {
      RETURN_IF_ERROR(ex.Add(t, turn.prompt.substr(done.size()), /*trained=*/false));
      RETURN_IF_ERROR(ex.Add(t, turn.full.substr(turn.prompt.size()), /*trained=*/true));
      done = turn.full;
    }
    ASSIGN_OR_RETURN(std::string all, Render(f, messages, /*generation=*/false, &budget));
    if (absl::StartsWith(all, done)) RETURN_IF_ERROR(ex.Add(t, all.substr(done.size()), /*trained=*/false));
    out.push_back(std::move(ex));
    return out;
  }
  for (const Turn& turn : turns) {
    Example ex;
    RETURN_IF_ERROR(ex.Add(t, turn.prompt, /*trained=*/false));
    RETURN_IF_ERROR(ex.Add(t, turn.full.substr(turn.prompt.size()), /*trained=*/true));
    out.push_back(std::move(ex));
  }
  return out;
}

StatusOr<std::vector<Example>> ExamplesOf(const Tokenizer& t, const ChatFormat& f, const Json& j) {
  if (j.contains("messages")) {
    if (!j["messages"].is_array()) return absl::InvalidArgumentError("\"messages\" must be a list");
    if (!f.tmpl) return absl::InvalidArgumentError("a chat needs a chat template (template=FILE, or a tokenizer with one)");
    return ChatExamples(t, f, j["messages"]);
  }
  auto field = [&j](const char* key) -> StatusOr<std::string> {
    if (!j.contains(key)) return std::string();
    if (!j[key].is_string()) return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" must be a string"));
    return j[key].get<std::string>();
  };
  ASSIGN_OR_RETURN(std::string instruction, field("instruction"));
  ASSIGN_OR_RETURN(std::string input, field("input"));
  ASSIGN_OR_RETURN(std::string output, field("output"));
  if (instruction.empty() || !j.contains("output")) {
    return absl::InvalidArgumentError("expected \"messages\", or \"instruction\" and \"output\" (Alpaca)");
  }
  if (f.tmpl) {
    const Json messages = {{{"role", "user"}, {"content", input.empty() ? instruction : instruction + "\n\n" + input}},
                           {{"role", "assistant"}, {"content", output}}};
    return ChatExamples(t, f, messages);
  }
  const std::string prompt = input.empty() ? Fill(kAlpacaNoInput, "instruction", instruction)
                                           : Fill(Fill(kAlpacaWithInput, "instruction", instruction), "input", input);
  Example ex;
  RETURN_IF_ERROR(ex.Add(t, prompt, /*trained=*/false, /*special=*/true));
  RETURN_IF_ERROR(ex.Add(t, output, /*trained=*/true));
  if (t.eos_id() >= 0) ex.AddId(t.eos_id(), /*trained=*/true);
  return std::vector<Example>{std::move(ex)};
}

}  // namespace

StatusOr<Dataset> LoadInstruct(const std::string& path, bool train, SpecOptions& o) {
  const std::string tokenizer_spec = o.String("tokenizer", "byte");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::Create(tokenizer_spec));
  ASSIGN_OR_RETURN(int64_t context, o.Int("context", 128, 1, 1 << 20));
  ASSIGN_OR_RETURN(double test, o.Double("test", 0.1, 0, 0.9));
  ASSIGN_OR_RETURN(ChatFormat format, FormatOf(tokenizer_spec, o.String("template", "auto")));
  ASSIGN_OR_RETURN(std::vector<std::string> files, TextFilesUnder(path));
  const fs::path root = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  // Padding: the end-of-text token (never a target), or id 0.
  const int32_t pad = -1 - std::max(tokenizer->eos_id(), 0);

  Dataset d;
  d.type = ExampleType::kToken;
  d.shape = {context + 1};
  d.num_classes = tokenizer->vocab_size();
  d.tokenizer = tokenizer_spec;
  int64_t text_bytes = 0, tokens = 0, untrained = 0;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return absl::NotFoundError("instruct: cannot open " + file);
    std::vector<std::vector<int32_t>> examples;
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = absl::StrCat("instruct: ", file, ":", n, ": ");
      auto j = ParseJsonObject(line, "the line");
      if (!j.ok()) return absl::InvalidArgumentError(where + std::string(j.status().message()));
      auto made = ExamplesOf(*tokenizer, format, *j);
      if (!made.ok()) return Status(made.status().code(), where + std::string(made.status().message()));
      for (Example& ex : *made) {
        std::vector<int32_t>& ids = ex.tokens();
        text_bytes += ex.bytes();
        tokens += static_cast<int64_t>(ids.size());
        ids.resize(static_cast<size_t>(context + 1), pad);
        // An example whose responses all fall past the context trains nothing.
        if (std::none_of(ids.begin() + 1, ids.end(), [](int32_t id) { return id >= 0; })) {
          ++untrained;
          continue;
        }
        examples.push_back(std::move(ids));
      }
    }
    const int64_t count = static_cast<int64_t>(examples.size());
    if (count == 0) continue;
    const int64_t held = count < 2 || test == 0 ? 0 : std::clamp<int64_t>(std::llround(test * count), 1, count - 1);
    const int64_t first = train ? 0 : count - held, last = train ? count - held : count;
    const int32_t group = static_cast<int32_t>(d.group_names.size());
    const fs::path name = fs::path(file).lexically_normal().lexically_relative(root.lexically_normal());
    d.group_names.push_back(name.empty() || name == "." ? fs::path(file).filename().string() : name.string());
    for (int64_t e = first; e < last; ++e) {
      const auto* begin = reinterpret_cast<const uint8_t*>(examples[e].data());
      d.bytes.insert(d.bytes.end(), begin, begin + (context + 1) * sizeof(int32_t));
      d.groups.push_back(group);
      ++d.size;
    }
  }
  if (d.size == 0) {
    return absl::InvalidArgumentError(absl::StrCat("instruct: ", path, " holds no ", train ? "training" : "test",
                                                   " example with a response within ", context + 1, " tokens (",
                                                   untrained, " examples cut before their response)"));
  }
  d.labels.assign(d.size, 0);
  d.bytes_per_token = tokens > 0 ? static_cast<double>(text_bytes) / tokens : 1;
  return d;
}

}  // namespace cleave
