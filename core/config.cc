#include "core/config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
// The modules' name tables: header-only and torch-free, so core links none of them.

namespace cleave {
namespace {

// Reads `section.key` into `out` if present, with type errors turned into Status.
template <typename T>
Status Read(const YAML::Node& section, const std::string& sec, const std::string& key, T* out) {
  const YAML::Node n = section[key];
  if (!n) return absl::OkStatus();
  try {
    *out = n.as<T>();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(sec, ".", key, ": ", e.msg));
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(*out)) {
      return absl::InvalidArgumentError(absl::StrCat(sec, ".", key, " must be a finite number"));
    }
  }
  return absl::OkStatus();
}

// Every section and its keys: Parse refuses any other, JobConfig::Keys lists them, and a
// test holds docs/configuration.md to documenting each.
const std::map<std::string, std::vector<std::string>>& KnownKeys() {
  static const auto* keys = new std::map<std::string, std::vector<std::string>>{
      {"config", {"run", "model", "data", "clients", "scheduler", "train", "strategy", "split", "compression",
                  "server", "local", "tls", "auth", "secure_aggregation", "dp", "aggregation"}},
      {"run", {"name", "rounds", "seed"}},
      {"model", {"name", "path", "input", "classes", "personal", "gpt", "weights", "lora"}},
      {"model.lora", {"rank", "alpha", "targets", "dropout"}},
      {"model.gpt", {"vocab", "context", "layers", "heads", "dim", "tie"}},
      {"data", {"test", "test_limit"}},
      {"clients", {"min", "per_round", "fraction", "quorum", "round_deadline_s", "join_timeout_s",
                   "selection", "oort_epsilon", "oort_alpha", "oort_pacer_rounds",
                   "oort_max_picks"}},
      {"scheduler", {"mode", "buffer_size", "concurrency", "max_staleness", "staleness",
                     "staleness_exponent", "staleness_hinge", "target_staleness",
                     "min_local_steps", "topology", "degree"}},
      {"train", {"local_epochs", "local_steps", "batch_size", "loss", "loss_path", "optimizer",
                 "lr", "momentum", "nesterov", "weight_decay", "clip_norm", "label_smoothing",
                 "schedule", "warmup_rounds", "step_rounds", "step_gamma", "lr_min"}},
      {"strategy", {"name", "proximal_mu", "server_lr", "server_momentum", "beta1", "beta2",
                    "tau"}},
      {"split", {"mode", "cut", "tail", "window", "activation_noise", "nopeek"}},
      {"compression", {"update", "broadcast", "activations", "gradients"}},
      {"server", {"listen", "heartbeat_s", "client_timeout_s", "max_model_elements", "chunk_bytes",
                  "eval_batch_size", "worker_threads", "evaluate", "final_evaluation",
                  "max_update_abs", "upload_idle_timeout_s", "handshake_timeout_s",
                  "max_sessions", "max_connections", "metrics_listen", "metrics_client_series"}},
      {"tls", {"cert", "key", "ca", "mutual", "reload_s", "revoked"}},
      {"auth", {"token_file"}},
      {"secure_aggregation", {"enabled", "k", "t", "clip", "bits", "modulus", "stage_timeout_s"}},
      {"dp", {"enabled", "noise_multiplier", "clip", "adaptive", "target_quantile", "clip_lr",
              "clip_count_stddev", "noise", "delta", "target_epsilon"}},
      {"aggregation", {"rule", "f", "m", "max_norm", "root_data", "weighting", "max_weight_ratio",
                       "max_client_examples"}},
      {"local", {"data", "partition", "partition_seed", "clients", "holdout", "profiles", "trace", "attack",
                 "attackers"}},
      {"local.profiles[]", {"uplink_mbps", "downlink_mbps", "slowdown", "memory_limit_mb"}},
  };
  return *keys;
}

Status CheckKeys(const YAML::Node& section, const std::string& sec) {
  const std::vector<std::string>& names = KnownKeys().at(sec);
  const std::set<std::string> known(names.begin(), names.end());
  if (!section.IsMap()) return absl::InvalidArgumentError(absl::StrCat(sec, " must be a map"));
  std::set<std::string> seen;  // yaml-cpp keeps duplicate keys; a lookup sees only one
  for (const auto& kv : section) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(sec, ": keys must be plain names"));
    }
    const std::string key = kv.first.as<std::string>();
    if (!known.count(key)) {
      return absl::InvalidArgumentError(absl::StrCat("unknown config key ", sec, ".", key));
    }
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate config key ", sec, ".", key));
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status Range(bool ok, const std::string& key, const std::string& rule) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(key, " must be ", rule));
}

namespace {

// One function per section: it reads the section's keys when the section is given, then
// checks the values it holds, defaults included.
Status ParseRun(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "run"));
    RETURN_IF_ERROR(Read(s, "run", "name", &c.run.name));
    RETURN_IF_ERROR(Read(s, "run", "rounds", &c.run.rounds));
    RETURN_IF_ERROR(Read(s, "run", "seed", &c.run.seed));
  }
  RETURN_IF_ERROR(Range(c.run.rounds >= 1, "run.rounds", ">= 1"));
  return absl::OkStatus();
}

