// The client's side of decentralised rounds (scheduler.mode: gossip): the Peer service
// its neighbours send their models to, and sending its own.
//
// A gossip task names the client's neighbours for the round, each with its address, its
// weight and the edge's secret (GossipTask). The client expects exactly those senders
// (PeerServer::Expect), sends its trained model to each (SendModel), and collects theirs
// (Collect) until all arrived or the deadline passed. A model from anyone else, for
// another run or round, with a wrong secret, of another layout or size, or not finite,
// is refused with a status that says so and changes nothing. Under mutual TLS the
// sender must also present the certificate of the neighbour it claims to be.
//
// Pipelines (split.mode: pipeline) use the same service: a device past a chain's data
// owner takes its upstream neighbour's Peer.Pipeline call (ExpectPipeline), under the
// same rules.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cleave/v1/cleave.grpc.pb.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

class DeviceEmulator;

class PeerServer {
 public:
  // Serves Peer on `listen` (host:port; port 0 picks one). With `ca` set, over mutual
  // TLS with this client's `cert` and `key`; plaintext otherwise.
  static StatusOr<std::unique_ptr<PeerServer>> Start(const std::string& listen,
                                                     const std::string& ca,
                                                     const std::string& cert,
                                                     const std::string& key);
  ~PeerServer();

  int port() const { return port_; }

  // From now on models of `round` of run `run_id` are taken from the senders in
  // `tokens` (name -> the edge's secret), each with `layout`'s tensors; earlier rounds'
  // are dropped. A sender ahead of this client (its task came first) waits for it.
  void Expect(const std::string& run_id, int64_t round, std::map<std::string, std::string> tokens,
              const ParameterSet& layout);
  // The models of `round` received by `deadline` (or as soon as every expected sender's
  // is in), by sender; then stops taking models of the round.
  std::map<std::string, ParameterSet> Collect(int64_t round,
                                              std::chrono::steady_clock::time_point deadline);
  // Stops waiting in `round` for `sender`, unless its model is already in: a neighbour
  // that cannot be reached (its process is gone) will not send one either.
  void GiveUp(int64_t round, const std::string& sender);
  // While `round`'s model from `sender` is awaited (not in, not given up, the round still
  // collected), calls `reachable` every `period`; after `strikes` calls in a row return
  // false, gives up on the sender (its process is gone: a neighbour that took this
  // client's model and then crashed will not send its own). Returns once the model is no
  // longer awaited.
  void Watch(int64_t round, const std::string& sender, const std::function<bool()>& reachable,
             std::chrono::milliseconds period, int strikes = 3);
  // Model bytes received in the round last expected.
  int64_t bytes_received() const;
  // Callers waiting for their round now (at most 16; at most 2 in one sender's name): a
  // caller is refused at once when its round is past this device's last by more than
  // 100, or of another run, or when the places to wait are taken. A caller that cancels,
  // or the server's stopping, ends its wait.
  int waiting_callers() const;

  // Pipelines: serves the Peer.Pipeline call of `round` of run `run_id` from `sender`
  // with the hop's `token` (under mutual TLS, with the certificate of `sender`) by
  // `serve`, once; any other call is refused. A call that comes before this (the
  // sender's task came first) waits for it within its deadline.
  using PipelineServe = std::function<grpc::Status(
      grpc::ServerContext*, grpc::ServerReaderWriter<v1::SplitDown, v1::SplitUp>*, const v1::PipelineOpen&)>;
  void ExpectPipeline(const std::string& run_id, int64_t round, const std::string& sender,
                      const std::string& token, PipelineServe serve);
  // Stops taking the call ExpectPipeline named: true if it was taken (`serve` runs or ran).
  bool EndPipeline();
  // Whether that call was taken.
  bool PipelineTaken() const;

  struct Mailbox;  // the service's state (client/gossip.cc)

 private:
  PeerServer() = default;
  // Destroyed in reverse: the server stops before the service and the mailbox go.
  std::unique_ptr<Mailbox> box_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// When a send's model bytes went: from the neighbour's admission (its round reached, the
// header accepted) to the end of the call.
struct SendSpan {
  std::chrono::steady_clock::time_point admitted, done;
};

// Sends `model` (an encoded ParameterSet) for `round` to the neighbour `name` serving
// Peer at `address`, with the edge's `token`: the header first, the bytes once the
// neighbour admits them. Over TLS (`ca` set) the neighbour must present the certificate
// of `name`; this client presents `cert`. `emulator` (may be null) paces the bytes as
// the device's uplink. `span` (may be null) gets when the bytes went, on success.
Status SendModel(const std::string& address, const std::string& name, const std::string& run_id,
                 int64_t round, const std::string& sender, const std::string& token,
                 const std::string& model, const std::string& ca, const std::string& cert,
                 const std::string& key, double timeout_s, DeviceEmulator* emulator,
                 SendSpan* span = nullptr);

// Whether a connection to the neighbour `name` serving Peer at `address` can be made
// (over TLS as SendModel makes it, the handshake included) within `timeout_s`.
bool PeerReachable(const std::string& address, const std::string& name, const std::string& ca,
                   const std::string& cert, const std::string& key, double timeout_s);

// The uplink `bytes` sent over `spans` used, in Mbit/s: the bytes over the time from the
// first admission to the last end (the sends shared the uplink); 0 without spans.
double UplinkMbps(int64_t bytes, const std::vector<SendSpan>& spans);

}  // namespace cleave
