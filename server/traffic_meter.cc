#include "server/traffic_meter.h"

namespace cleave {

void TrafficMeter::StartRound() {
  up_ = 0;
  down_ = 0;
  saved_up_ = 0;
  saved_down_ = 0;
  updates_ = 0;
}

TrafficMeter::Round TrafficMeter::RoundSoFar() const {
  Round r;
  r.up = up_;
  r.down = down_;
  r.up_fp32 = r.up + saved_up_;
  r.down_fp32 = r.down + saved_down_;
  r.updates = updates_;
  return r;
}

}  // namespace cleave
