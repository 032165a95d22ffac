// JSON that nobody vetted (a model folder's config.json, tokenizer files, instruct data,
// a chat template's context): parsed with a bound on how deeply arrays and objects nest,
// so that code walking the result recursively (and nlohmann's own copies and dumps)
// cannot run out of stack, and with the parser's own words for what is wrong.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "core/status.h"

namespace cleave {

// Nesting that no real file of these kinds comes near (a tokenizer.json nests about 6
// deep).
inline constexpr int kMaxJsonDepth = 64;

// `text` parsed. INVALID_ARGUMENT naming `what` with the parser's message (where the
// text goes wrong; NaN, Infinity and numbers past a double's range, which Python's json
// module writes, are not JSON and are named as such) or the depth past `max_depth`.
StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

// ParseJson's, for a JSON object: INVALID_ARGUMENT naming `what` for any other value.
StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, const std::string& what,
                                         int max_depth = kMaxJsonDepth);

}  // namespace cleave
