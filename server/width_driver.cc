#include "server/width_driver.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "aggregation/strategy.h"
#include "models/model.h"
#include "server/options.h"
#include "server/server.h"

namespace cleave {

double WidthDriver::RateOf(const std::string& name) const {
  const WidthConfig& w = ctx_.config().width;
  for (const WidthConfig::Client& c : w.clients) {
    if (c.name == name) return c.rate;
  }
  return w.rate;
}

Status WidthDriver::BeginLocked(int64_t round, const FitSettings& /*fit*/, std::vector<std::string>* clients) {
  round_ = round;
  rates_.clear();
  task_rates_.clear();
  submodels_.clear();
  closed_.reset();
  sum_ = std::make_shared<SubmodelSum>(ctx_.GlobalLocked());
  for (const std::string& id : *clients) {
    const double rate = RateOf(ctx_.FindSessionLocked(id)->name);
    RETURN_IF_ERROR(SubmodelLocked(rate).status());
    rates_[id] = rate;
  }
  return absl::OkStatus();
}

StatusOr<WidthDriver::Submodel*> WidthDriver::SubmodelLocked(double rate) {
  auto it = submodels_.find(rate);
  if (it != submodels_.end()) return &it->second;
  auto layout = layouts_.find(rate);
  if (layout == layouts_.end()) {  // the submodel's shapes, from the model built at its width
    ModelSpec spec = ctx_.model_spec();
    spec.width = rate;
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(spec));
    layout = layouts_.emplace(rate, model->Parameters()).first;
  }
  // FedRolex's window starts one further each round; HeteroFL's is the leading one.
  const int64_t roll = ctx_.config().width.method == "fedrolex" ? round_ - 1 : 0;
  Submodel s;
  ASSIGN_OR_RETURN(auto positions, SubmodelPositions(ctx_.GlobalLocked(), layout->second, roll));
  s.positions = std::make_shared<const std::vector<std::vector<int64_t>>>(std::move(positions));
  auto part = std::make_shared<const ParameterSet>(Gather(ctx_.GlobalLocked(), layout->second, *s.positions));
  auto blob = std::make_shared<const std::string>(ctx_.ModelBlob(*part));
  s.digest = Sha256Hex(*blob);
  s.size = static_cast<int64_t>(blob->size());
  ctx_.AddBlobLocked(s.digest, std::move(blob), static_cast<int64_t>(part->EncodedSize()));
  s.part = std::move(part);
  return &submodels_.emplace(rate, std::move(s)).first->second;
}

void WidthDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  const double rate = rates_.at(rec->client_id);
  const Submodel& s = submodels_.at(rate);  // made by BeginLocked
  task->mutable_model()->set_width(rate);
  task->set_model_digest(s.digest);
  task->set_model_size(s.size);
  rec->expected_size = static_cast<int64_t>(s.part->EncodedSize());
  task_rates_[rec->id] = rate;
}

const ParameterSet* WidthDriver::UploadLayoutLocked(const TaskRecord& t) {
  auto rate = task_rates_.find(t.id);
  if (rate == task_rates_.end()) return nullptr;
  auto s = submodels_.find(rate->second);
  return s != submodels_.end() ? s->second.part.get() : nullptr;
}

RoundDriver::AddUpload WidthDriver::ClaimUploadLocked(const TaskRecord& t) {
  auto rate = task_rates_.find(t.id);
  if (rate == task_rates_.end()) return nullptr;
  return [sum = sum_, positions = submodels_.at(rate->second).positions](const std::vector<TensorView>& delta,
                                                                         int64_t weight) -> Status {
    return sum->Add(delta, *positions, static_cast<double>(weight));
  };
}

void WidthDriver::CloseLocked(int64_t /*round*/, RoundMetrics* m) {
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    auto rate = task_rates_.find(id);
    if (rate == task_rates_.end() || t.state != TaskState::kDone) continue;
    const Session* s = ctx_.FindSessionLocked(t.client_id);
    m->widths[s ? s->name : t.client_id] = rate->second;
  }
  closed_ = std::move(sum_);
}

Status WidthDriver::Fold(const ParameterSet& /*start*/, int64_t /*weight*/) {
  const std::shared_ptr<SubmodelSum> sum = std::move(closed_);
  if (!sum) return absl::InternalError("width: no closed round to aggregate");
  const ParameterSet mean = sum->Mean();
  ctx_.Accumulate(ClientUpdate::Unnamed(ViewsOf(mean), 1));
  return absl::OkStatus();
}

}  // namespace cleave
