#include "aggregation/options.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "aggregation/registry.h"

namespace cleave {

const NameTable& WeightingNames() {
  static const NameTable t{"aggregation.weighting", {"examples", "equal"}};
  return t;
}

void ReadStrategy(ConfigSection& s, StrategyConfig& c) {
  s.Read("name", c.name);
  s.Read("proximal_mu", c.proximal_mu);
  if (s.Has("server_lr")) c.server_lr_given = true;
  s.Read("server_lr", c.server_lr);
  s.Read("server_momentum", c.server_momentum);
  s.Read("beta1", c.beta1);
  s.Read("beta2", c.beta2);
  s.Read("tau", c.tau);
}

Status CheckStrategy(StrategyConfig& c) {
  ASSIGN_OR_RETURN(const StrategyKind* kind, Strategies().Get(c.name));
  if (!c.server_lr_given) c.server_lr = kind->default_server_lr;
  RETURN_IF_ERROR(Range(c.proximal_mu >= 0, "strategy.proximal_mu", ">= 0"));
  RETURN_IF_ERROR(Range(c.server_lr > 0, "strategy.server_lr", "> 0"));
  RETURN_IF_ERROR(Range(c.server_momentum >= 0 && c.server_momentum < 1,
                        "strategy.server_momentum", "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.beta1 >= 0 && c.beta1 < 1, "strategy.beta1", "in [0, 1)"));
  RETURN_IF_ERROR(Range(c.beta2 >= 0 && c.beta2 < 1, "strategy.beta2", "in [0, 1)"));
  return Range(c.tau > 0, "strategy.tau", "> 0");
}

void ReadAggregation(ConfigSection& s, AggregationConfig& a) {
  s.Read("rule", a.rule);
  s.Read("f", a.f);
  s.Read("m", a.m);
  s.Read("max_norm", a.max_norm);
  s.Read("root_data", a.root_data);
  s.Read("weighting", a.weighting);
  s.Read("max_weight_ratio", a.max_weight_ratio);
  s.Read("max_client_examples", a.max_client_examples);
}

Status CheckAggregation(AggregationConfig& a) {
  RETURN_IF_ERROR(RuleNames().Check(a.rule));
  RETURN_IF_ERROR(WeightingNames().Check(a.weighting));
  RETURN_IF_ERROR(Range(a.max_weight_ratio == 0 || a.max_weight_ratio >= 1,
                        "aggregation.max_weight_ratio", "0 (no cap) or >= 1"));
  RETURN_IF_ERROR(Range(a.max_client_examples >= 0, "aggregation.max_client_examples",
                        ">= 0 (0 = no cap)"));
  RETURN_IF_ERROR(Range(a.rule != "fltrust" || !a.root_data.empty(), "aggregation.root_data",
                        "set for fltrust (e.g. fmnist:DIR,limit=100)"));
  RETURN_IF_ERROR(Range(a.f >= 0, "aggregation.f", ">= 0"));
  RETURN_IF_ERROR(Range(a.m >= 0, "aggregation.m", ">= 0"));
  return Range(a.rule != "norm_bound" || a.max_norm > 0, "aggregation.max_norm",
               "> 0 for norm_bound");
}

void ReadWidth(ConfigSection& s, WidthConfig& c) {
  c.enabled = s.given();
  s.Read("enabled", c.enabled);
  s.Read("method", c.method);
  s.Read("rate", c.rate);
  s.Read("assign", c.assign);
  s.Read("rates", c.rates);
  s.Read("max_task_s", c.max_task_s);
  ConfigSection d = s.Section("distill");
  d.Read("data", c.distill.data);
  d.Read("steps", c.distill.steps);
  d.Read("lr", c.distill.lr);
  d.Read("batch_size", c.distill.batch_size);
  d.Read("temperature", c.distill.temperature);
  s.ForEach("clients", [&c](ConfigSection& item) {
    WidthConfig::Client client;
    item.Read("name", client.name);
    item.Read("rate", client.rate);
    if (item.given()) c.clients.push_back(client);
  });
}

Status CheckWidth(WidthConfig& c) {
  RETURN_IF_ERROR(Range(c.method == "heterofl" || c.method == "fedrolex" || c.ranks(), "width.method",
                        "heterofl, fedrolex, hetlora or flexlora"));
  RETURN_IF_ERROR(Range(c.rate > 0 && c.rate <= 1, "width.rate", "in (0, 1]"));
  RETURN_IF_ERROR(Range(c.assign == "fixed" || c.assign == "profile", "width.assign", "fixed or profile"));
  RETURN_IF_ERROR(Range(!c.rates.empty(), "width.rates", "at least one rate"));
  for (double r : c.rates) RETURN_IF_ERROR(Range(r > 0 && r <= 1, "width.rates", "rates in (0, 1]"));
  std::sort(c.rates.begin(), c.rates.end(), std::greater<double>());
  RETURN_IF_ERROR(Range(c.max_task_s >= 0 && std::isfinite(c.max_task_s), "width.max_task_s", ">= 0"));
  RETURN_IF_ERROR(Range(c.distill.steps >= 1 && c.distill.steps <= 1000000, "width.distill.steps", "in [1, 1000000]"));
  RETURN_IF_ERROR(Range(c.distill.lr > 0, "width.distill.lr", "> 0"));
  RETURN_IF_ERROR(Range(c.distill.batch_size >= 1 && c.distill.batch_size <= 65536, "width.distill.batch_size",
                        "in [1, 65536]"));
  RETURN_IF_ERROR(Range(c.distill.temperature > 0, "width.distill.temperature", "> 0"));
  if (!c.distill.data.empty()) {
    RETURN_IF_ERROR(Range(!c.ranks(), "width.distill", "used with width.method heterofl or fedrolex"));
  }
  for (const WidthConfig::Client& client : c.clients) {
    RETURN_IF_ERROR(Range(!client.name.empty(), "width.clients[].name", "a client's name"));
    RETURN_IF_ERROR(Range(client.rate > 0 && client.rate <= 1, "width.clients[].rate", "in (0, 1]"));
  }
  return absl::OkStatus();
}

}  // namespace cleave
