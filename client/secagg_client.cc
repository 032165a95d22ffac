#include "client/secagg_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "client/transfer.h"
#include "privacy/secagg.h"

namespace cleave {
namespace {

// One stage message to the server.
Status Call(v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task,
            const std::function<void(v1::SecAggRequest*)>& fill) {
  v1::SecAggRequest req;
  req.set_run_id(task.run_id());
  req.set_client_id(w.client_id());
  req.set_session_token(w.session_token());
  req.set_round(task.round());
  req.set_task_id(task.task_id());
  fill(&req);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::SecAggReply reply;
  return FromGrpc(stub->SecAgg(&ctx, req, &reply), "secure aggregation");
}

Status CheckParams(const v1::SecAggTask& s) {
  const bool ok = s.t() >= 2 && s.k() >= s.t() && s.bits() >= 1 && s.bits() <= 32 &&
                  s.modulus() > (uint64_t{1} << s.bits()) && s.clip() > 0 &&
                  std::isfinite(s.clip()) && s.max_weight() >= 1;
  return ok ? absl::OkStatus()
            : absl::InvalidArgumentError("the task's secure-aggregation parameters are invalid");
}

void ToShare(int owner, const crypto::Share& s, v1::SecAggShare* out) {
  out->set_owner(owner);
  out->set_x(s.x);
  for (uint64_t y : s.y) out->add_y(y);
}

}  // namespace

struct SecAggClient::State {
  secagg::Params params;
  int64_t max_weight = 1;
  secagg::ClientKeys keys;
  int index = -1;
  std::map<int, crypto::Bytes> mask_keys, enc_keys;  // the neighbours' public keys
  std::map<int, secagg::SharesFor> held;             // shares the neighbours gave us
  // Per-slice masking: our positions and the neighbours', by graph index (else empty).
  secagg::Slices slices;
  v1::SecAggTask task;  // our placement, to check the delta against

  // Stage 2's neighbour list: our index, their keys and (per-slice masking, with `mine`
  // our positions) their slices. Returns their indices, at least t of them.
  StatusOr<std::set<int>> TakeNeighbours(const v1::SecAggNeighbours& nb,
                                         const std::shared_ptr<const secagg::Positions>& mine) {
    index = nb.index();
    std::set<int> neighbours;
    for (const auto& p : nb.peers()) {
      if (p.index() == index || p.mask_public_key().size() != 32 ||
          p.enc_public_key().size() != 32 || !neighbours.insert(p.index()).second) {
        return absl::InvalidArgumentError("malformed neighbour list");
      }
      mask_keys[p.index()] = p.mask_public_key();
      enc_keys[p.index()] = p.enc_public_key();
      if (mine) {
        auto theirs = PlacedPositions(p.placement(), task.length());
        if (!theirs.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("neighbour ", p.index(), ": ", theirs.status().message()));
        }
        slices[p.index()] = std::make_shared<const secagg::Positions>(std::move(*theirs));
      }
    }
    if (mine) slices[index] = mine;
    if (static_cast<int>(neighbours.size()) < params.t) {
      return absl::FailedPreconditionError(absl::StrCat(
          neighbours.size(), " neighbours; the threshold t = ", params.t, " needs more"));
    }
    return neighbours;
  }

  // The shares our neighbours sent, relayed: each must come from a neighbour, to us, once.
  Status OpenRelayed(const v1::SecAggRelay& relay, const std::set<int>& neighbours) {
    for (const auto& c : relay.shares()) {
      if (c.to() != index || !neighbours.count(c.from()) || held.count(c.from())) {
        return absl::InvalidArgumentError(
            absl::StrCat("relayed share from ", c.from(), " to ", c.to(), " is misrouted"));
      }
      ASSIGN_OR_RETURN(held[c.from()], secagg::OpenShares(c.from(), index, c.sealed(), keys.enc_key.private_key,
                                                          enc_keys[c.from()], params));
    }
    return absl::OkStatus();
  }
};

SecAggClient::SecAggClient(std::unique_ptr<State> state) : state_(std::move(state)) {}
SecAggClient::~SecAggClient() = default;
SecAggClient::SecAggClient(SecAggClient&&) noexcept = default;
SecAggClient& SecAggClient::operator=(SecAggClient&&) noexcept = default;