Status ParseModel(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "model"));
    RETURN_IF_ERROR(Read(s, "model", "name", &c.model.name));
    RETURN_IF_ERROR(Read(s, "model", "path", &c.model.path));
    RETURN_IF_ERROR(Read(s, "model", "input", &c.model.input));
    RETURN_IF_ERROR(Read(s, "model", "classes", &c.model.classes));
    RETURN_IF_ERROR(Read(s, "model", "personal", &c.model.personal));
    RETURN_IF_ERROR(Read(s, "model", "weights", &c.model.weights));
    if (auto g = s["gpt"]) {
      const std::string sec = "model.gpt";
      RETURN_IF_ERROR(CheckKeys(g, sec));
      RETURN_IF_ERROR(Read(g, sec, "vocab", &c.model.gpt.vocab));
      RETURN_IF_ERROR(Read(g, sec, "context", &c.model.gpt.context));
      RETURN_IF_ERROR(Read(g, sec, "layers", &c.model.gpt.layers));
      RETURN_IF_ERROR(Read(g, sec, "heads", &c.model.gpt.heads));
      RETURN_IF_ERROR(Read(g, sec, "dim", &c.model.gpt.dim));
      RETURN_IF_ERROR(Read(g, sec, "tie", &c.model.gpt.tie));
    }
    if (auto l = s["lora"]) {
      const std::string sec = "model.lora";
      RETURN_IF_ERROR(CheckKeys(l, sec));
      RETURN_IF_ERROR(Read(l, sec, "rank", &c.model.lora.rank));
      RETURN_IF_ERROR(Read(l, sec, "alpha", &c.model.lora.alpha));
      RETURN_IF_ERROR(Read(l, sec, "targets", &c.model.lora.targets));
      RETURN_IF_ERROR(Read(l, sec, "dropout", &c.model.lora.dropout));
    }
  }
  // model.name is checked where models are built (Model::Create names the built-ins).
  RETURN_IF_ERROR(Range(!c.model.input.empty() && c.model.input.size() <= 3, "model.input",
                        "[C, H, W] or [features]"));
  for (int64_t d : c.model.input) {
    RETURN_IF_ERROR(Range(d >= 1 && d <= 65536, "model.input", "a list of sizes in [1, 65536]"));
  }
  RETURN_IF_ERROR(Range(c.model.classes >= 1 && c.model.classes <= 1000000, "model.classes",
                        "in [1, 1000000]"));
  const GptConfig& g = c.model.gpt;
  RETURN_IF_ERROR(Range(g.vocab >= 2 && g.vocab <= (1 << 24), "model.gpt.vocab", "in [2, 16777216]"));
  RETURN_IF_ERROR(Range(g.context >= 1 && g.context <= 65536, "model.gpt.context", "in [1, 65536]"));
  RETURN_IF_ERROR(Range(g.layers >= 1 && g.layers <= 256, "model.gpt.layers", "in [1, 256]"));
  RETURN_IF_ERROR(Range(g.heads >= 1 && g.heads <= 256, "model.gpt.heads", "in [1, 256]"));
  RETURN_IF_ERROR(Range(g.dim >= 1 && g.dim <= 65536 && g.dim % g.heads == 0, "model.gpt.dim",
                        "in [1, 65536] and divisible by model.gpt.heads"));
  const LoraConfig& lora = c.model.lora;
  RETURN_IF_ERROR(Range(lora.rank >= 0 && lora.rank <= 4096, "model.lora.rank", "in [0, 4096]"));
  RETURN_IF_ERROR(Range(lora.alpha > 0, "model.lora.alpha", "> 0"));
  RETURN_IF_ERROR(Range(lora.dropout >= 0 && lora.dropout < 1, "model.lora.dropout", "in [0, 1)"));
  RETURN_IF_ERROR(Range(!lora.targets.empty(), "model.lora.targets",
                        "a list of " + LoraTargetNames().List()));
  for (const std::string& t : lora.targets) RETURN_IF_ERROR(LoraTargetNames().Check(t));
  if (lora.enabled()) {
    RETURN_IF_ERROR(Range(c.model.name == "gpt", "model.lora", "used with model.name: gpt"));
    RETURN_IF_ERROR(Range(c.model.personal.empty(), "model.lora",
                          "off with model.personal (the adapters are what is federated)"));
  }
  for (const std::string& p : c.model.personal) {
    RETURN_IF_ERROR(Range(!p.empty(), "model.personal", "a list of tensor name patterns"));
  }
  if (c.model.name == "torchscript") {
    if (c.model.path.empty()) {
      return absl::InvalidArgumentError("model.path is required for model.name: torchscript");
    }
    std::filesystem::path p(c.model.path);
    if (p.is_relative() && !base_dir.empty()) c.model.path = (base_dir / p).string();
  }
  if (!c.model.weights.empty() && std::filesystem::path(c.model.weights).is_relative() &&
      !base_dir.empty()) {
    c.model.weights = (std::filesystem::path(base_dir) / c.model.weights).string();
  }
  return absl::OkStatus();
}

