#include "tools/attack.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/files.h"
#include "data/dataset.h"
#include "job/job.h"
#include "models/inversion.h"
#include "models/kinds.h"
#include "models/model.h"
#include "split/attacks.h"
#include "split/record.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

// The run's records, relative to RUN_DIR/record, in order; round > 0: that round's only.
std::vector<std::string> RecordNames(const std::string& run_dir, int round = 0) {
  const fs::path root = fs::path(run_dir) / "record";
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".pb") continue;
    std::string name = fs::relative(it->path(), root).string();
    if (round <= 0 || absl::StartsWith(name, absl::StrCat("round-", round, "/"))) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<SplitRecord> ReadRecord(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path.string()));
  return DecodeSplitRecord(bytes);
}

// The device's own copy of what it sent in the recorded task `name` (round-R/CLIENT.pb),
// from whichever device of the run kept it; NOT_FOUND when none did.
StatusOr<SplitRecord> SentRecord(const std::string& run_dir, const std::string& name) {
  std::error_code ec;
  for (fs::directory_iterator it(fs::path(run_dir) / "clients", ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path f = it->path() / "sent" / name;
    if (fs::is_regular_file(f)) return ReadRecord(f);
  }
  return absl::NotFoundError("no device kept a copy of what it sent");
}

// Rows of images ([C, H, W] pixels in [0, 1]) as one PNG, each image three times its size.
Status WriteGrid(const std::string& path, const std::vector<std::vector<std::vector<float>>>& rows,
                 const std::vector<int64_t>& shape) {
  const int64_t c = shape[0], h = shape[1], w = shape[2], scale = 3, gap = 2;
  size_t cols = 0;
  for (const auto& r : rows) cols = std::max(cols, r.size());
  const int64_t width = static_cast<int64_t>(cols) * (w * scale + gap) + gap;
  const int64_t height = static_cast<int64_t>(rows.size()) * (h * scale + gap) + gap;
  std::vector<unsigned char> png(width * height * c, 255);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t k = 0; k < rows[r].size(); ++k) {
      const int64_t y0 = gap + static_cast<int64_t>(r) * (h * scale + gap);
      const int64_t x0 = gap + static_cast<int64_t>(k) * (w * scale + gap);
      for (int64_t y = 0; y < h * scale; ++y) {
        for (int64_t x = 0; x < w * scale; ++x) {
          for (int64_t ch = 0; ch < c; ++ch) {
            const float v = rows[r][k][(ch * h + y / scale) * w + x / scale];
            png[((y0 + y) * width + x0 + x) * c + ch] = static_cast<unsigned char>(std::lround(255 * v));
          }
        }
      }
    }
  }
  if (!stbi_write_png(path.c_str(), static_cast<int>(width), static_cast<int>(height), static_cast<int>(c),
                      png.data(), static_cast<int>(width * c))) {
    return absl::InternalError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

// SSIM and PSNR summed over images (pixels in [0, 1], [C, H, W]).
struct Similarity {
  double ssim = 0, psnr = 0;
  int64_t images = 0;

  void Add(const std::vector<float>& truth, const std::vector<float>& image, const std::vector<int64_t>& shape) {
    ssim += Ssim(truth.data(), image.data(), shape[0], shape[1], shape[2], 1);
    psnr += Psnr(truth.data(), image.data(), static_cast<int64_t>(truth.size()), 1);
    ++images;
  }
  void Add(const Similarity& o) { ssim += o.ssim, psnr += o.psnr, images += o.images; }
  double mean_ssim() const { return ssim / static_cast<double>(std::max<int64_t>(images, 1)); }
  double mean_psnr() const { return psnr / static_cast<double>(std::max<int64_t>(images, 1)); }
  std::string Line(const char* method) const {
    return absl::StrFormat("%s SSIM %.3f PSNR %.1f dB", method, mean_ssim(), mean_psnr());
  }
};

// What an attack measured, for `cleave report` (RunRecord::attacks): RUN_DIR/attack/KIND.json.
void WriteSummary(const std::string& run_dir, const std::string& kind, int round, nlohmann::json summary,
                  std::ostream& err) {
  summary["round"] = round;  // 0: every round's records
  const fs::path dir = fs::path(run_dir) / "attack";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (Status s = WriteFileAtomic((dir / (kind + ".json")).string(), summary.dump(2) + "\n"); !s.ok()) {
    err << "cleave attack " << kind << ": " << s.message() << "\n";
  }
}

// The first `limit` examples of `data` as model inputs.
Activations FirstInputs(const Dataset& data, int64_t limit) {
  std::vector<int64_t> idx(std::min(data.size, limit));
  std::iota(idx.begin(), idx.end(), 0);
  return InputBatch(data, idx);
}

// What an attacker who learned nothing from the activations would guess: the mean of
// the auxiliary inputs `aux`, as pixels of images shaped `shape` (`space`'s
// normalisation undone).
std::vector<float> MeanImage(const Activations& aux, const std::vector<int64_t>& shape, const Dataset& space) {
  const int64_t elements = aux.batch() > 0 ? static_cast<int64_t>(aux.values.size()) / aux.batch() : 0;
  std::vector<float> mean(elements, 0);
  for (int64_t i = 0; i < aux.batch(); ++i) {
    for (int64_t p = 0; p < elements; ++p) mean[p] += aux.values[i * elements + p] / static_cast<float>(aux.batch());
  }
  return ImagePixels(mean, 0, shape, space);
}

int NoRecords(const std::string& what, const std::string& run_dir, std::ostream& err) {
  err << "cleave attack " << what << ": no records under " << (fs::path(run_dir) / "record").string()
      << " (run the job with split.record: N)\n";
  return 2;
}

// What the tokens, images and updates attacks start from: the run's job and the client
// part's view of it (the model, the job's activation noise and codec; the cut and the
// part come with each record), with LibTorch on one thread (small networks run fastest
// so, and OpenBLAS's idle pool would spin).
struct AttackRun {
  JobConfig job;
  ClientPartView view;
};
StatusOr<AttackRun> OpenRun(const std::string& run_dir) {
  AttackRun r;
  ASSIGN_OR_RETURN(r.job, LoadJob((fs::path(run_dir) / "config.yaml").string()));
  r.view.spec = ModelSpecOf(r.job.model, r.job.run.seed);
  r.view.noise = r.job.split.activation_noise;
  r.view.codec = r.job.compression.activations;
  SetTorchThreads(1);
  return r;
}

}  // namespace

