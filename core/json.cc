#include "core/json.h"

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

struct TooDeep {};

}  // namespace

StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& what, int max_depth) {
  using Json = nlohmann::json;
  auto deep = [max_depth](int depth, Json::parse_event_t, Json&) {
    if (depth >= max_depth) throw TooDeep{};  // depth counts from 0: the outermost value's
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), deep);
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": arrays and objects nested more than ", max_depth, " deep"));
  } catch (const Json::exception& e) {
    std::string hint;
    for (const char* word : {"NaN", "Infinity"}) {
      if (text.find(word) != std::string_view::npos) {
        hint = " (NaN and Infinity are not JSON numbers; Python's json.dump writes them unless allow_nan=False)";
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON: ", e.what(), hint));
  }
}

StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& what, int max_depth) {
  ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what, max_depth));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  return j;
}

}  // namespace cleave