Status ParseData(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "data"));
    RETURN_IF_ERROR(Read(s, "data", "test", &c.data.test));
    RETURN_IF_ERROR(Read(s, "data", "test_limit", &c.data.test_limit));
    if (c.data.test.empty()) c.server.evaluate = false;  // a coordinator without data
  }
  return absl::OkStatus();
}

Status ParseClients(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "clients"));
    RETURN_IF_ERROR(Read(s, "clients", "min", &c.clients.min_clients));
    RETURN_IF_ERROR(Read(s, "clients", "per_round", &c.clients.per_round));
    RETURN_IF_ERROR(Read(s, "clients", "fraction", &c.clients.fraction));
    RETURN_IF_ERROR(Read(s, "clients", "quorum", &c.clients.quorum));
    RETURN_IF_ERROR(Read(s, "clients", "round_deadline_s", &c.clients.round_deadline_s));
    RETURN_IF_ERROR(Read(s, "clients", "join_timeout_s", &c.clients.join_timeout_s));
    RETURN_IF_ERROR(Read(s, "clients", "selection", &c.clients.selection));
    RETURN_IF_ERROR(Read(s, "clients", "oort_epsilon", &c.clients.oort_epsilon));
    RETURN_IF_ERROR(Read(s, "clients", "oort_alpha", &c.clients.oort_alpha));
    RETURN_IF_ERROR(Read(s, "clients", "oort_pacer_rounds", &c.clients.oort_pacer_rounds));
    RETURN_IF_ERROR(Read(s, "clients", "oort_max_picks", &c.clients.oort_max_picks));
  }
  RETURN_IF_ERROR(Range(c.clients.min_clients >= 1, "clients.min", ">= 1"));
  RETURN_IF_ERROR(Range(c.clients.per_round >= 0, "clients.per_round", ">= 0"));
  RETURN_IF_ERROR(Range(c.clients.fraction > 0 && c.clients.fraction <= 1, "clients.fraction",
                        "in (0, 1]"));
  RETURN_IF_ERROR(Range(c.clients.quorum > 0 && c.clients.quorum <= 1, "clients.quorum",
                        "in (0, 1]"));
  RETURN_IF_ERROR(Range(c.clients.round_deadline_s > 0, "clients.round_deadline_s", "> 0"));
  RETURN_IF_ERROR(Range(c.clients.join_timeout_s > 0, "clients.join_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.clients.oort_epsilon >= 0 && c.clients.oort_epsilon <= 1,
                        "clients.oort_epsilon", "in [0, 1]"));
  RETURN_IF_ERROR(Range(c.clients.oort_alpha >= 0, "clients.oort_alpha", ">= 0"));
  RETURN_IF_ERROR(Range(c.clients.oort_pacer_rounds >= 0, "clients.oort_pacer_rounds", ">= 0"));
  RETURN_IF_ERROR(Range(c.clients.oort_max_picks >= 0, "clients.oort_max_picks", ">= 0"));
  return absl::OkStatus();
}

Status ParseScheduler(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    const std::string sec = "scheduler";
    RETURN_IF_ERROR(CheckKeys(s, sec));
    RETURN_IF_ERROR(Read(s, sec, "mode", &c.scheduler.mode));
    RETURN_IF_ERROR(Read(s, sec, "buffer_size", &c.scheduler.buffer_size));
    RETURN_IF_ERROR(Read(s, sec, "concurrency", &c.scheduler.concurrency));
    RETURN_IF_ERROR(Read(s, sec, "max_staleness", &c.scheduler.max_staleness));
    RETURN_IF_ERROR(Read(s, sec, "staleness", &c.scheduler.staleness));
    RETURN_IF_ERROR(Read(s, sec, "staleness_exponent", &c.scheduler.staleness_exponent));
    RETURN_IF_ERROR(Read(s, sec, "staleness_hinge", &c.scheduler.staleness_hinge));
    RETURN_IF_ERROR(Read(s, sec, "target_staleness", &c.scheduler.target_staleness));
    RETURN_IF_ERROR(Read(s, sec, "min_local_steps", &c.scheduler.min_local_steps));
    RETURN_IF_ERROR(Read(s, sec, "topology", &c.scheduler.topology));
    RETURN_IF_ERROR(Read(s, sec, "degree", &c.scheduler.degree));
  }
  RETURN_IF_ERROR(TopologyNames().Check(c.scheduler.topology));
  RETURN_IF_ERROR(Range(c.scheduler.degree >= 2 && c.scheduler.degree % 2 == 0,
                        "scheduler.degree", "even and >= 2 (random: the union of degree / 2 rings)"));
  RETURN_IF_ERROR(Range(c.scheduler.buffer_size >= 1, "scheduler.buffer_size", ">= 1"));
  RETURN_IF_ERROR(Range(c.scheduler.concurrency >= 0, "scheduler.concurrency", ">= 0"));
  RETURN_IF_ERROR(Range(c.scheduler.max_staleness >= 0, "scheduler.max_staleness", ">= 0"));
  RETURN_IF_ERROR(StalenessNames().Check(c.scheduler.staleness));
  RETURN_IF_ERROR(Range(c.scheduler.staleness_exponent >= 0, "scheduler.staleness_exponent",
                        ">= 0"));
  RETURN_IF_ERROR(Range(c.scheduler.staleness_hinge >= 0, "scheduler.staleness_hinge", ">= 0"));
  RETURN_IF_ERROR(Range(c.scheduler.target_staleness >= 0 &&
                            c.scheduler.target_staleness <= c.scheduler.max_staleness,
                        "scheduler.target_staleness",
                        absl::StrCat("in [0, scheduler.max_staleness=", c.scheduler.max_staleness,
                                     "] (0 = off)")));
  RETURN_IF_ERROR(Range(c.scheduler.min_local_steps >= 1, "scheduler.min_local_steps", ">= 1"));
  return absl::OkStatus();
}