int RunTokenAttack(const std::string& run_dir, const AttackOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const std::string& why) {
    err << "cleave attack tokens: " << why << "\n";
    return 2;
  };
  const std::vector<std::string> names = RecordNames(run_dir, o.round);
  if (names.empty()) return NoRecords("tokens", run_dir, err);
  StatusOr<AttackRun> run = OpenRun(run_dir);
  if (!run.ok()) return fail(std::string(run.status().message()));
  const JobConfig& job = run->job;
  ClientPartView& view = run->view;
  if (!ModelTraitsOf(view.spec.name).gpt2) {
    return fail(absl::StrCat("token recovery is for a decoder (model gpt); model ", view.spec.name,
                             view.spec.text() ? "" : " reads no tokens (cleave attack images)"));
  }
  const std::string aux_spec = o.aux.empty() ? job.data.test : o.aux;
  Activations aux_in;  // empty: no learned inversion
  if (!aux_spec.empty()) {
    StatusOr<Dataset> aux = LoadDataSpec(aux_spec, /*train=*/false);
    if (!aux.ok()) return fail(absl::StrCat("--aux ", aux_spec, ": ", aux.status().message()));
    aux_in = FirstInputs(*aux, o.aux_limit);
  }
  InversionOptions learned;
  learned.steps = o.steps;
  learned.batch = 16;    // sequences: 16 x T positions a step
  learned.hidden = 256;  // a classifier of one position's activation
  std::map<std::string, std::unique_ptr<LearnedTokenInverter>> inverters;  // by the part's values and cut
  TokenRecovery total_nearest, total_learned;
  for (const std::string& name : names) {
    StatusOr<SplitRecord> record = ReadRecord(fs::path(run_dir) / "record" / name);
    if (!record.ok()) return fail(absl::StrCat(name, ": ", record.status().message()));
    // The true labels: the device's copy where it kept one, else those that crossed.
    StatusOr<SplitRecord> truth = SentRecord(run_dir, name);
    for (size_t k = 0; k < record->batches.size(); ++k) {
      if (truth.ok() && k < truth->batches.size()) record->batches[k].labels = truth->batches[k].labels;
      if (record->batches[k].labels.empty()) {
        return fail(absl::StrCat(name, ": no label crossed (U-shaped) and no device kept a copy to score against"));
      }
    }
    if (record->cut == 1) {
      StatusOr<TokenRecovery> r = RecoverTokensAtTheEmbedding(*record);
      if (!r.ok()) return fail(absl::StrCat(name, ": ", r.status().message()));
      out << absl::StrFormat("%s: recovered %d of %d tokens (%.2f %%)\n", name, r->recovered, r->checked,
                             100 * r->rate());
      total_nearest.Add(*r);
    }
    if (aux_in.batch() == 0) continue;
    view.cut = record->cut;
    view.part = record->part;
    std::unique_ptr<LearnedTokenInverter>& inverter = inverters[absl::StrCat(view.cut, ":", view.part.Encode())];
    if (inverter == nullptr) {
      auto trained = LearnedTokenInverter::Train(view, aux_in, learned);
      if (!trained.ok()) return fail(absl::StrCat(name, ": ", trained.status().message()));
      inverter = *std::move(trained);
    }
    TokenRecovery by_learned;
    for (const RecordedBatch& b : record->batches) {
      StatusOr<std::vector<int64_t>> guessed = inverter->Invert({b.activations.shape, b.activations.values});
      if (!guessed.ok()) return fail(absl::StrCat(name, ": ", guessed.status().message()));
      by_learned.Add(ScoreTokens(*guessed, b.labels, b.activations.shape[1]));
    }
    out << absl::StrFormat("%s: the learned inverter recovered %d of %d tokens (%.2f %%)\n", name, by_learned.recovered,
                           by_learned.checked, 100 * by_learned.rate());
    total_learned.Add(by_learned);
  }
  if (total_nearest.checked > 0) {
    out << absl::StrFormat("total: recovered %d of %d tokens (%.2f %%)\n", total_nearest.recovered,
                           total_nearest.checked, 100 * total_nearest.rate());
  }
  if (total_learned.checked > 0) {
    out << absl::StrFormat("total: the learned inverter recovered %d of %d tokens (%.2f %%)\n",
                           total_learned.recovered, total_learned.checked, 100 * total_learned.rate());
  }
  nlohmann::json summary;
  if (total_nearest.checked > 0) summary["nearest_rate"] = total_nearest.rate();
  if (total_learned.checked > 0) summary["learned_rate"] = total_learned.rate();
  summary["tokens"] = std::max(total_nearest.checked, total_learned.checked);
  WriteSummary(run_dir, "tokens", o.round, std::move(summary), err);
  return 0;
}

