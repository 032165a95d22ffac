// Byzantine-robust aggregation rules over the round's updates, each flattened to one
// vector (all the same length). Unweighted, except `norm_bound`.
//
// Krum's score (Blanchard et al. 2017) of update i is the sum of squared Euclidean
// distances to its max(1, n - f - 2) nearest other updates (the convention of Flower's
// Krum); the lowest score wins, ties to the lower index. Multi-Krum averages the m
// lowest-scoring updates. Bulyan (El Mhamdi et al. 2018) picks n - 2f updates by
// repeated Krum, then averages per coordinate the n - 4f values closest to their median.
// FLTrust weighs updates by their agreement with the server's own update on clean root
// data. Unlike the mean these need every update at once: server memory O(n x model).
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cleave::robust {

using Updates = std::vector<std::vector<float>>;

// Of one coordinate's values, sorted: their median, and their mean without the f
// smallest and f largest (n > 2f).
float SortedMedian(const std::vector<float>& sorted);
float SortedTrimmedMean(const std::vector<float>& sorted, int f);

std::vector<float> Mean(const Updates& u);
std::vector<float> Median(const Updates& u);
// Per coordinate: drops the f largest and f smallest values, averages the rest.
std::vector<float> TrimmedMean(const Updates& u, int f);
// Indices of the m lowest Krum scores, best first.
std::vector<int> KrumSelect(const Updates& u, int f, int m);
std::vector<float> Krum(const Updates& u, int f);
std::vector<float> MultiKrum(const Updates& u, int f, int m);
std::vector<float> Bulyan(const Updates& u, int f);
// FLTrust (Cao et al. 2021): each update is scaled to the norm of the server's own
// update `reference` (trained on its clean root data) and weighted by its trust score
// ReLU(cos(update, reference)); the weighted mean. All scores 0: the zero update.
std::vector<float> FlTrust(const Updates& u, const std::vector<float>& reference);
// Scales each update down to L2 norm <= max_norm, then the mean weighted by `weights`.
std::vector<float> NormBound(const Updates& u, const std::vector<double>& weights, double max_norm);

// The rule registered as `rule` (RobustRules(), aggregation/registry.h: mean, median,
// trimmed_mean, krum, multi_krum, bulyan, norm_bound, fltrust; fltrust needs
// `reference`). m = 0 means n - f. FAILED_PRECONDITION when the rule cannot run on
// these n updates with f (Needs); INVALID_ARGUMENT naming the rules for an unknown one.
StatusOr<std::vector<float>> Aggregate(const std::string& rule, const Updates& u,
                                       const std::vector<double>& weights, int f, int m,
                                       double max_norm,
                                       const std::vector<float>& reference = {});

// OK when `ok`; else FAILED_PRECONDITION "aggregation.rule R with f = F needs WHAT; the
// round has N updates" (a rule's RuleKind::requires).
Status Needs(const std::string& rule, int n, int f, bool ok, const std::string& what);

}  // namespace cleave::robust