Status ParseTrain(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "train"));
    RETURN_IF_ERROR(Read(s, "train", "local_epochs", &c.train.local_epochs));
    RETURN_IF_ERROR(Read(s, "train", "local_steps", &c.train.local_steps));
    RETURN_IF_ERROR(Read(s, "train", "optimizer", &c.train.optimizer));
    RETURN_IF_ERROR(Read(s, "train", "loss", &c.train.loss));
    RETURN_IF_ERROR(Read(s, "train", "loss_path", &c.train.loss_path));
    RETURN_IF_ERROR(Read(s, "train", "nesterov", &c.train.nesterov));
    RETURN_IF_ERROR(Read(s, "train", "clip_norm", &c.train.clip_norm));
    RETURN_IF_ERROR(Read(s, "train", "label_smoothing", &c.train.label_smoothing));
    RETURN_IF_ERROR(Read(s, "train", "schedule", &c.train.schedule));
    RETURN_IF_ERROR(Read(s, "train", "warmup_rounds", &c.train.warmup_rounds));
    RETURN_IF_ERROR(Read(s, "train", "step_rounds", &c.train.step_rounds));
    RETURN_IF_ERROR(Read(s, "train", "step_gamma", &c.train.step_gamma));
    RETURN_IF_ERROR(Read(s, "train", "lr_min", &c.train.lr_min));
    RETURN_IF_ERROR(Read(s, "train", "batch_size", &c.train.batch_size));
    RETURN_IF_ERROR(Read(s, "train", "lr", &c.train.lr));
    RETURN_IF_ERROR(Read(s, "train", "momentum", &c.train.momentum));
    RETURN_IF_ERROR(Read(s, "train", "weight_decay", &c.train.weight_decay));
  }
  RETURN_IF_ERROR(Range(c.train.local_epochs >= 1, "train.local_epochs", ">= 1"));
  RETURN_IF_ERROR(Range(c.train.batch_size >= 1, "train.batch_size", ">= 1"));
  RETURN_IF_ERROR(Range(c.train.lr > 0, "train.lr", "> 0"));
  RETURN_IF_ERROR(Range(c.train.momentum >= 0 && c.train.momentum < 1, "train.momentum",
                        "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.train.weight_decay >= 0, "train.weight_decay", ">= 0"));
  const TrainConfig& t = c.train;
  RETURN_IF_ERROR(Range(t.local_steps >= 0, "train.local_steps", ">= 0 (0 = use local_epochs)"));
  RETURN_IF_ERROR(Range(t.loss_path.empty() == (t.loss != "torchscript"), "train.loss_path",
                        "set exactly when train.loss is torchscript"));
  if (!t.loss_path.empty() && std::filesystem::path(t.loss_path).is_relative() && !base_dir.empty()) {
    c.train.loss_path = (std::filesystem::path(base_dir) / t.loss_path).string();
  }
  RETURN_IF_ERROR(Range(t.label_smoothing == 0 || t.loss == "cross_entropy", "train.label_smoothing",
                        "0 unless train.loss is cross_entropy"));
  RETURN_IF_ERROR(Range(!t.nesterov || (t.optimizer == "sgd" && t.momentum > 0), "train.nesterov",
                        "used with optimizer sgd and momentum > 0"));
  RETURN_IF_ERROR(Range(t.clip_norm >= 0, "train.clip_norm", ">= 0 (0 = no clipping)"));
  RETURN_IF_ERROR(Range(t.label_smoothing >= 0 && t.label_smoothing < 1, "train.label_smoothing",
                        "in [0, 1)"));
  RETURN_IF_ERROR(ScheduleNames().Check(t.schedule));
  RETURN_IF_ERROR(Range(t.warmup_rounds >= 0, "train.warmup_rounds", ">= 0"));
  RETURN_IF_ERROR(Range(t.step_rounds >= 1, "train.step_rounds", ">= 1"));
  RETURN_IF_ERROR(Range(t.step_gamma > 0 && t.step_gamma <= 1, "train.step_gamma", "in (0, 1]"));
  RETURN_IF_ERROR(Range(t.lr_min >= 0 && t.lr_min <= t.lr, "train.lr_min", "in [0, train.lr]"));
  return absl::OkStatus();
}

Status ParseStrategy(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "strategy"));
    RETURN_IF_ERROR(Read(s, "strategy", "name", &c.strategy.name));
    RETURN_IF_ERROR(Read(s, "strategy", "proximal_mu", &c.strategy.proximal_mu));
    c.strategy.server_lr_given = static_cast<bool>(s["server_lr"]);
    RETURN_IF_ERROR(Read(s, "strategy", "server_lr", &c.strategy.server_lr));
    RETURN_IF_ERROR(Read(s, "strategy", "server_momentum", &c.strategy.server_momentum));
    RETURN_IF_ERROR(Read(s, "strategy", "beta1", &c.strategy.beta1));
    RETURN_IF_ERROR(Read(s, "strategy", "beta2", &c.strategy.beta2));
    RETURN_IF_ERROR(Read(s, "strategy", "tau", &c.strategy.tau));
  }
  RETURN_IF_ERROR(Range(c.strategy.proximal_mu >= 0, "strategy.proximal_mu", ">= 0"));
  RETURN_IF_ERROR(Range(c.strategy.server_lr > 0, "strategy.server_lr", "> 0"));
  RETURN_IF_ERROR(Range(c.strategy.server_momentum >= 0 && c.strategy.server_momentum < 1,
                        "strategy.server_momentum", "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.strategy.beta1 >= 0 && c.strategy.beta1 < 1, "strategy.beta1",
                        "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.strategy.beta2 >= 0 && c.strategy.beta2 < 1, "strategy.beta2",
                        "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.strategy.tau > 0, "strategy.tau", "> 0"));
  return absl::OkStatus();
}

Status ParseSplit(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "split"));
    RETURN_IF_ERROR(Read(s, "split", "activation_noise", &c.split.activation_noise));
    RETURN_IF_ERROR(Read(s, "split", "nopeek", &c.split.nopeek));
    RETURN_IF_ERROR(Range(c.split.activation_noise >= 0, "split.activation_noise", ">= 0"));
    RETURN_IF_ERROR(Range(c.split.nopeek >= 0, "split.nopeek", ">= 0"));
    RETURN_IF_ERROR(Read(s, "split", "mode", &c.split.mode));
    if (s["cut"] && s["cut"].IsScalar() && s["cut"].Scalar() != "auto") {
      RETURN_IF_ERROR(Read(s, "split", "cut", &c.split.cut));
      RETURN_IF_ERROR(Range(c.split.cut >= 1, "split.cut", "\"auto\" or a stage index >= 1"));
    }
    RETURN_IF_ERROR(Read(s, "split", "tail", &c.split.tail));
    RETURN_IF_ERROR(Read(s, "split", "window", &c.split.window));
  }
  if (c.split.enabled()) {
    RETURN_IF_ERROR(Range(c.split.tail >= 1, "split.tail", ">= 1"));
    RETURN_IF_ERROR(Range(c.split.window >= 1 && c.split.window <= 64, "split.window",
                          "in [1, 64]"));
  }
  return absl::OkStatus();
}