namespace {

// The images attack's two inversions: a learned inverter, and optimisation from the
// auxiliary data's mean (o.optimise_steps; none at 0), both within its pixel range.
std::pair<InversionOptions, InversionOptions> ImageInversions(const AttackOptions& o, const Dataset& aux) {
  InversionOptions learned, optimised;
  learned.steps = o.steps;
  optimised.steps = o.optimise_steps;
  optimised.lr = 0.05;
  optimised.tv = o.tv;
  SetInputRange(aux, &learned);
  SetInputRange(aux, &optimised);
  return {learned, optimised};
}

// The images attack's totals, printed and written for cleave report.
void ReportImageTotals(const std::string& run_dir, int round, const Similarity& learned,
                       const Similarity& optimised, const Similarity& mean, std::ostream& out,
                       std::ostream& err) {
  out << "total: " << learned.images << " images; " << learned.Line("learned");
  if (optimised.images > 0) out << "; " << optimised.Line("optimised");
  out << "; " << mean.Line("the auxiliary mean image (knowing nothing)") << "\n";
  nlohmann::json summary = {{"images", learned.images},
                            {"learned_ssim", learned.mean_ssim()},
                            {"learned_psnr", learned.mean_psnr()},
                            {"mean_ssim", mean.mean_ssim()}};
  if (optimised.images > 0) {
    summary["optimised_ssim"] = optimised.mean_ssim();
    summary["optimised_psnr"] = optimised.mean_psnr();
  }
  WriteSummary(run_dir, "images", round, std::move(summary), err);
}

// A batch's `batch` true images against as many reconstructions, in whatever order: each
// scored against its most similar unused reconstruction. The first `grid_images` pairs
// go into the grid's two rows.
Similarity MatchImages(const std::vector<float>& truth, const std::vector<float>& reconstructed, int64_t batch,
                       const std::vector<int64_t>& shape, const Dataset& space, int grid_images,
                       std::vector<std::vector<std::vector<float>>>* grid) {
  Similarity by;
  std::vector<bool> used(batch, false);
  for (int64_t i = 0; i < batch; ++i) {
    const std::vector<float> tp = ImagePixels(truth, i, shape, space);
    int64_t best = -1;
    double best_ssim = -2;
    std::vector<float> best_px;
    for (int64_t j = 0; j < batch; ++j) {
      if (used[j]) continue;
      std::vector<float> rp = ImagePixels(reconstructed, j, shape, space);
      const double ssim = Ssim(tp.data(), rp.data(), shape[0], shape[1], shape[2], 1);
      if (ssim > best_ssim) best_ssim = ssim, best = j, best_px = std::move(rp);
    }
    used[best] = true;
    by.Add(tp, best_px, shape);
    if (static_cast<int>((*grid)[0].size()) < grid_images) {
      (*grid)[0].push_back(tp);
      (*grid)[1].push_back(std::move(best_px));
    }
  }
  return by;
}

// One record's batches inverted (by `inverter`, and by optimisation with o.optimise_steps)
// and, where the device's copy `truth` says what it sent, scored; the first
// o.grid_images images go into the grid's rows (the inputs, learned, optimised).
struct ImageScores {
  Similarity learned, optimised, mean;
};
StatusOr<ImageScores> ScoreImageRecord(const SplitRecord& record, const StatusOr<SplitRecord>& truth,
                                       LearnedInverter& inverter, const ClientPartView& view,
                                       const InversionOptions& optimised, const AttackOptions& o, const Dataset& aux,
                                       const std::vector<float>& mean_pixels,
                                       std::vector<std::vector<std::vector<float>>>* grid) {
  const std::vector<int64_t>& shape = view.spec.input_shape;
  ImageScores by;
  for (size_t k = 0; k < record.batches.size(); ++k) {
    const Tensor& act = record.batches[k].activations;
    const Activations a{act.shape, act.values};
    ASSIGN_OR_RETURN(const Activations l, inverter.Invert(a));
    Activations opt;
    if (o.optimise_steps > 0) {
      ASSIGN_OR_RETURN(opt, InvertByOptimisation(view, a, optimised));
    }
    const bool known = truth.ok() && k < truth->batches.size() && truth->batches[k].activations.shape == l.shape;
    for (int64_t i = 0; i < a.batch(); ++i) {
      const std::vector<float> lp = ImagePixels(l.values, i, shape, aux);
      std::vector<float> op, tp;
      if (o.optimise_steps > 0) op = ImagePixels(opt.values, i, shape, aux);
      if (known) tp = ImagePixels(truth->batches[k].activations.values, i, shape, aux);
      if (!o.grid.empty() && static_cast<int>((*grid)[1].size()) < o.grid_images) {
        if (known) (*grid)[0].push_back(tp);
        (*grid)[1].push_back(lp);
        if (!op.empty()) (*grid)[2].push_back(op);
      }
      if (!known) continue;
      by.mean.Add(tp, mean_pixels, shape);
      by.learned.Add(tp, lp, shape);
      if (!op.empty()) by.optimised.Add(tp, op, shape);
    }
  }
  return by;
}

}  // namespace

