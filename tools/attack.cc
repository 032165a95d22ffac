#include "tools/attack.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/files.h"
#include "split/attacks.h"
#include "split/record.h"

namespace cleave {

int RunTokenAttack(const std::string& run_dir, std::ostream& out, std::ostream& err) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(run_dir) / "record";
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && it->path().extension() == ".pb") files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    err << "cleave attack tokens: no records under " << root.string()
        << " (run the job with split.record: N, split learning at split.cut: 1)\n";
    return 2;
  }
  TokenRecovery total;
  for (const fs::path& f : files) {
    const std::string name = fs::relative(f, root).string();
    StatusOr<std::string> bytes = ReadFile(f.string());
    StatusOr<SplitRecord> record = bytes.ok() ? DecodeSplitRecord(*bytes) : StatusOr<SplitRecord>(bytes.status());
    StatusOr<TokenRecovery> r = record.ok() ? RecoverTokensAtTheEmbedding(*record) : StatusOr<TokenRecovery>(record.status());
    if (!r.ok()) {
      err << "cleave attack tokens: " << name << ": " << r.status().message() << "\n";
      return 2;
    }
    out << absl::StrFormat("%s: recovered %d of %d tokens (%.2f %%)\n", name, r->recovered, r->checked, 100 * r->rate());
    total.checked += r->checked;
    total.recovered += r->recovered;
  }
  out << absl::StrFormat("total: recovered %d of %d tokens (%.2f %%)\n", total.recovered, total.checked,
                         100 * total.rate());
  return 0;
}

}  // namespace cleave
