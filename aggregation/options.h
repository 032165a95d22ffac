// The strategy and aggregation sections of a job config (core/config_section.h; the job
// layer registers them, job/job.cc). docs/configuration.md describes each key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_section.h"
#include "core/names.h"

namespace cleave {

struct StrategyConfig {
  std::string name = "fedavg";   // strategy.name: a Strategies() name (aggregation/registry.h)
  double proximal_mu = 0.0;      // strategy.proximal_mu (fedprox)
  double server_lr = 1.0;        // strategy.server_lr (eta; when absent, the strategy's
                                 //   default: 1.0 for fedavg/fedavgm, 0.7 for diloco, 0.1
                                 //   for the adaptive ones; CheckStrategy sets it)
  bool server_lr_given = false;  // whether the job set strategy.server_lr
  double server_momentum = 0.9;  // strategy.server_momentum (fedavgm, diloco)
  double beta1 = 0.9;            // strategy.beta1 (fedadam, fedyogi, fedadagrad)
  double beta2 = 0.99;           // strategy.beta2 (fedadam, fedyogi)
  double tau = 1e-3;             // strategy.tau: adaptivity, added to sqrt(v)
};

// Byzantine-robust aggregation of the round's updates (instead of the weighted mean).
struct AggregationConfig {
  std::string rule = "mean";  // aggregation.rule: a RobustRules() name: mean | median |
                              //   trimmed_mean | krum | multi_krum | bulyan | norm_bound | fltrust
  int f = 0;                  // aggregation.f: attackers to tolerate
  int m = 0;                  // aggregation.m: multi_krum's selection (0 = n - f)
  double max_norm = 0;        // aggregation.max_norm: norm_bound's L2 bound
  std::string root_data;      // aggregation.root_data: FLTrust's clean server data set
  // What a client's update weighs: the example count it declares (bounded below) or 1.
  std::string weighting = "examples";  // aggregation.weighting: examples | equal
  // A client's weight is at most this multiple of the median declared example count of
  // the round's sampled clients (0 = no such cap).
  double max_weight_ratio = 3;         // aggregation.max_weight_ratio
  int64_t max_client_examples = 0;     // aggregation.max_client_examples: absolute cap (0 = none)
};

// Devices of unequal size. Width-scaled submodels (HeteroFL, Diao et al. 2021; FedRolex,
// Alam et al. 2022): each device trains a submodel keeping a fraction (its rate) of every
// hidden layer, and the server averages each element over the devices that hold it
// (aggregation/submodel.h). Per-device LoRA ranks (HetLoRA, Cho et al. 2024; FlexLoRA,
// Bai et al. 2024): a device's rate is the fraction of model.lora.rank it trains
// (models/lora_ranks.h).
struct WidthConfig {
  bool enabled = false;             // width.enabled (true when the section is given)
  std::string method = "heterofl";  // width.method: heterofl (the leading channels) |
                                    //   fedrolex (a window that rolls by one each round) |
                                    //   hetlora (LoRA ranks, zero-padded mean) |
                                    //   flexlora (LoRA ranks, mean product, SVD back)
  double rate = 1;                  // width.rate: a device's rate unless width.clients pins it
  struct Client {
    std::string name;  // cleave-client --name
    double rate = 1;
  };
  std::vector<Client> clients;      // width.clients: [{name, rate}, ...]
  // width.assign: fixed (width.rate) | profile: a device not pinned gets the largest of
  // width.rates its Profile admits (memory, and with width.max_task_s its task's time).
  std::string assign = "fixed";
  std::vector<double> rates = {1, 0.5, 0.25, 0.125, 0.0625};  // width.rates
  double max_task_s = 0;            // width.max_task_s: 0 = no bound on the task's time
  // width.distill: FedDF (Lin et al. 2020) after each round's aggregation: the server
  // distils the ensemble of the devices' trained submodels (their mean logits) into the
  // whole model on unlabeled data it holds (submodel methods; models/model.h Distill).
  struct Distill {
    std::string data;        // width.distill.data: a data spec (labels unused); "" = off
    int64_t steps = 200;     // width.distill.steps: Adam steps a round
    double lr = 1e-3;        // width.distill.lr
    int batch_size = 128;    // width.distill.batch_size
    double temperature = 1;  // width.distill.temperature
  } distill;
  // Whether a rate is a fraction of the LoRA rank (hetlora, flexlora), not of the widths.
  bool ranks() const { return method == "hetlora" || method == "flexlora"; }
};

void ReadWidth(ConfigSection& s, WidthConfig& c);
Status CheckWidth(WidthConfig& c);

// What an update can weigh (aggregation.weighting; aggregation/weighting.h).
const NameTable& WeightingNames();

void ReadStrategy(ConfigSection& s, StrategyConfig& c);
// Checks strategy.name against Strategies() and fills server_lr with the strategy's
// default unless the job gave it.
Status CheckStrategy(StrategyConfig& c);
void ReadAggregation(ConfigSection& s, AggregationConfig& c);
// Checks aggregation.rule against RobustRules().
Status CheckAggregation(AggregationConfig& c);

}  // namespace cleave