int RunImageAttack(const std::string& run_dir, const AttackOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const std::string& why) {
    err << "cleave attack images: " << why << "\n";
    return 2;
  };
  const std::vector<std::string> names = RecordNames(run_dir, o.round);
  if (names.empty()) return NoRecords("images", run_dir, err);
  StatusOr<AttackRun> run = OpenRun(run_dir);
  if (!run.ok()) return fail(std::string(run.status().message()));
  const JobConfig& job = run->job;
  ClientPartView& view = run->view;
  if (view.spec.text() || view.spec.input_shape.size() != 3) {
    return fail(absl::StrCat("input reconstruction is for image models; model ", view.spec.name,
                             view.spec.text() ? " reads tokens (cleave attack tokens)" : " reads no images"));
  }
  const std::string aux_spec = o.aux.empty() ? job.data.test : o.aux;
  if (aux_spec.empty()) return fail("no auxiliary images: the job has no data.test; give --aux");
  StatusOr<Dataset> aux = LoadDataSpec(aux_spec, /*train=*/false);
  if (!aux.ok()) return fail(absl::StrCat("--aux ", aux_spec, ": ", aux.status().message()));
  if (aux->shape != view.spec.input_shape) return fail(absl::StrCat("the auxiliary images ", aux_spec, " are not the model's input"));
  const Activations aux_in = FirstInputs(*aux, o.aux_limit);
  const std::vector<float> mean_pixels = MeanImage(aux_in, view.spec.input_shape, *aux);
  const auto [learned, optimised] = ImageInversions(o, *aux);
  const std::vector<int64_t>& shape = view.spec.input_shape;
  std::map<std::string, std::unique_ptr<LearnedInverter>> inverters;  // by the part's values and cut
  Similarity total_learned, total_optimised, total_mean;
  bool scored = false;
  std::vector<std::vector<std::vector<float>>> grid(3);
  for (const std::string& name : names) {
    StatusOr<SplitRecord> record = ReadRecord(fs::path(run_dir) / "record" / name);
    if (!record.ok()) return fail(absl::StrCat(name, ": ", record.status().message()));
    if (record->cut < 1) return fail(absl::StrCat(name, ": the record does not say where the model was cut"));
    view.cut = record->cut;
    view.part = record->part;
    std::unique_ptr<LearnedInverter>& inverter = inverters[absl::StrCat(view.cut, ":", view.part.Encode())];
    if (inverter == nullptr) {
      auto trained = LearnedInverter::Train(view, aux_in, learned);
      if (!trained.ok()) return fail(absl::StrCat(name, ": ", trained.status().message()));
      inverter = *std::move(trained);
    }
    StatusOr<ImageScores> scores =
        ScoreImageRecord(*record, SentRecord(run_dir, name), *inverter, view, optimised, o, *aux, mean_pixels, &grid);
    if (!scores.ok()) return fail(absl::StrCat(name, ": ", scores.status().message()));
    const auto& [by_learned, by_optimised, by_mean] = *scores;
    if (by_learned.images == 0) {
      out << name << ": reconstructed (no copy of what the device sent to score against)\n";
      continue;
    }
    scored = true;
    out << name << ": " << by_learned.images << " images; " << by_learned.Line("learned");
    if (by_optimised.images > 0) out << "; " << by_optimised.Line("optimised");
    out << "\n";
    total_learned.Add(by_learned);
    total_mean.Add(by_mean);
    total_optimised.Add(by_optimised);
  }
  if (scored) ReportImageTotals(run_dir, o.round, total_learned, total_optimised, total_mean, out, err);
  if (!o.grid.empty()) {
    const std::string kinds = absl::StrCat(grid[0].empty() ? "" : "the devices' inputs, ", "learned",
                                           grid[2].empty() ? "" : ", optimised");
    std::vector<std::vector<std::vector<float>>> rows;
    for (auto& r : grid) {
      if (!r.empty()) rows.push_back(std::move(r));
    }
    if (Status s = WriteGrid(o.grid, rows, shape); !s.ok()) return fail(std::string(s.message()));
    out << "grid: " << o.grid << " (rows: " << kinds << ")\n";
  }
  return 0;
}

