// The daemon's dashboard: the page its --metrics-listen serves at /, refreshed every
// 5 s. The jobs /metrics shows (every queued or running job and the 20 that ended last),
// each with its state, progress, accuracy and forecast end, and the clients attached to
// the pool with their datasets and the jobs they hold. Every name and reason on it came
// from a submitter or a client: all of it is escaped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "service/job_store.h"
#include "service/pool.h"

namespace cleave {

std::string DaemonDashboardHtml(const std::vector<JobRecord>& jobs, const std::vector<PoolMemberView>& clients,
                                int64_t resident_bytes);

// The jobs a bounded view shows: every queued or running one, and the `ended` that ended
// last, newest first.
std::vector<const JobRecord*> ShownJobs(const std::vector<JobRecord>& jobs, size_t ended = 20);

}  // namespace cleave