Status ParseCompression(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "compression"));
    RETURN_IF_ERROR(Read(s, "compression", "update", &c.compression.update));
    RETURN_IF_ERROR(Read(s, "compression", "broadcast", &c.compression.broadcast));
    RETURN_IF_ERROR(Read(s, "compression", "activations", &c.compression.activations));
    RETURN_IF_ERROR(Read(s, "compression", "gradients", &c.compression.gradients));
  }
  return absl::OkStatus();
}

Status ParseServer(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "server"));
    RETURN_IF_ERROR(Read(s, "server", "evaluate", &c.server.evaluate));
    RETURN_IF_ERROR(Read(s, "server", "final_evaluation", &c.server.final_evaluation));
    RETURN_IF_ERROR(Read(s, "server", "max_update_abs", &c.server.max_update_abs));
    RETURN_IF_ERROR(Read(s, "server", "upload_idle_timeout_s", &c.server.upload_idle_timeout_s));
    RETURN_IF_ERROR(Read(s, "server", "handshake_timeout_s", &c.server.handshake_timeout_s));
    RETURN_IF_ERROR(Read(s, "server", "max_sessions", &c.server.max_sessions));
    RETURN_IF_ERROR(Read(s, "server", "max_connections", &c.server.max_connections));
    RETURN_IF_ERROR(Read(s, "server", "listen", &c.server.listen));
    RETURN_IF_ERROR(Read(s, "server", "heartbeat_s", &c.server.heartbeat_s));
    RETURN_IF_ERROR(Read(s, "server", "client_timeout_s", &c.server.client_timeout_s));
    RETURN_IF_ERROR(Read(s, "server", "max_model_elements", &c.server.max_model_elements));
    RETURN_IF_ERROR(Read(s, "server", "chunk_bytes", &c.server.chunk_bytes));
    RETURN_IF_ERROR(Read(s, "server", "eval_batch_size", &c.server.eval_batch_size));
    RETURN_IF_ERROR(Read(s, "server", "worker_threads", &c.server.worker_threads));
    RETURN_IF_ERROR(Read(s, "server", "metrics_listen", &c.server.metrics_listen));
    RETURN_IF_ERROR(Read(s, "server", "metrics_client_series", &c.server.metrics_client_series));
  }
  RETURN_IF_ERROR(Range(c.server.heartbeat_s > 0, "server.heartbeat_s", "> 0"));
  RETURN_IF_ERROR(Range(c.server.client_timeout_s > c.server.heartbeat_s,
                        "server.client_timeout_s", "> server.heartbeat_s"));
  RETURN_IF_ERROR(Range(c.server.max_model_elements > 0, "server.max_model_elements", "> 0"));
  RETURN_IF_ERROR(Range(c.server.chunk_bytes >= 1024 && c.server.chunk_bytes <= (2 << 20),
                        "server.chunk_bytes", "in [1024, 2 MiB] (gRPC's limit is 4 MiB)"));
  RETURN_IF_ERROR(Range(c.server.eval_batch_size >= 1, "server.eval_batch_size", ">= 1"));
  RETURN_IF_ERROR(Range(c.server.worker_threads >= 1, "server.worker_threads", ">= 1"));
  RETURN_IF_ERROR(Range(c.server.metrics_client_series >= 0, "server.metrics_client_series",
                        ">= 0"));
  RETURN_IF_ERROR(Range(c.server.metrics_listen.empty() ||
                            c.server.metrics_listen.rfind(':') != std::string::npos,
                        "server.metrics_listen", "host:port, or empty (off)"));
  RETURN_IF_ERROR(Range(c.server.max_update_abs > 0, "server.max_update_abs", "> 0"));
  RETURN_IF_ERROR(Range(c.server.upload_idle_timeout_s > 0, "server.upload_idle_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.server.handshake_timeout_s > 0, "server.handshake_timeout_s", "> 0"));
  RETURN_IF_ERROR(Range(c.server.max_sessions >= 0, "server.max_sessions",
                        ">= 0 (0 = derived from the open-file limit)"));
  RETURN_IF_ERROR(Range(c.server.max_connections >= 0, "server.max_connections",
                        ">= 0 (0 = derived from the open-file limit)"));
  return absl::OkStatus();
}

Status ParseTls(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "tls"));
    RETURN_IF_ERROR(Read(s, "tls", "revoked", &c.tls.revoked));
    RETURN_IF_ERROR(Read(s, "tls", "cert", &c.tls.cert));
    RETURN_IF_ERROR(Read(s, "tls", "key", &c.tls.key));
    RETURN_IF_ERROR(Read(s, "tls", "ca", &c.tls.ca));
    RETURN_IF_ERROR(Read(s, "tls", "mutual", &c.tls.mutual));
    RETURN_IF_ERROR(Read(s, "tls", "reload_s", &c.tls.reload_s));
    if (c.tls.cert.empty() != c.tls.key.empty()) {
      return absl::InvalidArgumentError("tls.cert and tls.key go together");
    }
    if (c.tls.reload_s < 1) return absl::InvalidArgumentError("tls.reload_s must be >= 1");
    if (!c.tls.revoked.empty() && !c.tls.mutual) {
      return absl::InvalidArgumentError("tls.revoked names device identities: it needs tls.mutual");
    }
  }
  return absl::OkStatus();
}

