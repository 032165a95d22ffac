// The server's side of one split-learning round: the server part(s) of the model, the
// per-micro-batch steps, and how the round's results become the next global model.
//
// Modes (split.mode):
//   sl       clients take turns; each trains the client part as the previous one left
//            it, against one server part (updated as batches arrive).
//   sfl-v1   clients in parallel; one server-part copy per client; at the end the client
//            parts and the server copies are averaged (FedAvg, weighted by examples).
//   sfl-v2   clients in parallel against one shared server part, updated as batches
//            arrive; the client parts are averaged.
//   ushaped  like sfl-v2, but the client keeps the first stages and the last ones with
//            the loss; the server holds the middle and never sees a label.
//   pipeline a chain of devices holds the first stages, each a contiguous segment
//            (SplitChain); only its last device streams to the server, which keeps a
//            copy of its stages per chain that steps once per batch of micro-batches. Every holder's tensors average across chains as in sfl-v1.
//            U-shaped (tail_begin < num_stages): the chain's data owner also holds
//            [tail_begin, n), and the server's copy is the middle.
// Clients may be cut at different stages. A shared server part then starts at the
// smallest cut and runs each client's micro-batches from that client's cut.
//
// Averaging is per tensor: every holder that trained a tensor this round contributes
// it, weighted by examples: each finished client for its own stages, and the server
// for its stages (a per-client copy with that client's weight; the shared part with
// the total weight of the finished clients whose micro-batches ran through it). A
// tensor nobody trained keeps its value.
//
// Thread-safe. Calls for one client must not overlap (its stream serialises them).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"
#include "models/part.h"
#include "split/names.h"

namespace cleave {

class FeatureSpaceHijack;  // models/inversion.h

struct SplitRoundOptions {
  SplitMode mode = SplitMode::kSflV2;
  ModelSpec model;
  LocalTrainOptions training;  // how the server's parts step (ModelPart::ResetOptimizer)
  int num_stages = 0;
  int tail_begin = 0;    // U-shaped: the client's tail is [tail_begin, n); else n
  int max_batch = 64;    // largest micro-batch accepted
  int num_classes = 10;
  // Per-sample input shape of every stage s in [0, n] (s = n: the model's output).
  std::vector<std::vector<int64_t>> stage_input_shapes;
  // A quantized base (ModelSpec::quantize): the whole model's quantized weights, which
  // the server's parts load (sharing the bytes).
  QuantizedSet quantized;
  // pipeline: a batch's micro-batches (when equal); each chain's server copy adds their
  // gradients up (a micro-batch's loss weighs 1 / this unless it says its share) and
  // steps after the batch's last.
  int micro_batches = 1;
  // Interoperable architectures: the devices' own tensors (bases and fusion layers),
  // never in a client's part (so never sent, uploaded or averaged).
  std::vector<std::string> private_names;
  // split.hijack (red team): TrainStep runs this attack on the activations instead of the
  // server's part, which then never trains; shared by the run's rounds.
  std::shared_ptr<FeatureSpaceHijack> hijack;
};

// A pipeline's micro-batch (SplitBatch): its share of the batch's loss (0: 1 /
// micro_batches) and whether the chain's copy steps after it.
struct SplitMicroBatch {
  double loss_weight = 0;
  bool batch_end = false;
};

// pipeline: one chain, its devices in order; devices[i] holds stages [bounds[i],
// bounds[i + 1]), the server [bounds.back(), n).
struct SplitChain {
  std::vector<std::string> devices;
  std::vector<int> bounds;
};

class SplitRound {
 public:
  // `cuts`: client id -> cut (the client holds stages [0, cut)).
  static StatusOr<std::unique_ptr<SplitRound>> Create(SplitRoundOptions options,
                                                      const ParameterSet& global,
                                                      const std::map<std::string, int>& cuts);
  // mode pipeline: the round's chains (each device in one). INVALID_ARGUMENT for bounds
  // that do not rise from 0 to a stage the server can start at.
  static StatusOr<std::unique_ptr<SplitRound>> CreatePipeline(SplitRoundOptions options,
                                                              const ParameterSet& global,
                                                              const std::vector<SplitChain>& chains);
  ~SplitRound();

  const SplitRoundOptions& options() const { return opts_; }
  // The client keeps the head and the labels: mode ushaped, or a pipeline whose
  // tail_begin is before the last stage (its data owners keep [tail_begin, n)).
  bool ushaped() const;
  // NOT_FOUND for a client not in this round.
  StatusOr<int> CutOf(const std::string& client) const;
  // The first stage it holds: 0 but in a pipeline.
  StatusOr<int> BeginOf(const std::string& client) const;
  // The stage of the model's tensor `name`; NOT_FOUND for none of the model's.
  StatusOr<int> StageOf(const std::string& name) const;

