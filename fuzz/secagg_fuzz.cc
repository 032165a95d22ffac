// Fuzzes the server's side of secure aggregation (server/modes/secagg_round.h): a round of
// four clients fed a sequence of stage messages (keys, shares, masked inputs, reveals),
// drops and stage closings, as fuzz_inputs.h frames them. Whatever arrives, the round
// refuses or advances; it never crashes, and Finish is only reached through its checks.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz/fuzz_inputs.h"
#include "privacy/options.h"
#include "server/modes/secagg_round.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  const std::vector<std::string> clients = fuzz::SecAggClients();
  std::unique_ptr<SecAggRound> owner = fuzz::MakeSecAggRound();
  SecAggRound& round = *owner;
  size_t at = 0;
  while (at + 4 <= size) {
    const int op = data[at] % fuzz::kOps;
    const std::string& client = clients[data[at + 1] % fuzz::kSecAggClients];
    const size_t len = data[at + 2] | (size_t{data[at + 3]} << 8);
    at += 4;
    if (len > size - at) break;
    const std::string msg(reinterpret_cast<const char*>(data + at), len);
    at += len;
    switch (op) {
      case fuzz::kKeys: {
        v1::SecAggKeys m;
        if (m.ParseFromString(msg)) (void)round.AddKeys(client, m);
        break;
      }
      case fuzz::kShares: {
        v1::SecAggShares m;
        if (m.ParseFromString(msg)) (void)round.AddShares(client, m);
        break;
      }
      case fuzz::kMasked:
        (void)round.AddMasked(client, msg);
        break;
      case fuzz::kReveal: {
        v1::SecAggReveal m;
        if (m.ParseFromString(msg)) (void)round.AddReveal(client, m);
        break;
      }
      case fuzz::kDrop:
        round.Drop(client);
        break;
      case fuzz::kClose:
        if (round.stage() == SecAggRound::Stage::kDone) {
          (void)round.Finish();
        } else if (!round.CloseStage().ok()) {
          return 0;  // the round aborted: nothing more is accepted
        }
        break;
    }
  }
  return 0;
}