Status ParseAuth(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "auth"));
    RETURN_IF_ERROR(Read(s, "auth", "token_file", &c.auth.token_file));
  }
  return absl::OkStatus();
}

Status ParseSecureAggregation(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    const std::string sec = "secure_aggregation";
    auto& a = c.secure_aggregation;
    RETURN_IF_ERROR(CheckKeys(s, sec));
    a.enabled = true;
    RETURN_IF_ERROR(Read(s, sec, "enabled", &a.enabled));
    RETURN_IF_ERROR(Read(s, sec, "k", &a.k));
    RETURN_IF_ERROR(Read(s, sec, "t", &a.t));
    RETURN_IF_ERROR(Read(s, sec, "clip", &a.clip));
    RETURN_IF_ERROR(Read(s, sec, "bits", &a.bits));
    RETURN_IF_ERROR(Read(s, sec, "modulus", &a.modulus));
    RETURN_IF_ERROR(Read(s, sec, "stage_timeout_s", &a.stage_timeout_s));
    RETURN_IF_ERROR(Range(a.k >= 2, "secure_aggregation.k", ">= 2"));
    RETURN_IF_ERROR(Range(a.t >= 2 && a.t <= a.k, "secure_aggregation.t", "in [2, k]"));
    RETURN_IF_ERROR(Range(a.clip > 0 && std::isfinite(a.clip), "secure_aggregation.clip", "> 0"));
    RETURN_IF_ERROR(Range(a.bits >= 1 && a.bits <= 32, "secure_aggregation.bits", "in [1, 32]"));
    RETURN_IF_ERROR(Range(a.modulus > (uint64_t{1} << a.bits), "secure_aggregation.modulus",
                          "> 2^bits (and > clients x (2^bits - 1) for sums not to wrap)"));
    RETURN_IF_ERROR(Range(a.stage_timeout_s > 0, "secure_aggregation.stage_timeout_s", "> 0"));
  }
  return absl::OkStatus();
}

