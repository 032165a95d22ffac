#include "data/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "data/jinja.h"

namespace cleave {

struct ChatTemplate::Parsed {
  jinja::Body body;
};

namespace {

// The engine's error, said to be the chat template's.
Status Named(const Status& s) { return absl::InvalidArgumentError(absl::StrCat("chat template: ", s.message())); }

}  // namespace

StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& tmpl) {
  auto parsed = std::make_shared<Parsed>();
  StatusOr<jinja::Body> body = jinja::ParseTemplate(tmpl);
  if (!body.ok()) return Named(body.status());
  parsed->body = *std::move(body);
  ChatTemplate t;
  t.parsed_ = std::move(parsed);
  return t;
}

StatusOr<std::string> ChatTemplate::Render(const std::string& context_json, TemplateBudget* budget) const {
  ASSIGN_OR_RETURN(nlohmann::json context, ParseJsonObject(context_json, "a chat template's context"));
  std::string out;
  try {
    const Status rendered = jinja::RenderTemplate(parsed_->body, std::move(context), budget, &out);
    if (!rendered.ok()) return Named(rendered);
  } catch (const nlohmann::json::exception& e) {  // a library type check the engine's own did not make first
    return Named(absl::InternalError(e.what()));
  }
  return out;
}

StatusOr<std::string> RenderChatTemplate(const std::string& tmpl, const std::string& context_json) {
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  TemplateBudget budget;
  return t.Render(context_json, &budget);
}

}  // namespace cleave
