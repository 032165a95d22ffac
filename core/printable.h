// Untrusted text (names, ids and digests a peer sent) made safe to put into an error
// detail or a log line (Printable: at most `max_bytes` bytes of it, every byte outside
// printable ASCII, and the backslash, written as \xNN, and a note of the length when
// cut), or into HTML (HtmlEscape).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace cleave {

inline std::string Printable(std::string_view s, size_t max_bytes = 80) {
  std::string out;
  const size_t n = s.size() < max_bytes ? s.size() : max_bytes;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (n < s.size()) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// Text made safe to put into HTML, in an element or a quoted attribute.
inline std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace cleave
