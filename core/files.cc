#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::ifstream> OpenForReading(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is a directory, not a file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  return in;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::ifstream in, OpenForReading(path));
  std::error_code ec;
  // Straight into a string of the file's size (a stringstream and its str() held the
  // file up to three times over at once); then whatever follows, for files that grow or
  // report no size (pipes, /proc).
  std::string out;
  const auto size = std::filesystem::file_size(path, ec);
  if (!ec && size > 0) {
    out.resize(size);
    in.read(out.data(), static_cast<std::streamsize>(size));
    out.resize(static_cast<size_t>(in.gcount()));
  }
  char buf[1 << 16];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) out.append(buf, static_cast<size_t>(in.gcount()));
  if (in.bad()) return absl::DataLossError(absl::StrCat("error while reading ", path));
  return out;
}

StatusOr<std::string> ReadBoundedFile(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  struct stat st {};
  std::string out;
  Status s;
  if (::fstat(fd, &st) != 0) {
    s = Errno("stat", path);
  } else if (!S_ISREG(st.st_mode)) {
    s = absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  } else if (st.st_size > max_bytes) {
    s = absl::InvalidArgumentError(
        absl::StrCat(path, " holds ", st.st_size, " bytes, over the limit of ", max_bytes, " for such a file"));
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t at = 0;
    while (at < out.size()) {  // a file that shrinks while read ends early
      const ssize_t n = ::read(fd, out.data() + at, out.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = Errno("read", path);
        break;
      }
      if (n == 0) break;
      at += static_cast<size_t>(n);
    }
    out.resize(at);
  }
  ::close(fd);
  if (!s.ok()) return s;
  return out;
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp);
  Status s = WriteAll(fd, data, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("fsync", tmp);
  ::close(fd);
  if (!s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename", tmp);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

Status AppendLine(const std::string& path, std::string_view line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path);
  std::string buf(line);
  buf.push_back('\n');
  Status s = WriteAll(fd, buf, path);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("fsync", path);
  ::close(fd);
  return s;
}

StatusOr<std::unique_ptr<RunFiles>> RunFiles::Open(const std::string& dir, const std::string& log,
                                                   const std::string& state) {
  std::unique_ptr<RunFiles> f(new RunFiles(dir, log, state));
  f->dir_fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (f->dir_fd_ < 0) return Errno("open", dir);
  f->log_fd_ = ::openat(f->dir_fd_, log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (f->log_fd_ < 0) return Errno("open", dir + "/" + log);
  RETURN_IF_ERROR(f->OpenSpare());
  return f;
}

RunFiles::~RunFiles() {
  if (spare_fd_ >= 0) ::unlinkat(dir_fd_, (state_ + ".tmp").c_str(), 0);  // unused: nothing to keep
  for (int fd : {spare_fd_, log_fd_, dir_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

Status RunFiles::OpenSpare() {
  const std::string tmp = state_ + ".tmp";
  spare_fd_ = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (spare_fd_ < 0) return Errno("open", dir_ + "/" + tmp);
  return absl::OkStatus();
}

Status RunFiles::AppendLog(std::string_view line) {
  std::string buf(line);
  buf.push_back('\n');
  const std::string path = dir_ + "/" + log_;
  RETURN_IF_ERROR(WriteAll(log_fd_, buf, path));
  if (::fsync(log_fd_) != 0) return Errno("fsync", path);
  return absl::OkStatus();
}

Status RunFiles::ReplaceState(std::string_view data) {
  const std::string tmp = state_ + ".tmp";
  const std::string path = dir_ + "/" + tmp;
  if (spare_fd_ < 0) RETURN_IF_ERROR(OpenSpare());  // the last reopening failed
  if (::ftruncate(spare_fd_, 0) != 0) return Errno("truncate", path);
  if (::lseek(spare_fd_, 0, SEEK_SET) < 0) return Errno("seek", path);
  RETURN_IF_ERROR(WriteAll(spare_fd_, data, path));
  if (::fsync(spare_fd_) != 0) return Errno("fsync", path);
  if (::renameat(dir_fd_, tmp.c_str(), dir_fd_, state_.c_str()) != 0) return Errno("rename", path);
  ::fsync(dir_fd_);
  // The spare is now the state file; the next replacement gets a new spare, opened in
  // the descriptor this one frees.
  ::close(spare_fd_);
  spare_fd_ = -1;
  OpenSpare().IgnoreError();  // retried by the next ReplaceState
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<AppendFile>> AppendFile::Open(const std::string& path,
                                                      std::string* contents) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", path);
  std::unique_ptr<AppendFile> f(new AppendFile(path, fd));
  contents->clear();
  char buf[1 << 16];
  for (off_t at = 0;;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0) return Errno("read", path);
    if (n == 0) break;
    contents->append(buf, static_cast<size_t>(n));
    at += n;
  }
  return f;
}

AppendFile::~AppendFile() { ::close(fd_); }

Status AppendFile::Append(std::string_view data) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(WriteAll(fd_, data, path_));
  if (::fdatasync(fd_) != 0) return Errno("fsync", path_);
  return absl::OkStatus();
}

Status AppendFile::Truncate(size_t size) {
  MutexLock l(&mu_);
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) return Errno("truncate", path_);
  if (::fdatasync(fd_) != 0) return Errno("fsync", path_);
  return absl::OkStatus();
}

}  // namespace cleave
