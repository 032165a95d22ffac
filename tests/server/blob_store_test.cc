// The coordinator's blob store: pinned blobs stay for the run, model versions as many
// as tasks may still fetch, a round's blobs until the next model; each with its fp32
// size.
#include "server/blob_store.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace cleave {
namespace {

std::shared_ptr<const std::string> Bytes(const std::string& s) {
  return std::make_shared<const std::string>(s);
}

TEST(BlobStoreTest, KeepsPinnedBlobsAndTheNewestModelVersions) {
  BlobStore s;
  s.Pin("archive", Bytes("torchscript"));
  s.PublishModel("m1", Bytes("one"), 12, /*versions_kept=*/2);
  s.PublishModel("m2", Bytes("two"), 12, 2);
  EXPECT_TRUE(s.Has("m1") && s.Has("m2") && s.Has("archive"));
  s.PublishModel("m3", Bytes("three"), 12, 2);
  EXPECT_FALSE(s.Has("m1"));
  EXPECT_TRUE(s.Has("m2") && s.Has("m3") && s.Has("archive"));
  EXPECT_EQ(s.size(), 3u);
  s.PublishModel("m4", Bytes("four"), 12, 1);  // synchronous rounds keep one
  EXPECT_FALSE(s.Has("m2") || s.Has("m3"));
  EXPECT_TRUE(s.Has("m4") && s.Has("archive"));
}

TEST(BlobStoreTest, ARoundsBlobsGoWhenTheNextModelIsPublished) {
  BlobStore s;
  s.PublishModel("m1", Bytes("one"), 10, 1);
  s.Add("part-at-2", Bytes("part"), 40);
  ASSERT_TRUE(s.Has("part-at-2"));
  s.PublishModel("m2", Bytes("two"), 10, 1);
  EXPECT_FALSE(s.Has("part-at-2"));
  const auto gone = s.Find("part-at-2");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gone.status().message().find("no blob part-at-2"), std::string::npos) << gone.status();
}

TEST(BlobStoreTest, FindsABlobWithItsFp32Size) {
  BlobStore s;
  s.Pin("probe", Bytes("0123456789"));
  s.Add("part", Bytes("abc"), 12);
  s.PublishModel("model", Bytes("int8!"), 20, 1);
  const auto probe = s.Find("probe");
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(*probe->blob, "0123456789");
  EXPECT_EQ(probe->fp32_size, 10);  // its own size: nothing was compressed
  const auto model = s.Find("model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->blob, "int8!");
  EXPECT_EQ(model->fp32_size, 20);
  EXPECT_EQ(s.Find("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(BlobStoreTest, APinnedBlobIsNamedByItsOwnDigest) {
  BlobStore s;
  const BlobRef ref = s.Pin(Bytes("abc"));
  // SHA-256 of "abc" (FIPS 180-2's first example).
  EXPECT_EQ(ref.digest, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ref.size, 3);
  s.PublishModel("m", Bytes("model"), 5, 1);
  ASSERT_TRUE(s.Has(ref.digest));
  EXPECT_EQ(*s.Find(ref.digest)->blob, "abc");
}

}  // namespace
}  // namespace cleave
