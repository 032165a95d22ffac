// Fuzzes what a daemon's pool reads from a client (a PoolUp message: its hello's
// datasets, policy and held jobs, or a pause) and what a client reads as its site policy
// (YAML): a hello or a pause is accepted or INVALID_ARGUMENT, a policy file parsed or
// INVALID_ARGUMENT, and a site's verdict on a job is OK or PERMISSION_DENIED, never
// anything else.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cleave/v1/pool.pb.h"
#include "service/pool.h"
#include "service/site_policy.h"

namespace {

void CheckVerdict(const cleave::v1::PoolHello& hello) {
  cleave::v1::JobSummary job;
  job.set_submitter("alice");
  job.set_model("mlp");
  job.set_parameters(100000);
  job.set_rounds(10);
  for (const char* dataset : {"", "xray"}) {
    job.set_dataset(dataset);
    const cleave::Status s = cleave::SiteAccepts(hello, job);
    if (!s.ok() && s.code() != absl::StatusCode::kPermissionDenied) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  cleave::v1::PoolUp up;
  if (up.ParseFromString(bytes) && up.has_hello()) {
    const cleave::Status s = cleave::CheckHello(up.hello());
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
    if (s.ok()) CheckVerdict(up.hello());
  }
  if (up.has_pause()) {
    const cleave::Status s = cleave::CheckPause(up.pause(), 1'800'000'000'000);
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) std::abort();
  }
  auto policy = cleave::ParseSitePolicy(bytes, "fuzz/site.yaml");
  if (!policy.ok()) {
    if (policy.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  cleave::v1::PoolHello hello;
  hello.add_datasets()->set_name("xray");
  hello.add_datasets()->set_name("default");
  *hello.mutable_policy() = *policy;
  CheckVerdict(hello);
  return 0;
}
