// Image folders: DIR/CLASS/IMAGE (or DIR/GROUP/CLASS/IMAGE with the groups option), PNG
// or JPEG (and the other formats stb_image decodes), decoded to grey or RGB and resized.
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "data/sources.h"

namespace cleave {
namespace fs = std::filesystem;
namespace {

// The sorted subdirectories of `dir`.
StatusOr<std::vector<std::string>> Subdirectories(const fs::path& dir) {
  std::error_code ec;
  std::vector<std::string> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) out.push_back(it->path().filename().string());
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  std::sort(out.begin(), out.end());
  return out;
}

bool IsImage(const fs::path& p) {
  static const std::set<std::string> kExtensions = {".png", ".jpg", ".jpeg", ".bmp", ".gif",
                                                    ".ppm", ".pgm", ".tga"};
  return kExtensions.count(absl::AsciiStrToLower(p.extension().string())) > 0;
}

// "HxW" or "N" (square).
Status ParseSize(const std::string& s, int64_t* h, int64_t* w) {
  std::vector<std::string> parts = absl::StrSplit(s, 'x');
  const bool ok = (parts.size() == 1 && absl::SimpleAtoi(parts[0], h) && (*w = *h, true)) ||
                  (parts.size() == 2 && absl::SimpleAtoi(parts[0], h) && absl::SimpleAtoi(parts[1], w));
  if (!ok || *h < 1 || *w < 1 || *h > 4096 || *w > 4096) {
    return absl::InvalidArgumentError("folder size=HxW (or size=N): got '" + s + "'");
  }
  return absl::OkStatus();
}

using FilesByClass = std::map<std::string, std::vector<std::pair<int, fs::path>>>;

// The images of each class folder (by class name: the union over groups), each with the
// index of its group folder in `group_dirs`, in sorted order.
StatusOr<FilesByClass> ListImages(const fs::path& root, const std::vector<std::string>& group_dirs) {
  FilesByClass files_by_class;
  std::error_code ec;
  for (size_t g = 0; g < group_dirs.size(); ++g) {
    ASSIGN_OR_RETURN(auto classes, Subdirectories(root / group_dirs[g]));
    for (const std::string& cls : classes) {
      const fs::path class_dir = root / group_dirs[g] / cls;
      std::vector<fs::path> images;
      for (fs::directory_iterator it(class_dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->is_regular_file(ec) && IsImage(it->path())) images.push_back(it->path());
      }
      if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", class_dir.string()));
      if (images.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(class_dir.string(), ": no images (PNG, JPEG, ...)"));
      }
      std::sort(images.begin(), images.end());
      auto& list = files_by_class[cls];
      for (auto& p : images) list.emplace_back(static_cast<int>(g), std::move(p));
    }
  }
  return files_by_class;
}

// Decodes images into planar (CHW) bytes, all of one size: size=HxW, else the first
// decoded image's.
class ImageDecoder {
 public:
  ImageDecoder(int64_t channels, int64_t height, int64_t width)
      : channels_(channels), height_(height), width_(width), resize_(height > 0) {}

  Status Decode(const fs::path& path, std::vector<uint8_t>& out) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(path.string()));
    int w = 0, h = 0, n = 0;
    unsigned char* px = stbi_load_from_memory(reinterpret_cast<const unsigned char*>(bytes.data()),
                                              static_cast<int>(bytes.size()), &w, &h, &n,
                                              static_cast<int>(channels_));
    if (px == nullptr) {
      return absl::DataLossError(absl::StrCat(path.string(), ": cannot decode: ", stbi_failure_reason()));
    }
    std::unique_ptr<unsigned char, void (*)(void*)> owned(px, stbi_image_free);
    if (height_ == 0) {
      height_ = h;
      width_ = w;
      first_file_ = path.string();
    }
    const size_t plane = static_cast<size_t>(height_ * width_);
    std::vector<unsigned char> resized;
    const unsigned char* src = px;
    if (h != height_ || w != width_) {
      if (!resize_) {
        return absl::InvalidArgumentError(absl::StrCat(
            path.string(), " is ", h, "x", w, " but ", first_file_, " is ", height_, "x", width_,
            ": images of mixed sizes need size=HxW"));
      }
      resized.resize(plane * channels_);
      if (!stbir_resize_uint8(px, w, h, 0, resized.data(), static_cast<int>(width_),
                              static_cast<int>(height_), 0, static_cast<int>(channels_))) {
        return absl::InternalError(absl::StrCat(path.string(), ": resize failed"));
      }
      src = resized.data();
    }
    // Interleaved (HWC) to planar (CHW).
    out.resize(plane * channels_);
    for (size_t i = 0; i < plane; ++i) {
      for (int64_t c = 0; c < channels_; ++c) out[c * plane + i] = src[i * channels_ + c];
    }
    return absl::OkStatus();
  }

  std::vector<int64_t> shape() const { return {channels_, height_, width_}; }

 private:
  const int64_t channels_;
  int64_t height_, width_;
  const bool resize_;  // size= given: images of other sizes are resized to it
  std::string first_file_;
};

}  // namespace

StatusOr<Dataset> LoadImageFolder(const std::string& dir, bool train, SpecOptions& o) {
  ASSIGN_OR_RETURN(int64_t channels, o.Int("channels", 3, 1, 3));
  if (channels == 2) return absl::InvalidArgumentError("folder channels=1 (grey) or 3 (RGB)");
  int64_t height = 0, width = 0;
  if (o.Has("size")) RETURN_IF_ERROR(ParseSize(o.String("size", ""), &height, &width));
  const bool grouped = o.Has("groups");

  std::error_code ec;
  fs::path root(dir);
  if (!fs::is_directory(root, ec)) return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  const char* split = train ? "train" : "test";
  if (fs::is_directory(root / split, ec)) root /= split;

  std::vector<std::string> group_dirs = {""};
  if (grouped) {
    ASSIGN_OR_RETURN(group_dirs, Subdirectories(root));
  }
  ASSIGN_OR_RETURN(const FilesByClass files_by_class, ListImages(root, group_dirs));
  if (files_by_class.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(root.string(), ": no class folders",
                                                   grouped ? " in its group folders" : ""));
  }
  Dataset d;
  d.num_classes = static_cast<int>(files_by_class.size());
  d.mean = {0.5f};
  d.stddev = {0.5f};
  if (grouped) d.group_names = group_dirs;
  // The index from the listing; ReadPart decodes the images kept.
  std::vector<const fs::path*> paths;
  int label = 0;
  for (const auto& [cls, files] : files_by_class) {
    for (const auto& [group, path] : files) {
      paths.push_back(&path);
      d.labels.push_back(label);
      if (grouped) d.groups.push_back(group);
      ++d.size;
    }
    ++label;
  }
  ImageDecoder decoder(channels, height, width);
  ASSIGN_OR_RETURN(d, ReadPart(o, std::move(d), [&](int64_t example, std::vector<uint8_t>& out) {
                     return decoder.Decode(*paths[example], out);
                   }));
  d.shape = decoder.shape();
  return d;
}

}  // namespace cleave
