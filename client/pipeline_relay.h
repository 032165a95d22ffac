// A device of a pipeline's chain past its data owner (split.mode: pipeline, a task with
// an upstream neighbour): it takes micro-batches of activations (and their labels) from
// the device before it over Peer.Pipeline, runs its stages [begin, cut) on them, passes
// the results on (to the next device over Peer.Pipeline, or, last in the chain, to the
// server over Split), and takes each micro-batch's gradient back the same way, running
// its backward pass and returning the gradient of its input upstream. Its weights step
// once per micro_batches backward passes: once per batch, when the owner, which waits
// for a batch's last gradient before sending the next batch, has them all in flight.
//
// Every hop carries the task's codecs (activation_codec forward, gradient_codec back). A
// micro-batch from upstream must be a whole, decodable tensor of at most the task's
// batch size and finite values; anything else ends the call with INVALID_ARGUMENT,
// cancels the hop onward and fails the task. A neighbour that drops ends both hops: the
// devices upstream see their call cancelled, those downstream their stream ended, and
// every device of the chain fails its task at once, telling the server.
#pragma once

#include "client/gossip.h"
#include "client/split_client.h"

namespace cleave {

// The whole task: loads the part, has `peer` serve the upstream neighbour's call with it,
// waits for that call to end (or, if it never comes, the task's deadline, options.cancel,
// or three failed probes in a row of the upstream's Peer port, a second apart, when it
// serves one: UNAVAILABLE), and returns the trained part (its examples 1: the server weights a chain's
// segments by its data owner's declared examples).
// FAILED_PRECONDITION without a Peer service (cleave-client --peer-listen).
StatusOr<SplitTaskResult> RunPipelineRelay(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                           const v1::Task& task, const ParameterSet& part,
                                           const SplitTaskOptions& options, PeerServer* peer);

}  // namespace cleave
