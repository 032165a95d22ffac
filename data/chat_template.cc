#include "data/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/json.h"
#include "data/jinja.h"

namespace cleave {

struct ChatTemplate::Parsed {
  jinja::Body body;
};

StatusOr<ChatTemplate> ChatTemplate::Parse(const std::string& tmpl) {
  try {
    auto parsed = std::make_shared<Parsed>();
    parsed->body = jinja::ParseTemplate(tmpl);
    ChatTemplate t;
    t.parsed_ = std::move(parsed);
    return t;
  } catch (const jinja::TemplateError& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

StatusOr<std::string> ChatTemplate::Render(const std::string& context_json, TemplateBudget* budget) const {
  ASSIGN_OR_RETURN(nlohmann::json context, ParseJsonObject(context_json, "a chat template's context"));
  try {
    std::string out;
    jinja::RenderTemplate(parsed_->body, std::move(context), budget, &out);
    return out;
  } catch (const jinja::TemplateError& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  } catch (const std::exception& e) {  // nlohmann's type errors: a mistyped value the template meets
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", e.what()));
  }
}

StatusOr<std::string> RenderChatTemplate(const std::string& tmpl, const std::string& context_json) {
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Parse(tmpl));
  TemplateBudget budget;
  return t.Render(context_json, &budget);
}

}  // namespace cleave