StatusOr<SecAggClient> SecAggClient::Prepare(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                             const v1::Task& task, const NextMessage& next) {
  const v1::SecAggTask& sa = task.secagg();
  RETURN_IF_ERROR(CheckParams(sa));
  auto st = std::make_unique<State>();
  st->params.k = sa.k();
  st->params.t = sa.t();
  st->params.clip = sa.clip();
  st->params.bits = sa.bits();
  st->params.modulus = sa.modulus();
  st->params.context = absl::StrCat(task.run_id(), "|round ", task.round());
  st->max_weight = sa.max_weight();
  st->task = sa;
  std::shared_ptr<const secagg::Positions> mine;
  if (sa.length() > 0) {
    ASSIGN_OR_RETURN(auto positions, PlacedPositions(sa.placement(), sa.length()));
    mine = std::make_shared<const secagg::Positions>(std::move(positions));
  }

  // Stage 1: fresh keys for this round.
  ASSIGN_OR_RETURN(st->keys, secagg::NewClientKeys());
  RETURN_IF_ERROR(Call(stub, w, task, [&](v1::SecAggRequest* r) {
    r->mutable_keys()->set_mask_public_key(st->keys.mask_key.public_key);
    r->mutable_keys()->set_enc_public_key(st->keys.enc_key.public_key);
  }));

  // Stage 2: shares of our secrets, sealed for each neighbour.
  v1::ServerMessage m;
  RETURN_IF_ERROR(next(&m));
  if (!m.has_secagg_neighbours()) {
    return absl::FailedPreconditionError("expected the secure-aggregation neighbours");
  }
  ASSIGN_OR_RETURN(const std::set<int> neighbours, st->TakeNeighbours(m.secagg_neighbours(), mine));
  ASSIGN_OR_RETURN(auto shares, secagg::ShareSecrets(st->index, st->keys, neighbours, st->params));
  v1::SecAggShares out;
  for (int v : neighbours) {
    auto* c = out.add_shares();
    c->set_from(st->index);
    c->set_to(v);
    ASSIGN_OR_RETURN(*c->mutable_sealed(),
                     secagg::SealShares(st->index, v, shares[v], st->keys.enc_key.private_key,
                                        st->enc_keys[v], st->params));
  }
  RETURN_IF_ERROR(Call(stub, w, task, [&](v1::SecAggRequest* r) { *r->mutable_shares() = out; }));

  // The shares our neighbours sent: we mask with exactly these neighbours.
  RETURN_IF_ERROR(next(&m));
  if (!m.has_secagg_relay()) {
    return absl::FailedPreconditionError("expected the relayed secure-aggregation shares");
  }
  RETURN_IF_ERROR(st->OpenRelayed(m.secagg_relay(), neighbours));
  if (mine) {
    // Each of our values must be under some pair mask, or unmasking our self mask would
    // show it to the server alone.
    std::vector<const secagg::Positions*> theirs;
    for (const auto& [v, shares] : st->held) theirs.push_back(st->slices.at(v).get());
    if (const int64_t alone = secagg::Uncovered(*mine, theirs); alone > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          alone, " of our ", mine->size(), " values are held by none of the ", theirs.size(),
          " neighbours we would mask with: the server would read them alone; not taking part"));
    }
  }
  return SecAggClient(std::move(st));
}

StatusOr<ParameterSet> MaskedPipelineVector(const v1::SplitTask& split, const ParameterSet& delta) {
  const int64_t length = split.secagg_length();
  if (length <= 0 || split.secagg_offsets_size() != static_cast<int>(delta.size())) {
    return absl::InvalidArgumentError(absl::StrCat("the task's masked vector (", length, " values, ",
                                                   split.secagg_offsets_size(), " offsets) does not fit a part of ",
                                                   delta.size(), " tensors"));
  }
  Tensor v{"masked", {length}, std::vector<float>(static_cast<size_t>(length), 0.0f)};
  for (size_t i = 0; i < delta.size(); ++i) {
    const Tensor& t = delta.tensors()[i];
    const int64_t at = split.secagg_offsets(static_cast<int>(i));
    if (at < 0 || at > length - static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " does not fit the masked vector at ", at));
    }
    std::copy(t.values.begin(), t.values.end(), v.values.begin() + at);
  }
  ParameterSet out;
  RETURN_IF_ERROR(out.Add(std::move(v)));
  return out;
}

StatusOr<std::vector<int64_t>> PlacedPositions(
    const google::protobuf::RepeatedPtrField<v1::SubmodelPlacement>& placement, int64_t length) {
  const auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("a submodel placement does not fit: ", why));
  };
  if (length <= 0 || length > (int64_t{1} << 34)) return bad(absl::StrCat("a vector of ", length, " values"));
  std::vector<int64_t> out;
  for (const v1::SubmodelPlacement& p : placement) {
    if (p.dims_size() != p.shape_size()) return bad(absl::StrCat(p.dims_size(), " kept lists for ", p.shape_size(), " dimensions"));
    int64_t whole = 1, kept = 1;
    for (int d = 0; d < p.shape_size(); ++d) {
      const int64_t size = p.shape(d);
      if (size < 1 || size > length) return bad(absl::StrCat("dimension of ", size));
      for (int64_t k : p.dims(d).index()) {
        if (k < 0 || k >= size) return bad(absl::StrCat("index ", k, " outside ", size));
      }
      whole *= size;
      kept *= p.dims(d).index_size();
      if (whole > length || kept > length) return bad("a tensor larger than the vector");
    }
    if (p.offset() < 0 || p.offset() > length - whole) return bad(absl::StrCat("a tensor at ", p.offset()));
    if (static_cast<int64_t>(out.size()) + kept > length) return bad("more values than the vector holds");
    // Row-major over the kept indices of each dimension.
    std::vector<int> digit(p.dims_size(), 0);
    for (int64_t e = 0; e < kept; ++e) {
      int64_t flat = 0;
      for (int d = 0; d < p.dims_size(); ++d) flat = flat * p.shape(d) + p.dims(d).index(digit[d]);
      out.push_back(p.offset() + flat);
      for (int d = p.dims_size(); d-- > 0;) {
        if (++digit[d] < p.dims(d).index_size()) break;
        digit[d] = 0;
      }
    }
  }
  std::vector<int64_t> sorted = out;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return bad("two values at one position");
  return out;
}