Status ParseDp(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    auto& d = c.dp;
    RETURN_IF_ERROR(CheckKeys(s, "dp"));
    d.enabled = true;
    RETURN_IF_ERROR(Read(s, "dp", "enabled", &d.enabled));
    RETURN_IF_ERROR(Read(s, "dp", "noise_multiplier", &d.noise_multiplier));
    RETURN_IF_ERROR(Read(s, "dp", "clip", &d.clip));
    RETURN_IF_ERROR(Read(s, "dp", "adaptive", &d.adaptive));
    RETURN_IF_ERROR(Read(s, "dp", "target_quantile", &d.target_quantile));
    RETURN_IF_ERROR(Read(s, "dp", "clip_lr", &d.clip_lr));
    RETURN_IF_ERROR(Read(s, "dp", "clip_count_stddev", &d.clip_count_stddev));
    RETURN_IF_ERROR(Read(s, "dp", "noise", &d.noise));
    RETURN_IF_ERROR(Read(s, "dp", "delta", &d.delta));
    RETURN_IF_ERROR(Read(s, "dp", "target_epsilon", &d.target_epsilon));
    RETURN_IF_ERROR(Range(d.noise_multiplier > 0, "dp.noise_multiplier", "> 0"));
    RETURN_IF_ERROR(Range(d.clip > 0, "dp.clip", "> 0"));
    RETURN_IF_ERROR(Range(d.target_quantile > 0 && d.target_quantile < 1, "dp.target_quantile",
                          "in (0, 1)"));
    RETURN_IF_ERROR(Range(d.clip_lr >= 0, "dp.clip_lr", ">= 0"));
    RETURN_IF_ERROR(Range(d.clip_count_stddev >= 0, "dp.clip_count_stddev", ">= 0"));
    RETURN_IF_ERROR(DpNoiseNames().Check(d.noise));
    RETURN_IF_ERROR(Range(d.delta > 0 && d.delta < 1, "dp.delta", "in (0, 1)"));
    RETURN_IF_ERROR(Range(d.target_epsilon >= 0, "dp.target_epsilon", ">= 0"));
  }
  return absl::OkStatus();
}

Status ParseAggregation(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    auto& a = c.aggregation;
    RETURN_IF_ERROR(CheckKeys(s, "aggregation"));
    RETURN_IF_ERROR(Read(s, "aggregation", "weighting", &a.weighting));
    RETURN_IF_ERROR(Read(s, "aggregation", "max_weight_ratio", &a.max_weight_ratio));
    RETURN_IF_ERROR(Read(s, "aggregation", "max_client_examples", &a.max_client_examples));
    RETURN_IF_ERROR(WeightingNames().Check(a.weighting));
    RETURN_IF_ERROR(Range(a.max_weight_ratio == 0 || a.max_weight_ratio >= 1,
                          "aggregation.max_weight_ratio", "0 (no cap) or >= 1"));
    RETURN_IF_ERROR(Range(a.max_client_examples >= 0, "aggregation.max_client_examples",
                          ">= 0 (0 = no cap)"));
    RETURN_IF_ERROR(Read(s, "aggregation", "root_data", &a.root_data));
    RETURN_IF_ERROR(Read(s, "aggregation", "rule", &a.rule));
    RETURN_IF_ERROR(Read(s, "aggregation", "f", &a.f));
    RETURN_IF_ERROR(Read(s, "aggregation", "m", &a.m));
    RETURN_IF_ERROR(Read(s, "aggregation", "max_norm", &a.max_norm));
    RETURN_IF_ERROR(Range(a.rule != "fltrust" || !a.root_data.empty(), "aggregation.root_data",
                          "set for fltrust (e.g. fmnist:DIR,limit=100)"));
    RETURN_IF_ERROR(Range(a.f >= 0, "aggregation.f", ">= 0"));
    RETURN_IF_ERROR(Range(a.m >= 0, "aggregation.m", ">= 0"));
    RETURN_IF_ERROR(Range(a.rule != "norm_bound" || a.max_norm > 0, "aggregation.max_norm",
                          "> 0 for norm_bound"));
  }
  return absl::OkStatus();
}

Status ParseLocal(const YAML::Node& s, const std::string& base_dir, JobConfig& c) {
  if (s) {
    RETURN_IF_ERROR(CheckKeys(s, "local"));
    RETURN_IF_ERROR(Read(s, "local", "attack", &c.local.attack));
    RETURN_IF_ERROR(Read(s, "local", "attackers", &c.local.attackers));
    if (!c.local.attack.empty()) RETURN_IF_ERROR(AttackNames().Check(c.local.attack));
    RETURN_IF_ERROR(Range(c.local.attackers >= 0 && (c.local.attackers == 0 || !c.local.attack.empty()),
                          "local.attackers", ">= 0, with local.attack set"));
    RETURN_IF_ERROR(Read(s, "local", "data", &c.local.data));
    RETURN_IF_ERROR(Read(s, "local", "partition", &c.local.partition));
    RETURN_IF_ERROR(Read(s, "local", "partition_seed", &c.local.partition_seed));
    RETURN_IF_ERROR(Read(s, "local", "clients", &c.local.clients));
    RETURN_IF_ERROR(Read(s, "local", "holdout", &c.local.holdout));
    RETURN_IF_ERROR(Read(s, "local", "trace", &c.local.trace));
    if (auto list = s["profiles"]) {
      if (!list.IsSequence()) return absl::InvalidArgumentError("local.profiles must be a list");
      for (const auto& p : list) {
        const std::string sec = "local.profiles[]";
        RETURN_IF_ERROR(
            CheckKeys(p, sec));
        DeviceEmulation d;
        RETURN_IF_ERROR(Read(p, sec, "uplink_mbps", &d.uplink_mbps));
        RETURN_IF_ERROR(Read(p, sec, "downlink_mbps", &d.downlink_mbps));
        RETURN_IF_ERROR(Read(p, sec, "slowdown", &d.slowdown));
        RETURN_IF_ERROR(Read(p, sec, "memory_limit_mb", &d.memory_limit_mb));
        RETURN_IF_ERROR(Range(d.uplink_mbps >= 0 && d.downlink_mbps >= 0,
                              "local.profiles[].uplink_mbps/downlink_mbps", ">= 0"));
        RETURN_IF_ERROR(Range(d.slowdown >= 1, "local.profiles[].slowdown", ">= 1"));
        RETURN_IF_ERROR(Range(d.memory_limit_mb >= 0, "local.profiles[].memory_limit_mb", ">= 0"));
        c.local.profiles.push_back(d);
      }
    }
  }
  RETURN_IF_ERROR(Range(c.local.clients >= 1, "local.clients", ">= 1"));
  RETURN_IF_ERROR(Range(c.local.holdout >= 0 && c.local.holdout <= 0.9, "local.holdout", "in [0, 0.9]"));
  return absl::OkStatus();
}
}  // namespace