  // What `client` trains: stages [begin, cut) and, U-shaped, [tail_begin, n), less the
  // devices' own tensors (private_names). In sl, as the clients before it left them.
  StatusOr<ParameterSet> ClientPart(const std::string& client) const;

  // Checks a micro-batch arriving from `client` at its cut: shape [B, <the stage's input
  // shape>] with 1 <= B <= max_batch, finite values; and, unless U-shaped, B labels in
  // [0, num_classes) (B * T for a language model, whose output is [T, vocab] per
  // sample: one per token). INVALID_ARGUMENT saying what is wrong.
  Status CheckActivations(const std::string& client, const Activations& a) const;
  Status CheckLabels(const Activations& a, const std::vector<int64_t>& labels) const;

  // sl / sfl / pipeline: the server's step on a checked micro-batch; returns the loss
  // and the gradient of the activations. In a pipeline only a chain's last device
  // streams (FAILED_PRECONDITION for the others).
  StatusOr<ModelPart::LossStep> TrainStep(const std::string& client, const Activations& a,
                                          const std::vector<int64_t>& labels, const SplitMicroBatch& mb = {});
  // U-shaped: the middle's forward (kept under `seq` for its backward), and its backward
  // from the gradient of its output (checked here) with one SGD step (a pipeline's chain
  // copy: after the backward pass of its batch's last micro-batch, `batch_end`). In a
  // pipeline only the chain's last device streams.
  StatusOr<Activations> ForwardMiddle(const std::string& client, int64_t seq,
                                      const Activations& a);
  StatusOr<Activations> BackwardMiddle(const std::string& client, int64_t seq,
                                       const Activations& grad, bool batch_end = false);

  // The client's trained part (weights, the layout of ClientPart), weighted by `weight`.
  Status Finish(const std::string& client, const ParameterSet& part, int64_t weight);
  // Secure aggregation (pipelines): the client's part comes in the round's masked sum,
  // not here; its server copy (a chain's last device's) counts with `weight`.
  Status FinishMasked(const std::string& client, int64_t weight);
  // The client's task failed: its part is not averaged, its server copy is dropped.
  void Fail(const std::string& client);
  int finished() const;

  // Per tensor, what secure aggregation unmasked: the sum over the devices that trained
  // it of weight x (value - the round's start), and those weights' total.
  struct MaskedSum {
    std::vector<double> weighted_delta;
    double weight = 0;
  };
  // The next global model (after every client finished or failed), with `masked` (by
  // tensor name) added to what the clients and the server's parts hold.
  StatusOr<ParameterSet> Aggregate(const std::map<std::string, MaskedSum>& masked = {});

  // How busy the server's parts were: compute seconds summed over every step (sfl-v1's
  // copies run in parallel, so the sum can exceed the span), and the span from Create
  // to the end of the last step. busy / span is the share of the round the server
  // computed; the rest it waited for clients and their transfers.
  struct Load {
    double busy_s = 0, span_s = 0;
  };
  Load ServerLoad() const;

 private:
  struct ClientState;
  SplitRound(SplitRoundOptions options, ParameterSet global, std::vector<int> stage_of);
  // Create's common part: the round with no client yet.
  static StatusOr<std::unique_ptr<SplitRound>> Empty(SplitRoundOptions options, const ParameterSet& global);
  // Adds a client holding [begin, cut), with a server copy of [cut, tail_begin) if `copy`.
  Status AddClient(const std::string& id, int begin, int cut, bool copy);
  StatusOr<ClientState*> Find(const std::string& client) const;
  // Marks a client finished with `weight` (mu_ held); FAILED_PRECONDITION once over.
  StatusOr<ClientState*> FinishLocked(const std::string& client, int64_t weight);
  // The state of a client whose micro-batches may run through the middle part.
  StatusOr<ClientState*> MiddleOf(const std::string& client) const;
  // Runs one step of a server part and counts its time as busy.
  template <typename F>
  auto Timed(F&& step) -> decltype(step());
  bool ClientHolds(const ClientState& c, int stage) const;

  const SplitRoundOptions opts_;
  const ParameterSet global_;
  const std::vector<int> stage_of_;  // stage of each tensor of global_
  int min_cut_ = 0;

  // Lock order: mu_ (the clients' states, current_), then shared_mu_ (the shared part,
  // held for a whole step so that steps of different clients do not interleave).
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<ClientState>> clients_;
  ParameterSet current_;               // sl: the model as the last finished client left it
  mutable std::mutex shared_mu_;
  std::unique_ptr<ModelPart> shared_;  // sl, sfl-v2, ushaped
  const std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::atomic<int64_t> busy_ns_{0}, last_end_ns_{0};  // last_end_ns_: since created_
};

}  // namespace cleave
