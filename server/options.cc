#include "server/options.h"

#include "absl/strings/str_cat.h"
#include "aggregation/gossip_mix.h"
#include "aggregation/staleness.h"

namespace cleave {

const NameTable& TopologyNames() {
  static const NameTable t{"scheduler.topology", {"ring", "random", "measured"}};
  return t;
}

StrategyJob StrategyJobOf(const FederationConfig& c) {
  StrategyJob j;
  j.strategy = c.strategy;
  j.aggregation = c.aggregation;
  // Width-scaled submodels: the width driver applies the rule element by element and
  // hands the strategy one update.
  if (c.width.enabled) j.aggregation.rule = "mean";
  j.dp = c.dp;
  j.train = c.train;
  j.rounds = c.run.rounds;
  j.per_round = c.clients.per_round;
  j.fraction = c.clients.fraction;
  j.update_codec = c.compression.update;
  return j;
}

void ReadRun(ConfigSection& s, RunConfig& c) {
  s.Read("name", c.name);
  s.Read("rounds", c.rounds);
  s.Read("seed", c.seed);
  s.Read("priority", c.priority);
  s.Read("target_accuracy", c.target_accuracy);
}

Status CheckRun(RunConfig& c) {
  RETURN_IF_ERROR(Range(c.priority >= -100 && c.priority <= 100, "run.priority", "in [-100, 100]"));
  RETURN_IF_ERROR(Range(c.target_accuracy >= 0 && c.target_accuracy <= 1, "run.target_accuracy", "in [0, 1] (0 = off)"));
  return Range(c.rounds >= 1, "run.rounds", ">= 1");
}

void ReadClients(ConfigSection& s, ClientsConfig& c) {
  s.Read("min", c.min_clients);
  s.Read("per_round", c.per_round);
  s.Read("fraction", c.fraction);
  s.Read("quorum", c.quorum);
  s.Read("round_deadline_s", c.round_deadline_s);
  s.Read("join_timeout_s", c.join_timeout_s);
  s.Read("selection", c.selection);
  s.Read("oort_epsilon", c.oort_epsilon);
  s.Read("oort_alpha", c.oort_alpha);
  s.Read("oort_pacer_rounds", c.oort_pacer_rounds);
  s.Read("oort_max_picks", c.oort_max_picks);
}

Status CheckClients(ClientsConfig& c) {
  RETURN_IF_ERROR(Range(c.min_clients >= 1, "clients.min", ">= 1"));
  RETURN_IF_ERROR(Range(c.per_round >= 0, "clients.per_round", ">= 0"));
  RETURN_IF_ERROR(Range(c.fraction > 0 && c.fraction <= 1, "clients.fraction", "in (0, 1]"));
  RETURN_IF_ERROR(Range(c.quorum > 0 && c.quorum <= 1, "clients.quorum", "in (0, 1]"));
  RETURN_IF_ERROR(Range(c.round_deadline_s > 0, "clients.round_deadline_s", "> 0"));
  RETURN_IF_ERROR(Range(c.join_timeout_s > 0, "clients.join_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.oort_epsilon >= 0 && c.oort_epsilon <= 1, "clients.oort_epsilon",
                        "in [0, 1]"));
  RETURN_IF_ERROR(Range(c.oort_alpha >= 0, "clients.oort_alpha", ">= 0"));
  RETURN_IF_ERROR(Range(c.oort_pacer_rounds >= 0, "clients.oort_pacer_rounds", ">= 0"));
  return Range(c.oort_max_picks >= 0, "clients.oort_max_picks", ">= 0");
}

void ReadScheduler(ConfigSection& s, SchedulerConfig& c) {
  s.Read("mode", c.mode);
  s.Read("buffer_size", c.buffer_size);
  s.Read("concurrency", c.concurrency);
  s.Read("max_staleness", c.max_staleness);
  s.Read("max_client_share", c.max_client_share);
  s.Read("staleness", c.staleness);
  s.Read("staleness_exponent", c.staleness_exponent);
  s.Read("staleness_hinge", c.staleness_hinge);
  s.Read("target_staleness", c.target_staleness);
  s.Read("min_local_steps", c.min_local_steps);
  s.Read("topology", c.topology);
  s.Read("degree", c.degree);
  s.Read("gossip_rule", c.gossip_rule);
  s.Read("gossip_byzantine", c.gossip_byzantine);
}

Status CheckScheduler(SchedulerConfig& c) {
  RETURN_IF_ERROR(TopologyNames().Check(c.topology));
  RETURN_IF_ERROR(GossipRuleNames().Check(c.gossip_rule));
  RETURN_IF_ERROR(Range(c.gossip_byzantine >= 0 && c.gossip_byzantine < 1, "scheduler.gossip_byzantine",
                        "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.degree >= 2 && c.degree % 2 == 0, "scheduler.degree",
                        "even and >= 2 (random: the union of degree / 2 rings)"));
  RETURN_IF_ERROR(Range(c.buffer_size >= 1, "scheduler.buffer_size", ">= 1"));
  RETURN_IF_ERROR(Range(c.concurrency >= 0, "scheduler.concurrency", ">= 0"));
  RETURN_IF_ERROR(Range(c.max_staleness >= 0, "scheduler.max_staleness", ">= 0"));
  RETURN_IF_ERROR(Range(c.max_client_share > 0 && c.max_client_share <= 1,
                        "scheduler.max_client_share", "in (0, 1]"));
  RETURN_IF_ERROR(StalenessNames().Check(c.staleness));
  RETURN_IF_ERROR(Range(c.staleness_exponent >= 0, "scheduler.staleness_exponent", ">= 0"));
  RETURN_IF_ERROR(Range(c.staleness_hinge >= 0, "scheduler.staleness_hinge", ">= 0"));
  RETURN_IF_ERROR(Range(c.target_staleness >= 0 && c.target_staleness <= c.max_staleness,
                        "scheduler.target_staleness",
                        absl::StrCat("in [0, scheduler.max_staleness=", c.max_staleness,
                                     "] (0 = off)")));
  return Range(c.min_local_steps >= 1, "scheduler.min_local_steps", ">= 1");
}

void ReadServer(ConfigSection& s, ServerConfig& c) {
  s.Read("listen", c.listen);
  s.Read("heartbeat_s", c.heartbeat_s);
  s.Read("client_timeout_s", c.client_timeout_s);
  s.Read("max_model_elements", c.max_model_elements);
  s.Read("chunk_bytes", c.chunk_bytes);
  s.Read("eval_batch_size", c.eval_batch_size);
  s.Read("worker_threads", c.worker_threads);
  s.Read("evaluate", c.evaluate);
  s.Read("final_evaluation", c.final_evaluation);
  s.Read("max_update_abs", c.max_update_abs);
  s.Read("record_updates", c.record_updates);
  s.Read("upload_idle_timeout_s", c.upload_idle_timeout_s);
  s.Read("handshake_timeout_s", c.handshake_timeout_s);
  s.Read("max_sessions", c.max_sessions);
  s.Read("max_connections", c.max_connections);
  s.Read("metrics_listen", c.metrics_listen);
  s.Read("metrics_client_series", c.metrics_client_series);
}

Status CheckServer(ServerConfig& c) {
  RETURN_IF_ERROR(Range(c.heartbeat_s > 0, "server.heartbeat_s", "> 0"));
  RETURN_IF_ERROR(Range(c.client_timeout_s > c.heartbeat_s, "server.client_timeout_s",
                        "> server.heartbeat_s"));
  RETURN_IF_ERROR(Range(c.max_model_elements > 0, "server.max_model_elements", "> 0"));
  RETURN_IF_ERROR(Range(c.chunk_bytes >= 1024 && c.chunk_bytes <= (2 << 20), "server.chunk_bytes",
                        "in [1024, 2 MiB] (gRPC's limit is 4 MiB)"));
  RETURN_IF_ERROR(Range(c.eval_batch_size >= 1, "server.eval_batch_size", ">= 1"));
  RETURN_IF_ERROR(Range(c.worker_threads >= 1, "server.worker_threads", ">= 1"));
  RETURN_IF_ERROR(Range(c.metrics_client_series >= 0, "server.metrics_client_series", ">= 0"));
  RETURN_IF_ERROR(Range(c.metrics_listen.empty() || c.metrics_listen.rfind(':') != std::string::npos,
                        "server.metrics_listen", "host:port, or empty (off)"));
  RETURN_IF_ERROR(Range(c.max_update_abs > 0, "server.max_update_abs", "> 0"));
  RETURN_IF_ERROR(Range(c.record_updates >= 0 && c.record_updates <= 1000, "server.record_updates", "in [0, 1000]"));
  RETURN_IF_ERROR(Range(c.upload_idle_timeout_s > 0, "server.upload_idle_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.handshake_timeout_s > 0, "server.handshake_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.max_sessions >= 0, "server.max_sessions",
                        ">= 0 (0 = derived from the open-file limit)"));
  return Range(c.max_connections >= 0, "server.max_connections",
               ">= 0 (0 = derived from the open-file limit)");
}

void ReadTls(ConfigSection& s, TlsConfig& c) {
  s.Read("cert", c.cert);
  s.Read("key", c.key);
  s.Read("ca", c.ca);
  s.Read("mutual", c.mutual);
  s.Read("reload_s", c.reload_s);
  s.Read("revoked", c.revoked);
}

Status CheckTls(TlsConfig& c) {
  if (c.cert.empty() != c.key.empty()) {
    return absl::InvalidArgumentError("tls.cert and tls.key go together");
  }
  RETURN_IF_ERROR(Range(c.reload_s >= 1, "tls.reload_s", ">= 1"));
  if (!c.revoked.empty() && !c.mutual) {
    return absl::InvalidArgumentError("tls.revoked names device identities: it needs tls.mutual");
  }
  return absl::OkStatus();
}

void ReadAuth(ConfigSection& s, AuthConfig& c) { s.Read("token_file", c.token_file); }

}  // namespace cleave