StatusOr<v1::UploadReply> SecAggClient::Submit(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                               const v1::Task& task, const ParameterSet& delta,
                                               int64_t examples, int64_t weight, double loss, double seconds,
                                               DeviceEmulator* emulator, const NextMessage& next,
                                               const v1::SplitStats* split) {
  State& st = *state_;
  if (!st.slices.empty()) {  // our submodel's tensors, of the placement's kept shapes
    bool fits = st.task.placement_size() == static_cast<int>(delta.size());
    for (size_t i = 0; fits && i < delta.size(); ++i) {
      const auto& p = st.task.placement(static_cast<int>(i));
      const auto& shape = delta.tensors()[i].shape;
      fits = p.dims_size() == static_cast<int>(shape.size());
      for (int d = 0; fits && d < p.dims_size(); ++d) fits = p.dims(d).index_size() == shape[d];
    }
    if (!fits) return absl::InvalidArgumentError("the trained submodel does not have the task's placement's shapes");
  }
  // Stage 3: clip, scale by our weight, quantize (stochastic rounding), mask.
  const double ratio = std::min(1.0, static_cast<double>(weight) / st.max_weight);
  std::vector<float> x;
  x.reserve(delta.total_elements());
  for (const auto& t : delta.tensors()) {
    for (float v : t.values) {
      const float c = std::isfinite(v) ? std::clamp<float>(v, -st.params.clip, st.params.clip) : 0;
      x.push_back(static_cast<float>(c * ratio));
    }
  }
  ASSIGN_OR_RETURN(crypto::Bytes seed, crypto::RandomBytes(8));
  uint64_t s = 0;
  for (char c : seed) s = (s << 8) | static_cast<unsigned char>(c);
  std::mt19937_64 rng(s);
  std::set<int> mask_with;
  for (const auto& [v, shares] : st.held) mask_with.insert(v);
  ASSIGN_OR_RETURN(std::vector<uint64_t> y,
                   secagg::Mask(st.index, secagg::Quantize(x, st.params, rng), st.keys, mask_with,
                                st.mask_keys, st.params, st.slices.empty() ? nullptr : &st.slices));
  const int width = st.params.modulus <= (uint64_t{1} << 32) ? 4 : 8;
  std::string payload(y.size() * width, '\0');
  for (size_t i = 0; i < y.size(); ++i) {
    for (int b = 0; b < width; ++b) payload[i * width + b] = static_cast<char>(y[i] >> (8 * b));
  }
  v1::UploadHeader h = TaskUploadHeader(w, task, examples, "secagg");
  h.set_train_loss(loss);
  h.set_train_seconds(seconds);
  if (split) *h.mutable_split() = *split;
  ASSIGN_OR_RETURN(v1::UploadReply reply, UploadPayload(stub, h, payload, 1 << 20, 600, emulator));

  // Stage 4: reveal, per neighbour we masked with, one share: never both of one client.
  v1::ServerMessage m;
  RETURN_IF_ERROR(next(&m));
  if (!m.has_secagg_unmask()) {
    return absl::FailedPreconditionError("expected the secure-aggregation unmasking request");
  }
  const auto& req = m.secagg_unmask();
  std::set<int> survivors(req.survivors().begin(), req.survivors().end());
  std::set<int> dropped(req.dropped().begin(), req.dropped().end());
  std::set<int> listed = survivors;
  listed.insert(dropped.begin(), dropped.end());
  // Every neighbour we masked with, each once (a repeat, or one in both lists, would
  // shrink `listed` below the number of entries).
  if (listed != mask_with ||
      static_cast<size_t>(req.survivors_size() + req.dropped_size()) != listed.size()) {
    return absl::InvalidArgumentError(
        "the unmasking request must name each neighbour we masked with exactly once, as "
        "survivor or dropped");
  }
  RETURN_IF_ERROR(Call(stub, w, task, [&](v1::SecAggRequest* r) {
    auto* rev = r->mutable_reveal();
    for (int v : survivors) ToShare(v, st.held[v].self_seed, rev->add_self_seed());
    for (int v : dropped) ToShare(v, st.held[v].mask_key, rev->add_mask_key());
  }));
  state_.reset();  // this round's secrets are spent
  return reply;
}

}  // namespace cleave
