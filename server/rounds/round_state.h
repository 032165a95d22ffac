// What the coordinator keeps of each client session and each task, shared by the
// coordinator, its schedulers and its round drivers (server/rounds/round_context.h). The mode's
// own state of a session or task (a split client's profile and cut, a gossip task's
// report, an async client's speed) is its driver's or scheduler's, keyed by session or
// task id.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "aggregation/weighting.h"
#include "cleave/v1/cleave.pb.h"
#include "core/clock.h"

namespace cleave {

class ClientLink;   // server/transport/transport.h
class RoundHooks;  // server/rounds/round_driver.h
class SplitRound;   // split/round.h

// kAccumulating: its upload passed the checks made under the coordinator's lock and is
// being validated and added without it (ProcessUpload); it ends kDone, or kAssigned
// again if refused.
enum class TaskState { kAssigned, kAccumulating, kDone, kFailed };

struct TaskRecord {
  std::string id;
  std::string client_id;
  TaskState state = TaskState::kAssigned;
  // The round it was given in: its client trains from the model of round - 1. In async
  // mode the version being built then; tasks outlive it there.
  int64_t round = 0;
  // The version its update went into (kDone) or in which it failed (kFailed), and why.
  int64_t resolved_in = 0;
  std::string failure;
  // async (RoundScheduler::AdmitLocked, ShapeTaskLocked): its staleness when added, when
  // it fails unless uploaded, when it was sent and the local steps it was given. They
  // travel with the update into the strategy and the buffer's journal.
  int64_t staleness = 0;
  Clock::time_point deadline;
  Clock::time_point sent;
  int64_t steps = 0;
  // Width-scaled submodels (WidthDriver): the rate of the submodel it trains; 0: none;
  // and whether it is an edge aggregator's (its upload carries per-element weights).
  // Both travel into the buffer's journal.
  double width = 0;
  bool edge = false;
  double train_loss = 0;
  int64_t num_examples = 0;    // the update's weight (RoundWeights), once done
  int64_t expected_size = 0;   // bytes of the update
  std::string codec = "fp32";  // its codec: fp32 (a parameter-set encoding) or a Codec spec
  // Federated evaluation reported with the upload; examples = 0 when none.
  v1::ClientEvaluation evaluation;
  double train_seconds = 0;
  Clock::time_point done_at;  // when its upload was accepted
  bool evaluate_only = false;  // an evaluation task: its upload is an empty parameter set
};

using TaskMap = std::map<std::string, TaskRecord>;

// The round in progress as the coordinator keeps it, under its mutex: begun by
// RoundContext::BeginRoundLocked (or BeginBufferLocked) and ended by EndRoundLocked.
struct CurrentRound {
  int64_t number = 0;       // the round (or async version) in progress; 0 when none
  bool evaluating = false;  // an evaluation round: nothing is trained
  int clients = 0;          // the clients it was sized for (distributed DP's noise shares)
  RoundWeights weights;     // the bound on the example counts its clients declared
  TaskMap tasks;
  // Tasks in TaskState::kAccumulating: the round does not close while there are any.
  int accumulating = 0;
  RoundHooks* driver = nullptr;  // the driver running it (the plain one between rounds)
  // server.record_updates: the updates recorded in round recorded_round.
  int64_t recorded_round = 0;
  int recorded_updates = 0;
};

// What a split stream works on; fixed when the stream opens.
struct SplitStreamTask {
  std::string client_id;
  std::string task_id;
  std::shared_ptr<SplitRound> round;
  int window = 1;
  int64_t max_elements = 0;
  std::string act_codec, grad_codec;  // "" = float32
  // split.record: the first `record` micro-batches go to `record_path` (split/record.h).
  int record = 0;
  std::string record_path;
};

struct Session {
  std::string id;
  std::string name;
  std::string identity;  // the CN of its client certificate (mutual TLS), else empty
  std::string token;
  // Its declared example count; for a count_from_fit session, the count its last
  // training upload reported (0 before the first).
  int64_t num_examples = 0;
  bool count_from_fit = false;  // Join.count_from_fit
  std::string peer_address;  // where it serves Peer (gossip rounds); empty: it does not
  bool edge = false;         // an edge aggregator (Join.edge)
  std::shared_ptr<ClientLink> link;  // its control stream
  bool ready = false;  // Welcome queued: tasks may follow it
  // Why it refused a task for lack of memory (TaskAck.code RESOURCE_EXHAUSTED); while
  // set, it is not available for tasks. A new Join starts a new session without it.
  std::string unfit;
  Clock::time_point last_seen;
  // What the operator sees of it (Observe): tasks accepted and failed, the last accepted
  // task's training time and (split) mean step time.
  int64_t done = 0, failures = 0;
  double task_s = 0, step_s = 0;
};

}  // namespace cleave
