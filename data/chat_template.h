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
// Tested against @huggingface/jinja, an independent renderer (tests/data).
#pragma once

#include <string>

#include "core/status.h"

namespace cleave {

// Renders `tmpl` with the variables of `context_json` (a JSON object: messages,
// bos_token, eos_token, add_generation_prompt, ...). INVALID_ARGUMENT for a template it
// cannot parse (naming the line), an error while rendering, or raise_exception(), whose
// message it carries.
StatusOr<std::string> RenderChatTemplate(const std::string& tmpl, const std::string& context_json);

}  // namespace cleave
