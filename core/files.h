// Small file helpers with Status errors.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "core/mutex.h"
#include "core/status.h"

namespace cleave {

StatusOr<std::string> ReadFile(const std::string& path);
// A file whose bytes nobody vetted (a model or tokenizer folder's JSON): only a regular
// file (not a link to /dev/zero, a pipe or a device) of at most `max_bytes`, read in
// full. NOT_FOUND if it cannot be opened; INVALID_ARGUMENT naming the path otherwise.
StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes);
// `path` opened for reading in binary, with ReadFile's errors (NOT_FOUND "cannot read
// PATH"; FAILED_PRECONDITION for a directory, which an ifstream would read as empty).
StatusOr<std::ifstream> OpenForReading(const std::string& path);
// Writes `data` to `path` atomically: write to a temporary file beside it, fsync it,
// rename over `path`, fsync the directory. A crash leaves the old or the new file.
Status WriteFileAtomic(const std::string& path, std::string_view data);
// Appends one line (a '\n' is added) and flushes it to disk.
Status AppendLine(const std::string& path, std::string_view line);

// A file held open for appending durable records (an async run's buffer journal).
// Thread-safe.
class AppendFile {
 public:
  // Opens or creates `path` and reads what it holds into *contents.
  static StatusOr<std::unique_ptr<AppendFile>> Open(const std::string& path,
                                                    std::string* contents);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  // Appends `data` and flushes it to disk before returning.
  Status Append(std::string_view data);
  // Keeps the first `size` bytes (0: empties the file), flushed to disk.
  Status Truncate(size_t size);

 private:
  AppendFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  const std::string path_;
  const int fd_;
  Mutex mu_;
};

// The files a run keeps writing, held open from the start: a process whose descriptors
// run out (thousands of connections) can still append a line and replace its state.
// `log` is appended to (AppendLine's contract); `state` is replaced atomically like
// WriteFileAtomic does, through a spare file `state.tmp` that is opened ahead of each
// replacement (right after the previous one closes its descriptor) and removed when the
// RunFiles closes, so a finished run leaves only `log` and `state`. Not thread-safe.
class RunFiles {
 public:
  static StatusOr<std::unique_ptr<RunFiles>> Open(const std::string& dir, const std::string& log,
                                                  const std::string& state);
  ~RunFiles();
  RunFiles(const RunFiles&) = delete;
  RunFiles& operator=(const RunFiles&) = delete;

  Status AppendLog(std::string_view line);
  Status ReplaceState(std::string_view data);

 private:
  RunFiles(std::string dir, std::string log, std::string state)
      : dir_(std::move(dir)), log_(std::move(log)), state_(std::move(state)) {}
  Status OpenSpare();

  const std::string dir_, log_, state_;
  int dir_fd_ = -1, log_fd_ = -1, spare_fd_ = -1;
};

}  // namespace cleave