int RunUpdateAttack(const std::string& run_dir, const AttackOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const std::string& why) {
    err << "cleave attack updates: " << why << "\n";
    return 2;
  };
  StatusOr<AttackRun> run = OpenRun(run_dir);
  if (!run.ok()) return fail(std::string(run.status().message()));
  const JobConfig& job = run->job;
  std::vector<std::pair<std::string, SplitRecord>> updates;  // the records of updates, by name
  for (const std::string& name : RecordNames(run_dir, o.round)) {
    StatusOr<SplitRecord> r = ReadRecord(fs::path(run_dir) / "record" / name);
    if (r.ok() && r->update.size() > 0) updates.emplace_back(name, *std::move(r));
  }
  if (updates.empty()) {
    return fail(absl::StrCat("no recorded updates under ", (fs::path(run_dir) / "record").string(),
                             job.secure_aggregation.enabled
                                 ? " (under secure aggregation the server never holds a single client's update)"
                                 : " (run the job with server.record_updates: N)"));
  }
  const TrainConfig& fit = job.train;
  if (fit.local_steps != 1 || fit.optimizer != "sgd") {  // momentum does not change a first step
    out << "note: the updates are not one SGD step (train.local_steps 1, optimizer sgd): each is attacked as one "
           "gradient\n";
  }
  const ModelSpec& spec = run->view.spec;
  StatusOr<Dataset> space = LoadDataSpec(job.data.test, /*train=*/false);  // for the images' normalisation
  if (!space.ok()) return fail(absl::StrCat("data.test: ", space.status().message()));
  InversionOptions io;
  io.steps = o.steps;
  io.lr = 0.1;
  io.tv = 0.02;
  SetInputRange(*space, &io);
  const std::vector<int64_t>& shape = spec.input_shape;
  Similarity total;
  int64_t labels_right = 0, labels_n = 0;
  std::vector<std::vector<std::vector<float>>> grid(2);
  for (const auto& [name, record] : updates) {
    StatusOr<SplitRecord> truth = SentRecord(run_dir, name);
    const int64_t batch = truth.ok() && !truth->batches.empty() ? truth->batches[0].activations.shape[0]
                                                                 : static_cast<int64_t>(fit.batch_size);
    StatusOr<UpdateInversion> inv = InvertUpdate(spec, record.part, record.update, fit.lr, batch, io);
    if (!inv.ok()) return fail(absl::StrCat(name, ": ", inv.status().message()));
    if (!truth.ok() || truth->batches.empty()) {
      out << name << ": reconstructed (no copy of the device's batch to score against)\n";
      continue;
    }
    const RecordedBatch& t = truth->batches[0];
    // Labels as multisets; images each against its best unused reconstruction.
    std::vector<int64_t> want = t.labels, got = inv->labels;
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    std::vector<int64_t> common;
    std::set_intersection(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(common));
    labels_right += static_cast<int64_t>(common.size());
    labels_n += static_cast<int64_t>(want.size());
    const Similarity by = MatchImages(t.activations.values, inv->inputs.values, batch, shape, *space,
                                      o.grid.empty() ? 0 : o.grid_images, &grid);
    out << absl::StrFormat("%s: %d of %d labels right; %d images; %s\n", name, common.size(), want.size(), by.images,
                           by.Line("reconstructed"));
    total.Add(by);
  }
  if (total.images > 0) {
    out << absl::StrFormat("total: %d of %d labels right; %d images; %s\n", labels_right, labels_n, total.images,
                           total.Line("reconstructed"));
    WriteSummary(run_dir, "updates", o.round,
                 {{"images", total.images},
                  {"ssim", total.mean_ssim()},
                  {"psnr", total.mean_psnr()},
                  {"labels_right", static_cast<double>(labels_right) / static_cast<double>(labels_n)}},
                 err);
  }
  if (!o.grid.empty() && !grid[0].empty()) {
    if (Status s = WriteGrid(o.grid, grid, shape); !s.ok()) return fail(std::string(s.message()));
    out << "grid: " << o.grid << " (rows: the devices' first batches, reconstructed)\n";
  }
  return 0;
}

