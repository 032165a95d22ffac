// Client: uploads (client/uploader.h).
#include "client/uploader.h"

#include "absl/strings/str_cat.h"
#include "client/transfer.h"
#include "models/part.h"
#include "split/record.h"

namespace cleave {

StatusOr<v1::UploadReply> Uploader::Upload(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                           const v1::Task& task, const ParameterSet& delta,
                                           int64_t examples, double loss, double seconds,
                                           const v1::SplitStats* split,
                                           const v1::ClientEvaluation* evaluation,
                                           const v1::GossipStats* gossip) {
  const std::string& spec = task.update_codec();
  const bool fp32 = spec.empty() || CodecFamily(spec) == "none";
  v1::UploadHeader h = TaskUploadHeader(w, task, examples, fp32 ? "fp32" : spec);
  h.set_train_loss(loss);
  h.set_train_seconds(seconds);
  if (split) *h.mutable_split() = *split;
  if (evaluation) *h.mutable_evaluation() = *evaluation;
  if (gossip) *h.mutable_gossip() = *gossip;
  if (fp32) {
    return UploadPayload(stub, h, delta.Encode(), 1 << 20, 600, emulator_);
  }
  std::string key = spec;
  for (const auto& t : delta.tensors()) absl::StrAppend(&key, "|", t.name);
  if (!codec_ || key != codec_key_) {
    ASSIGN_OR_RETURN(codec_, MakeCodec(spec, std::hash<std::string>{}(opts_.name)));
    codec_key_ = std::move(key);
  }
  return UploadPayload(stub, h, EncodeTensors(*codec_, delta), 1 << 20, 600, emulator_);
}

std::string Uploader::SentPath(const v1::Task& task, const v1::Welcome& w) const {
  return absl::StrCat(opts_.state_dir, "/sent/round-", task.round(), "/", w.client_id(), ".pb");
}

void Uploader::KeepFirstBatch(const v1::Task& task, const v1::Welcome& w,
                              const LocalTrainOptions& o) const {
  const std::vector<int64_t> idx = FirstBatchIndices(opts_.train.size, o.seed, o.batch_size);
  Activations in = InputBatch(opts_.train, idx);
  SplitRecorder sent(SentPath(task, w), 1);
  sent.Add({}, 0,
           RecordedBatch{Tensor{"", std::move(in.shape), std::move(in.values)},
                         BatchLabels(opts_.train, idx),
                         {},
                         {}});
}

}  // namespace cleave
