#include "privacy/options.h"

namespace cleave {

const NameTable& DpNoiseNames() {
  static const NameTable t{"dp.noise", {"central", "distributed"}};
  return t;
}

void ReadDp(ConfigSection& s, DpConfig& d) {
  if (s.given()) d.enabled = true;
  s.Read("enabled", d.enabled);
  s.Read("noise_multiplier", d.noise_multiplier);
  s.Read("clip", d.clip);
  s.Read("adaptive", d.adaptive);
  s.Read("target_quantile", d.target_quantile);
  s.Read("clip_lr", d.clip_lr);
  s.Read("clip_count_stddev", d.clip_count_stddev);
  s.Read("noise", d.noise);
  s.Read("delta", d.delta);
  s.Read("target_epsilon", d.target_epsilon);
}

Status CheckDp(DpConfig& d) {
  RETURN_IF_ERROR(Range(d.noise_multiplier > 0, "dp.noise_multiplier", "> 0"));
  RETURN_IF_ERROR(Range(d.clip > 0, "dp.clip", "> 0"));
  RETURN_IF_ERROR(Range(d.target_quantile > 0 && d.target_quantile < 1, "dp.target_quantile",
                        "in (0, 1)"));
  RETURN_IF_ERROR(Range(d.clip_lr >= 0, "dp.clip_lr", ">= 0"));
  RETURN_IF_ERROR(Range(d.clip_count_stddev >= 0, "dp.clip_count_stddev", ">= 0"));
  RETURN_IF_ERROR(DpNoiseNames().Check(d.noise));
  RETURN_IF_ERROR(Range(d.delta > 0 && d.delta < 1, "dp.delta", "in (0, 1)"));
  return Range(d.target_epsilon >= 0, "dp.target_epsilon", ">= 0");
}

void ReadSecureAggregation(ConfigSection& s, SecureAggregationConfig& a) {
  if (s.given()) a.enabled = true;
  s.Read("enabled", a.enabled);
  s.Read("k", a.k);
  s.Read("t", a.t);
  s.Read("clip", a.clip);
  s.Read("bits", a.bits);
  s.Read("modulus", a.modulus);
  s.Read("stage_timeout_s", a.stage_timeout_s);
}

Status CheckSecureAggregation(SecureAggregationConfig& a) {
  RETURN_IF_ERROR(Range(a.k >= 2, "secure_aggregation.k", ">= 2"));
  RETURN_IF_ERROR(Range(a.t >= 2 && a.t <= a.k, "secure_aggregation.t", "in [2, k]"));
  RETURN_IF_ERROR(Range(a.clip > 0, "secure_aggregation.clip", "> 0"));
  RETURN_IF_ERROR(Range(a.bits >= 1 && a.bits <= 32, "secure_aggregation.bits", "in [1, 32]"));
  RETURN_IF_ERROR(Range(a.modulus > (uint64_t{1} << a.bits), "secure_aggregation.modulus",
                        "> 2^bits (and > clients x (2^bits - 1) for sums not to wrap)"));
  return Range(a.stage_timeout_s > 0, "secure_aggregation.stage_timeout_s", "> 0");
}

}  // namespace cleave