int RunLabelAttack(const std::string& run_dir, int round, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const std::string& why) {
    err << "cleave attack labels: " << why << "\n";
    return 2;
  };
  const std::vector<std::string> names = RecordNames(run_dir, round);
  if (names.empty()) return NoRecords("labels", run_dir, err);
  double norm_auc = 0, direction_auc = 0, accuracy = 0;
  int64_t examples = 0, norm_examples = 0, total_crossed_true = 0, total_crossed = 0;
  for (const std::string& name : names) {
    StatusOr<SplitRecord> record = ReadRecord(fs::path(run_dir) / "record" / name);
    if (!record.ok()) return fail(absl::StrCat(name, ": ", record.status().message()));
    // Scored against the device's copy (the truth, whatever label DP sent) where it kept
    // one, else against the labels that crossed.
    const bool crossed = !record->batches.empty() && !record->batches[0].labels.empty();
    StatusOr<SplitRecord> truth = SentRecord(run_dir, name);
    if (!crossed && !truth.ok()) {
      return fail(absl::StrCat(name, ": no label crossed (U-shaped) and no device kept a copy of its labels to score "
                               "against (cleave local keeps them with split.record)"));
    }
    std::vector<std::vector<float>> rows;
    std::vector<int64_t> labels;
    int64_t crossed_true = 0, crossed_n = 0;  // labels that crossed, and of them the true ones
    for (size_t k = 0; k < record->batches.size(); ++k) {
      const RecordedBatch& b = record->batches[k];
      const std::vector<int64_t>* y = !truth.ok() ? &b.labels
                                      : k < truth->batches.size() ? &truth->batches[k].labels : nullptr;
      if (y == nullptr || y->empty() || b.gradient.values.size() % y->size() != 0 ||
          (crossed && b.labels.size() != y->size())) {
        return fail(absl::StrCat(name, ": micro-batch ", k, "'s gradient does not pair up with its labels"));
      }
      const size_t per = b.gradient.values.size() / y->size();
      for (size_t i = 0; i < y->size(); ++i) {
        if ((*y)[i] == kNoTarget) continue;
        rows.emplace_back(b.gradient.values.begin() + i * per, b.gradient.values.begin() + (i + 1) * per);
        labels.push_back((*y)[i]);
        if (crossed) crossed_true += b.labels[i] == (*y)[i], ++crossed_n;
      }
    }
    StatusOr<LabelLeakage> r = InferLabelsFromGradients(rows, labels);
    if (!r.ok()) return fail(absl::StrCat(name, ": ", r.status().message()));
    out << absl::StrFormat("%s: %d examples of %d classes (against %s): direction AUC %.3f, accuracy %.1f %%", name,
                           r->examples, r->classes, truth.ok() ? "the device's copy" : "the labels that crossed",
                           r->direction_auc, 100 * r->direction_accuracy);
    if (r->norm_auc >= 0) out << absl::StrFormat(", norm AUC %.3f (class %d positive)", r->norm_auc, r->norm_positive);
    if (crossed && truth.ok()) {
      out << absl::StrFormat("; the labels that crossed: %.1f %% true", 100.0 * crossed_true / crossed_n);
      total_crossed_true += crossed_true, total_crossed += crossed_n;
    }
    out << "\n";
    direction_auc += r->direction_auc * r->examples;
    accuracy += r->direction_accuracy * r->examples;
    examples += r->examples;
    if (r->norm_auc >= 0) norm_auc += r->norm_auc * r->examples, norm_examples += r->examples;
  }
  out << absl::StrFormat("total: %d examples: direction AUC %.3f, accuracy %.1f %%", examples, direction_auc / examples,
                         100 * accuracy / examples);
  if (norm_examples > 0) out << absl::StrFormat(", norm AUC %.3f", norm_auc / norm_examples);
  if (total_crossed > 0) out << absl::StrFormat("; the labels that crossed: %.1f %% true", 100.0 * total_crossed_true / total_crossed);
  out << "\n";
  nlohmann::json summary = {{"examples", examples},
                            {"direction_auc", direction_auc / examples},
                            {"direction_accuracy", accuracy / examples}};
  if (norm_examples > 0) summary["norm_auc"] = norm_auc / norm_examples;
  if (total_crossed > 0) summary["crossed_true"] = static_cast<double>(total_crossed_true) / total_crossed;
  WriteSummary(run_dir, "labels", round, std::move(summary), err);
  return 0;
}

