#include "core/json.h"

#include <algorithm>

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
  } catch (const Json::parse_error& e) {
    // The parser stops at a literal it does not know: say what Python meant by it.
    const std::string_view at = text.substr(e.byte > 0 ? std::min<size_t>(e.byte - 1, text.size()) : 0);
    const bool python = at.rfind("NaN", 0) == 0 || at.rfind("Infinity", 0) == 0 || at.rfind("-Infinity", 0) == 0;
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": not valid JSON: ", e.what(),
        python ? " (NaN and Infinity are not JSON numbers; Python's json.dump writes them unless allow_nan=False)"
               : ""));
  } catch (const Json::exception& e) {  // a number past a double's range, ...
    return absl::InvalidArgumentError(absl::StrCat(what, ": not valid JSON: ", e.what()));
  }
}

StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& what, int max_depth) {
  ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, what, max_depth));
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a JSON object"));
  return j;
}

}  // namespace cleave
