// The data section of a job config: the server's test set (core/config_section.h; the
// job layer registers it, job/job.cc). Clients name their own data on their
// command line; `cleave local` takes local.data.
#pragma once

#include <cstdint>
#include <string>

#include "core/config_section.h"

namespace cleave {

struct DataConfig {
  // data.test: the server's test set (a data spec); "" = none, no server evaluation
  std::string test = "fmnist:/usr/share/datasets/fashion-mnist";
  int64_t test_limit = 0;        // data.test_limit: evaluate on the first N; 0 = all
  // data.dataset: under a daemon, the name of the dataset the clients train on (what a
  // long-lived client exposes with --dataset NAME=SPEC); "" = each client's --data
  std::string dataset;
};

void ReadData(ConfigSection& s, DataConfig& c);
Status CheckData(DataConfig& c);

}  // namespace cleave
