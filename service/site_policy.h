// What a site lets the daemon's jobs do with its data (cleave-client --site-policy FILE):
// a YAML file read when the client starts, refused naming its line if it does not parse.
//
//   datasets:                  # the datasets jobs may use, and who may submit them
//     xray: [alice, bob]       # a job on xray is accepted from alice or bob
//     notes: ["*"]             # from anyone
//   models: [mlp, lenet5]      # model kinds accepted (absent: any)
//   max_parameters: 5000000    # the model's elements, trained and frozen (absent: any)
//   max_rounds: 200            # run.rounds at most
//   require_secure_aggregation: true
//   max_dp_epsilon: 8          # jobs must run DP with dp.target_epsilon in (0, 8]
//   max_concurrent_jobs: 1     # jobs trained at once (default 1)
//   max_rounds_per_day: 500    # tasks trained over any 24 hours, all jobs (absent: any)
//   max_training_hours_per_day: 6   # hours of training over any 24 hours (absent: any)
//
// A dataset the file does not name is open to no job. Without a file a client accepts
// every job on a dataset it exposes, one at a time.
#pragma once

#include <string>

#include "cleave/v1/pool.pb.h"
#include "core/status.h"

namespace cleave {

// The policy in `yaml`; `name` (the file's path) prefixes its errors.
StatusOr<v1::SitePolicy> ParseSitePolicy(const std::string& yaml, const std::string& name);
StatusOr<v1::SitePolicy> LoadSitePolicy(const std::string& path);

// The dataset a job reads on a client: data.dataset, or "default" (the client's --data).
std::string DatasetOf(const v1::JobSummary& job);

// Whether the site that said `hello` (its datasets and policy) accepts `job`: OK, or
// PERMISSION_DENIED with the site's reason (the first rule the job breaks). A parameter
// count of 0 (not known yet, at submission) passes max_parameters.
Status SiteAccepts(const v1::PoolHello& hello, const v1::JobSummary& job);

// How many jobs the site trains at once.
int MaxConcurrentJobs(const v1::SitePolicy& policy);

}  // namespace cleave
