#include "data/byte_level.h"

#include <queue>
#include <unordered_map>

namespace cleave {

const std::vector<uint32_t>& ByteToCodePoint() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : next++;
    }
    return t;
  }();
  return table;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t NextCodePoint(const std::string& s, size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return b;
  }
  uint32_t cp = len == 1 ? b : b & (0xFF >> (len + 1));
  for (int k = 1; k < len; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 2) {
      ++i;
      return b;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  i += len;
  return cp;
}

int ByteOfCodePoint(uint32_t cp) {
  static const std::unordered_map<uint32_t, int> inverse = [] {
    std::unordered_map<uint32_t, int> m;
    const auto& t = ByteToCodePoint();
    for (int b = 0; b < 256; ++b) m[t[b]] = b;
    return m;
  }();
  const auto it = inverse.find(cp);
  return it == inverse.end() ? -1 : it->second;
}

std::vector<std::string> MergeByRank(std::vector<std::string> parts,
                                     const std::function<int(const std::string&, const std::string&)>& rank) {
  // A heap of the adjacent pairs by (rank, position), over a linked list of the parts:
  // O(n log n) for long words. A BPE merge's parts come from earlier merges, so a pair
  // that merging creates ranks after the merge that created it, and this order is the
  // one above.
  const int n = static_cast<int>(parts.size());
  std::vector<int> next(n), prev(n);
  std::vector<int> version(n, 0);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Pair {
    int rank, left, right, left_version, right_version;
    bool operator>(const Pair& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Pair, std::vector<Pair>, std::greater<Pair>> heap;
  auto push = [&](int l) {
    const int r = l < 0 ? -1 : next[l];
    if (r < 0) return;
    const int k = rank(parts[l], parts[r]);
    if (k >= 0) heap.push({k, l, r, version[l], version[r]});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Pair p = heap.top();
    heap.pop();
    if (next[p.left] != p.right || version[p.left] != p.left_version || version[p.right] != p.right_version) {
      continue;  // one side merged since
    }
    parts[p.left] += parts[p.right];
    ++version[p.left];
    ++version[p.right];
    next[p.left] = next[p.right];
    if (next[p.left] >= 0) prev[next[p.left]] = p.left;
    next[p.right] = -1;
    push(prev[p.left]);
    push(p.left);
  }
  std::vector<std::string> out;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(std::move(parts[i]));
  return out;
}

}  // namespace cleave
