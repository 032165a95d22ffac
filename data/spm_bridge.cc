#include "data/spm_bridge.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"

extern char** environ;

namespace cleave {
namespace {

namespace fs = std::filesystem;

std::string HelperPath() {
  if (const char* env = std::getenv("CLEAVE_SPM"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && fs::exists(self.parent_path() / "cleave-spm", ec)) {
    return (self.parent_path() / "cleave-spm").string();
  }
  return "cleave-spm";  // on PATH
}

// A temporary file removed when this goes out of scope.
struct TempFile {
  TempFile() {
    static int counter = 0;
    path = (fs::temp_directory_path() /
            absl::StrCat("cleave-spm-", getpid(), "-", ++counter)).string();
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
  std::string path;
};

// Runs the helper with `args`; its stdout goes to `out` when not null. The error names
// what the helper wrote to stderr.
Status RunHelper(const std::vector<std::string>& args, std::string* out = nullptr) {
  const std::string helper = HelperPath();
  TempFile stdout_file, stderr_file;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_file.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_file.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<std::string> argv = {helper};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, helper.c_str(), &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    return absl::NotFoundError(absl::StrCat("cannot run the SentencePiece helper ", helper, ": ",
                                            std::strerror(err), " (build cleave-spm or set CLEAVE_SPM)"));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    auto message = ReadFile(stderr_file.path);
    std::string text = message.ok() ? *message : "";
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
      return absl::NotFoundError(absl::StrCat("cannot run the SentencePiece helper ", helper,
                                              " (build cleave-spm or set CLEAVE_SPM)"));
    }
    return absl::InvalidArgumentError(text.empty() ? "the SentencePiece helper failed" : text);
  }
  if (out != nullptr) {
    ASSIGN_OR_RETURN(*out, ReadFile(stdout_file.path));
  }
  return absl::OkStatus();
}

void PutU64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace

StatusOr<SpmProcessor> SpmProcessor::Load(const std::string& path) {
  std::string info;
  if (Status s = RunHelper({"info", path}, &info); !s.ok()) {
    if (s.code() == absl::StatusCode::kNotFound) return s;
    return absl::DataLossError(
        absl::StrCat("tokenizer ", path, " is not a SentencePiece model: ", s.message()));
  }
  SpmProcessor p;
  p.path_ = path;
  std::istringstream in(info);
  std::string vocab_word, eos_word;
  if (!(in >> vocab_word >> p.vocab_ >> eos_word >> p.eos_) || p.vocab_ < 1) {
    return absl::InternalError("the SentencePiece helper answered '" + info + "'");
  }
  return p;
}

StatusOr<std::vector<std::vector<int32_t>>> SpmProcessor::Encode(
    const std::vector<std::string>& texts) const {
  TempFile in, out;
  std::string records;
  for (const std::string& t : texts) {
    PutU64(records, t.size());
    records += t;
  }
  RETURN_IF_ERROR(WriteFileAtomic(in.path, records));
  RETURN_IF_ERROR(RunHelper({"encode", path_, in.path, out.path}));
  ASSIGN_OR_RETURN(std::string ids, ReadFile(out.path));
  std::vector<std::vector<int32_t>> result;
  size_t pos = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    uint64_t n = 0;
    if (ids.size() - pos < 8) return absl::InternalError("the SentencePiece helper's output is short");
    std::memcpy(&n, ids.data() + pos, 8);
    pos += 8;
    if ((ids.size() - pos) / 4 < n) return absl::InternalError("the SentencePiece helper's output is short");
    std::vector<int32_t> v(n);
    std::memcpy(v.data(), ids.data() + pos, n * 4);
    pos += n * 4;
    result.push_back(std::move(v));
  }
  return result;
}

StatusOr<std::string> SpmProcessor::Decode(const std::vector<int32_t>& ids) const {
  TempFile in, out;
  std::string data;
  PutU64(data, ids.size());
  data.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  RETURN_IF_ERROR(WriteFileAtomic(in.path, data));
  RETURN_IF_ERROR(RunHelper({"decode", path_, in.path, out.path}));
  return ReadFile(out.path);
}

Status TrainSpm(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"train"};
  args.insert(args.end(), flags.begin(), flags.end());
  return RunHelper(args);
}

}  // namespace cleave