int RunHijackScore(const std::string& run_dir, const AttackOptions& o, std::ostream& out, std::ostream& err) {
  const auto fail = [&](const std::string& why) {
    err << "cleave attack hijack: " << why << "\n";
    return 2;
  };
  const std::vector<std::string> names = RecordNames(run_dir, o.round);
  if (names.empty()) return NoRecords("hijack", run_dir, err);
  StatusOr<AttackRun> run = OpenRun(run_dir);
  if (!run.ok()) return fail(std::string(run.status().message()));
  if (run->job.split.hijack.empty()) return fail("the run's server did not hijack (split.hijack)");
  StatusOr<Dataset> aux = LoadDataSpec(run->job.data.test, /*train=*/false);  // the normalisation, the mean image
  if (!aux.ok()) return fail(absl::StrCat("data.test: ", aux.status().message()));
  const std::vector<int64_t>& shape = run->view.spec.input_shape;
  const std::vector<float> mean_pixels = MeanImage(FirstInputs(*aux, o.aux_limit), shape, *aux);
  std::map<int, std::pair<Similarity, Similarity>> by_round;  // the hijack's, the mean image's
  std::vector<std::vector<std::vector<float>>> grid(2);
  int grid_round = 0;
  for (const std::string& name : names) {
    int round = 0;
    if (!absl::SimpleAtoi(name.substr(6, name.find('/') - 6), &round)) continue;  // round-R/CLIENT.pb
    StatusOr<SplitRecord> record = ReadRecord(fs::path(run_dir) / "record" / name);
    if (!record.ok()) return fail(absl::StrCat(name, ": ", record.status().message()));
    StatusOr<SplitRecord> truth = SentRecord(run_dir, name);
    if (!truth.ok()) continue;
    if (round > grid_round) grid_round = round, grid = {{}, {}};
    for (size_t k = 0; k < record->batches.size() && k < truth->batches.size(); ++k) {
      const Tensor& rec = record->batches[k].reconstruction;
      const Tensor& sent = truth->batches[k].activations;
      if (rec.shape.empty() || rec.shape != sent.shape) continue;
      for (int64_t i = 0; i < rec.shape[0]; ++i) {
        const std::vector<float> tp = ImagePixels(sent.values, i, shape, *aux), rp = ImagePixels(rec.values, i, shape, *aux);
        by_round[round].first.Add(tp, rp, shape);
        by_round[round].second.Add(tp, mean_pixels, shape);
        if (round == grid_round && static_cast<int>(grid[0].size()) < o.grid_images) {
          grid[0].push_back(tp);
          grid[1].push_back(rp);
        }
      }
    }
  }
  if (by_round.empty()) return fail("no record holds the hijack's reconstructions with a device's copy to score them against");
  Similarity total, total_mean;
  nlohmann::json rounds = nlohmann::json::object();
  for (const auto& [round, s] : by_round) {
    out << "round " << round << ": " << s.first.images << " images; " << s.first.Line("hijack") << "; "
        << s.second.Line("the mean image") << "\n";
    rounds[std::to_string(round)] = s.first.mean_ssim();
    total.Add(s.first);
    total_mean.Add(s.second);
  }
  out << "total: " << total.images << " images; " << total.Line("hijack") << "; " << total_mean.Line("the mean image") << "\n";
  WriteSummary(run_dir, "hijack", o.round,
               {{"images", total.images}, {"hijack_ssim", total.mean_ssim()}, {"hijack_psnr", total.mean_psnr()},
                {"mean_ssim", total_mean.mean_ssim()}, {"ssim_by_round", rounds}},
               err);
  if (!o.grid.empty()) {
    if (Status s = WriteGrid(o.grid, grid, shape); !s.ok()) return fail(std::string(s.message()));
    out << "grid: " << o.grid << " (round " << grid_round << "; rows: the devices' inputs, the hijack's)\n";
  }
  return 0;
}

}  // namespace cleave
