// Chat templates: the Jinja templates of Hugging Face's tokenizer_config.json
// (`chat_template`) that turn a conversation into a model's prompt, rendered as
// transformers renders them (jinja2 with trim_blocks and lstrip_blocks, its tojson and
// raise_exception). No C++ Jinja engine is in Debian, so this is the subset those
// templates use:
//   {{ expr }}, {% if %}/{% elif %}/{% else %}, {% for x in xs [if cond] %} with loop.*
//   and {% else %}, {% set x = expr %}, {% set ns.attr = expr %}, {% set x %}...{% endset %},
//   {% macro %}, {% generation %}, {# comments #} and whitespace control (-);
//   literals, lists, dicts, attributes, subscripts and slices, ternaries, the operators
//   (+ - * / // % ~ == != < > <= >= and or not in is), string methods (startswith,
//   endswith, split, strip, lstrip, rstrip, upper, lower, replace, title, format-free),
//   dict methods (items, keys, values, get), the filters (trim, tojson, length, count,
//   upper, lower, string, default, first, last, join, reverse, list, replace, int,
//   float, abs, capitalize, title, items, safe, indent, map(attribute=)), the tests
//   (defined, undefined, none, string, number, integer, float, mapping, iterable,
//   sequence, boolean, true, false, odd, even) and namespace(), range(),
//   raise_exception() and strftime_now().
// As in jinja2, an undefined value prints as "" but taking an attribute or an item of
// one is an error (a typo such as `mesage.content` does not render an empty prompt).
// Integers are 64-bit: arithmetic past that range is an error, not Python's big integer.
//
// Templates and the data rendered through them come from files nobody vetted, so parsing
// is linear in the template and bounded in depth, and every render draws on a
// TemplateBudget: a step for each expression evaluated and statement run, and for each
// element of a value copied or made, a bound on the bytes of any string made (the output
// included) and on how deeply calls, loops and values nest. An exhausted budget is an
// error, never a crash, a hang or memory past the bound.
// Tested against @huggingface/jinja, an independent renderer (tests/data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace cleave {

struct TemplateBudget {
  // Expressions evaluated, statements run and elements of values copied or made; shared
  // by the renders that draw on the same budget (the renders of one chat's examples).
  int64_t steps = 20'000'000;
  // The longest string one render may make, its output included.
  int64_t bytes = 16 << 20;
  // How deeply expressions, statements, loops and macro calls may nest while rendering,
  // and values (lists in lists) built.
  int depth = 200;
};

// A parsed template, rendered as often as needed. Cheap to copy (the parsed form is
// shared and immutable); thread-compatible.
class ChatTemplate {
 public:
  // INVALID_ARGUMENT naming the line for a template it cannot parse, or one nested more
  // than 100 deep (blocks, parentheses, operators).
  static StatusOr<ChatTemplate> Parse(const std::string& tmpl);

  // Renders with the variables of `context_json` (a JSON object: messages, bos_token,
  // eos_token, add_generation_prompt, ...; nested at most 64 deep), drawing its steps from
  // *budget. INVALID_ARGUMENT for an error while rendering, an exhausted budget (saying
  // which), or raise_exception(), whose message it carries.
  StatusOr<std::string> Render(const std::string& context_json, TemplateBudget* budget) const;

  struct Parsed;

 private:
  std::shared_ptr<const Parsed> parsed_;
};

// Parse, then Render with a budget of its own.
StatusOr<std::string> RenderChatTemplate(const std::string& tmpl, const std::string& context_json);

}  // namespace cleave
