// The dp and secure_aggregation sections of a job config (core/config_section.h; the
// job layer registers them, job/job.cc). See docs/security.md.
#pragma once

#include <cstdint>
#include <string>

#include "core/config_section.h"
#include "core/names.h"

namespace cleave {

// Differential privacy (DP-FedAvg): clipped client updates, Gaussian noise, an RDP
// accountant.
struct DpConfig {
  bool enabled = false;           // dp.enabled (true when the section is given)
  double noise_multiplier = 1.0;  // dp.noise_multiplier: z, noise std / clipping norm
  double clip = 1.0;              // dp.clip: L2 clipping norm C (the initial one if adaptive)
  bool adaptive = false;          // dp.adaptive: Andrew et al. 2021 quantile clipping
  double target_quantile = 0.5;   // dp.target_quantile: gamma, the unclipped fraction sought
  double clip_lr = 0.2;           // dp.clip_lr: eta_C
  double clip_count_stddev = 0;   // dp.clip_count_stddev: sigma_b (0 = clients per round / 20)
  std::string noise = "central";  // dp.noise: central (server) | distributed (clients)
  double delta = 1e-5;            // dp.delta
  double target_epsilon = 0;      // dp.target_epsilon: stop before exceeding it (0 = none)
};

// Where DP's noise is added (dp.noise).
const NameTable& DpNoiseNames();

// Secure aggregation (SecAgg+, Bell et al. 2020): the server learns only the sum of the
// round's surviving updates.
struct SecureAggregationConfig {
  bool enabled = false;     // secure_aggregation.enabled (true when the section is given)
  int k = 6;                // secure_aggregation.k: neighbours per client
  int t = 4;                // secure_aggregation.t: shares needed to recover a secret
  double clip = 1.0;        // secure_aggregation.clip: coordinates clipped to [-clip, clip]
  int bits = 16;            // secure_aggregation.bits: quantization levels 2^bits
  uint64_t modulus = uint64_t{1} << 32;  // secure_aggregation.modulus: the group Z_M
  double stage_timeout_s = 30;  // secure_aggregation.stage_timeout_s: per key/share/unmask stage
};

void ReadDp(ConfigSection& s, DpConfig& c);
Status CheckDp(DpConfig& c);
void ReadSecureAggregation(ConfigSection& s, SecureAggregationConfig& c);
Status CheckSecureAggregation(SecureAggregationConfig& c);

}  // namespace cleave