StatusOr<JobConfig> JobConfig::ParseYaml(const std::string& yaml_text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config is not valid YAML: ", e.msg));
  }
  JobConfig c;
  if (!root || root.IsNull()) return c;
  RETURN_IF_ERROR(CheckKeys(root, "config"));
  // Each section in turn, present or not (its checks hold its defaults too).
  using SectionParser = Status (*)(const YAML::Node&, const std::string&, JobConfig&);
  static const std::pair<const char*, SectionParser> kSections[] = {
      {"run", ParseRun},
      {"model", ParseModel},
      {"data", ParseData},
      {"clients", ParseClients},
      {"scheduler", ParseScheduler},
      {"train", ParseTrain},
      {"strategy", ParseStrategy},
      {"split", ParseSplit},
      {"compression", ParseCompression},
      {"server", ParseServer},
      {"tls", ParseTls},
      {"auth", ParseAuth},
      {"secure_aggregation", ParseSecureAggregation},
      {"dp", ParseDp},
      {"aggregation", ParseAggregation},
      {"local", ParseLocal},
  };
  for (const auto& [name, parse] : kSections) RETURN_IF_ERROR(parse(root[name], base_dir, c));
  return c;
}

const NameTable& LoraTargetNames() {
  static const NameTable t{"model.lora.targets", {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}};
  return t;
}

std::vector<std::string> JobConfig::Keys() {
  std::vector<std::string> out;
  for (const auto& [section, keys] : KnownKeys()) {
    if (section == "config") continue;  // the sections themselves
    for (const std::string& k : keys) out.push_back(section + "." + k);
  }
  return out;
}

StatusOr<JobConfig> JobConfig::LoadYaml(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string base = std::filesystem::path(path).parent_path().string();
  auto c = ParseYaml(ss.str(), base);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  }
  return c;
}

const NameTable& TopologyNames() {
  static const NameTable t{"scheduler.topology", {"ring", "random", "measured"}};
  return t;
}

const NameTable& StalenessNames() {
  static const NameTable t{"scheduler.staleness", {"constant", "polynomial", "hinge"}};
  return t;
}

const NameTable& DpNoiseNames() {
  static const NameTable t{"dp.noise", {"central", "distributed"}};
  return t;
}

const NameTable& WeightingNames() {
  static const NameTable t{"aggregation.weighting", {"examples", "equal"}};
  return t;
}

const NameTable& AttackNames() {
  static const NameTable t{"local.attack", {"sign-flip", "gaussian", "label-flip", "alie", "ipm"}};
  return t;
}

const NameTable& ScheduleNames() {
  static const NameTable t{"train.schedule", {"constant", "step", "cosine"}};
  return t;
}

FitSettings FitOf(const TrainConfig& t) {
  FitSettings f;
  f.local_epochs = t.local_epochs;
  f.local_steps = t.local_steps;
  f.batch_size = t.batch_size;
  f.loss = t.loss;
  f.optimizer = t.optimizer;
  f.lr = t.lr;
  f.momentum = t.momentum;
  f.nesterov = t.nesterov;
  f.weight_decay = t.weight_decay;
  f.clip_norm = t.clip_norm;
  f.label_smoothing = t.label_smoothing;
  return f;
}

double ScheduledLr(const TrainConfig& t, int64_t round, int64_t rounds) {
  const int64_t r = round - 1;  // 0-based
  if (r < t.warmup_rounds) return t.lr * static_cast<double>(r + 1) / t.warmup_rounds;
  const int64_t k = r - t.warmup_rounds;
  if (t.schedule == "step") return t.lr * std::pow(t.step_gamma, static_cast<double>(k / t.step_rounds));
  if (t.schedule == "cosine") {
    const int64_t total = std::max<int64_t>(1, rounds - t.warmup_rounds);
    return t.lr_min + (t.lr - t.lr_min) * (1 + std::cos(M_PI * static_cast<double>(k) / total)) / 2;
  }
  return t.lr;
}

}  // namespace cleave
