// The server's side of one SecAgg+ round (Bell et al., CCS 2020), without gRPC: who
// reached which stage, what each stage sends each client, the checks on every client
// submission, the running sum of masked inputs and the unmasking. The server's round
// thread drives it; the server's lock serialises all calls.
//
// Stages (U0 = the round's clients; each stage keeps those that answered in time):
//   kKeys    clients send fresh public keys                  -> U1; a k-regular graph on U1
//   kShares  clients send sealed shares for their neighbours -> U2; relayed to addressees
//   kMasked  clients upload masked, quantized updates        -> U3; summed mod M on arrival
//   kUnmask  survivors reveal, per neighbour, the self-seed share of a survivor or the
//            mask-key share of a dropped client (never both)  -> the unmasked sum
// A stage closes when every client still in it has answered or its deadline passed.
// Closing aborts the round (ABORTED; nothing of it is used) when some secret could no
// longer be recovered from t shares, or fewer than t clients remain.
//
// Every submission is checked before it is stored: FAILED_PRECONDITION out of stage or
// from a client not in the stage, ALREADY_EXISTS for a second one, INVALID_ARGUMENT for
// malformed content. A refused submission changes nothing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cleave/v1/cleave.pb.h"
#include "core/status.h"
#include "privacy/options.h"
#include "privacy/secagg.h"

namespace cleave {

// Per-slice masking (width-scaled submodels): a client's masked input holds the values at
// its positions of the summed vector, in its order, and its neighbours are told where
// those are, so that each pair masks the positions both hold (privacy/secagg.h).
struct SecAggSlice {
  std::shared_ptr<const secagg::Positions> positions;
  std::vector<v1::SubmodelPlacement> placement;  // the same positions, as SecAggPeer.placement
};

class SecAggRound {
 public:
  enum class Stage { kKeys, kShares, kMasked, kUnmask, kDone };

  // `clients` take part (graph indices are their positions); updates have `length`
  // elements; `context` binds every key to the run and round; `graph_seed` picks the
  // neighbour graph; updates are scaled by num_examples / `max_weight`.
  SecAggRound(const SecureAggregationConfig& config, std::string context,
              std::vector<std::string> clients, int64_t length, int64_t max_weight,
              uint64_t graph_seed);

  Stage stage() const { return stage_; }
  static const char* StageName(Stage s);
  // Per-slice masking: every client's slice of the `length` values, before the keys
  // stage closes. The neighbour graph then joins each client to at least ceil(k/2) others
  // (as many as there are) whose slices hold its own, so the pair masks cover each of its
  // values. INVALID_ARGUMENT when a client has none, or a position is outside `length`.
  Status SetSlices(const std::map<std::string, std::shared_ptr<const SecAggSlice>>& slices);

  // What each client's Task carries.
  v1::SecAggTask TaskMessage() const;
  // Bytes of `client`'s masked input: little-endian values of 4 bytes (M <= 2^32) or 8,
  // `length` of them, or its slice's.
  int64_t PayloadSize(const std::string& client) const;

  Status AddKeys(const std::string& client, const v1::SecAggKeys& keys);
  Status AddShares(const std::string& client, const v1::SecAggShares& shares);
  Status AddMasked(const std::string& client, const std::string& payload);
  Status AddReveal(const std::string& client, const v1::SecAggReveal& reveal);
  // The client is gone (disconnected, task failed): no stage waits for it any more.
  void Drop(const std::string& client);

  // Every client still in the current stage has answered.
  bool StageComplete() const;
  // Closes the current stage and returns the message for each client of the next one
  // (none after kUnmask). ABORTED when the round cannot go on.
  StatusOr<std::map<std::string, v1::ServerMessage>> CloseStage();

  // After kUnmask closed: the survivors' sum of scaled updates (sum over u of
  // n_u / max_weight * clip(x_u)), dequantized, and who the survivors are.
  struct Result {
    std::vector<double> sum;
    std::vector<std::string> survivors;
  };
  StatusOr<Result> Finish() const;

 private:
  // Index of `client` if it is in `stage_` and still here, else FAILED_PRECONDITION.
  StatusOr<int> InStage(const std::string& client, Stage stage,
                        const std::set<int>& members) const;
  std::set<int> Alive(const std::set<int>& members) const;
  // Bytes of a masked value on the wire: 4 when M <= 2^32, else 8.
  int ValueBytes() const { return config_.modulus <= (uint64_t{1} << 32) ? 4 : 8; }
  // Values in client u's masked input.
  int64_t InputLength(int u) const { return slices_.empty() ? length_ : static_cast<int64_t>(slices_[u]->positions->size()); }
  // Per-slice masking: joins each of `members` to clients whose slices hold its own.
  void AddHoldingNeighbours(const std::vector<int>& members);
  StatusOr<std::map<std::string, v1::ServerMessage>> CloseKeys();
  StatusOr<std::map<std::string, v1::ServerMessage>> CloseShares();
  StatusOr<std::map<std::string, v1::ServerMessage>> CloseMasked();

  SecureAggregationConfig config_;
  secagg::Params params_;
  std::vector<std::string> clients_;
  std::map<std::string, int> index_;
  int64_t length_;
  int64_t max_weight_;
  uint64_t graph_seed_;
  std::vector<std::shared_ptr<const SecAggSlice>> slices_;  // by index; empty: the whole vector
  Stage stage_ = Stage::kKeys;
  std::set<int> dropped_;

  std::set<int> u0_, u1_, u2_, u3_, u4_;  // who answered each stage (u4: revealed)
  std::map<int, v1::SecAggKeys> keys_;
  std::vector<std::set<int>> graph_;      // on U1
  std::map<int, std::vector<v1::SecAggCiphertext>> inbox_;  // by addressee
  std::vector<std::set<int>> masked_with_;  // graph_ restricted to U2: the masks in use
  std::vector<uint64_t> masked_sum_;
  std::map<int, std::set<int>> asked_survivors_, asked_dropped_;  // what kUnmask asked of u
  std::map<int, std::vector<crypto::Share>> self_seed_shares_, mask_key_shares_;
  std::map<int, std::set<uint32_t>> share_xs_;  // owner -> x values received
};

}  // namespace cleave
