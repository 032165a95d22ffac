// Test helpers: a Dataset of 8-bit images written out in the formats users bring (PNG or
// JPEG class folders, CIFAR binary batches, CSV), so that loading them back can be
// checked against the original, and a federation on them against the IDX path.
#pragma once

#include <stb/stb_image_write.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/dataset.h"

namespace cleave::testing {

// DIR/<label>/<index>.png (or .jpg), grey images as they are.
inline void WriteImageFolder(const Dataset& d, const std::filesystem::path& dir, bool jpeg = false) {
  const int c = static_cast<int>(d.shape[0]), h = static_cast<int>(d.shape[1]),
            w = static_cast<int>(d.shape[2]);
  std::vector<uint8_t> hwc(static_cast<size_t>(c) * h * w);
  for (int64_t i = 0; i < d.size; ++i) {
    const uint8_t* chw = d.bytes.data() + i * d.example_bytes();
    for (int y = 0; y < h * w; ++y) {
      for (int k = 0; k < c; ++k) hwc[y * c + k] = chw[k * h * w + y];
    }
    const auto class_dir = dir / ("class" + std::to_string(d.labels[i]));
    std::filesystem::create_directories(class_dir);
    char name[32];
    std::snprintf(name, sizeof(name), "%06ld.%s", static_cast<long>(i), jpeg ? "jpg" : "png");
    const std::string path = (class_dir / name).string();
    if (jpeg) {
      stbi_write_jpg(path.c_str(), w, h, c, hwc.data(), 95);
    } else {
      stbi_write_png(path.c_str(), w, h, c, hwc.data(), w * c);
    }
  }
}

// CIFAR-10 binary records (label, then 3x32x32 planes) of grey 28x28 images centred
// in 32x32 and repeated in each colour plane, `per_file` records per batch file
// (data_batch_1.bin, ...; or test_batch.bin when !train).
inline void WriteCifar10(const Dataset& d, const std::filesystem::path& dir, bool train,
                         int64_t per_file = 10000) {
  std::filesystem::create_directories(dir);
  std::ofstream out;
  for (int64_t i = 0; i < d.size; ++i) {
    if (i % per_file == 0) {
      out.close();
      out.open(dir / (train ? "data_batch_" + std::to_string(i / per_file + 1) + ".bin"
                            : std::string("test_batch.bin")),
               std::ios::binary);
    }
    std::vector<char> record(1 + 3 * 32 * 32, 0);
    record[0] = static_cast<char>(d.labels[i]);
    const uint8_t* px = d.bytes.data() + i * d.example_bytes();
    for (int c = 0; c < 3; ++c) {
      for (int y = 0; y < 28; ++y) {
        for (int x = 0; x < 28; ++x) record[1 + c * 1024 + (y + 2) * 32 + x + 2] = px[y * 28 + x];
      }
    }
    out.write(record.data(), record.size());
  }
}

// A CSV table: a header "p0,...,pN,label", one row per example, pixel / 255 values.
inline void WriteCsv(const Dataset& d, const std::filesystem::path& path) {
  std::ofstream out(path);
  const int64_t n = d.example_elements();
  for (int64_t j = 0; j < n; ++j) out << "p" << j << ",";
  out << "label\n";
  char buf[32];
  for (int64_t i = 0; i < d.size; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t v = d.bytes[i * n + j];
      if (v == 0) {
        out << "0,";
      } else {
        std::snprintf(buf, sizeof(buf), "%.6g,", v / 255.0);
        out << buf;
      }
    }
    out << d.labels[i] << "\n";
  }
}

}  // namespace cleave::testing
