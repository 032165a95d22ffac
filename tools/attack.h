// `cleave attack`: the attacks an honest-but-curious server runs on what it recorded of a
// run (split.record, split/record.h), as an operator measures a cut's and a defense's
// leakage (docs/security.md, "Measured leakage"). Each scores its guesses against the
// devices' own copies of what they sent (cleave-client --keep-sent, which `cleave local`
// turns on with split.record: RUN_DIR/clients/NAME/sent/round-R/CLIENT.pb) where they
// are there.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace cleave {

struct AttackOptions {
  std::string aux;          // auxiliary data of the same domain (a data spec); "": the job's data.test
  int64_t aux_limit = 5000; // of them, the first N
  int steps = 1500;         // a learned inverter's training steps
  int optimise_steps = 400; // images: the white-box optimisation's (0: not run)
  double tv = 0.05;         // its total variation weight
  std::string grid;         // images: a PNG of the first record's first images: truth, learned, optimised
  int grid_images = 8;
  int round = 0;            // > 0: that round's records only
};

// `cleave attack tokens RUN_DIR`: a decoder's tokens (model gpt) from the activations
// recorded at its cut, one line per task and a total ("recovered R of N tokens (P %)"):
// at the embedding cut by the nearest token embedding (RecoverTokensAtTheEmbedding), and
// at every cut by a learned token inverter trained on the auxiliary sequences
// (LearnedTokenInverter; "the learned inverter recovered ..."). Scored against the
// devices' copies, else the labels that crossed. 0 when some record was attacked; 2
// with the reason when none could be.
int RunTokenAttack(const std::string& run_dir, const AttackOptions& options, std::ostream& out, std::ostream& err);

// `cleave attack images RUN_DIR`: input reconstruction from the activations recorded at
// an image model's cut, by a learned inverter trained on the auxiliary images (He et al.
// 2019) and by white-box optimisation against the recorded client part (UnSplit), both
// mimicking the job's activation noise and codec. One line per task and a total: SSIM
// and PSNR against the devices' inputs ("learned SSIM S PSNR P dB"; without the
// devices' copies, reconstructions only). 0 when some record was attacked; 2 with the
// reason when none could be.
int RunImageAttack(const std::string& run_dir, const AttackOptions& options, std::ostream& out,
                   std::ostream& err);

// `cleave attack labels RUN_DIR`: label inference from the recorded gradients at the cut
// (InferLabelsFromGradients, Li et al. 2022): sl and sfl's gradients the server sent
// back, scored against the labels that crossed; U-shaped's gradients the server
// received, scored against the devices' copies. One line per task and a total (means
// weighted by examples). `round` > 0: that round's records only.
// `cleave attack updates RUN_DIR`: gradient inversion of the federated updates the server
// recorded (server.record_updates; InvertUpdate: DLG with iDLG's labels), one line per
// update and a total: the labels read off it and the SSIM of each of the device's first
// batch's images to its best-matching reconstruction. Meaningful for updates of one SGD
// step (train.local_steps: 1, optimizer sgd), as the papers'; other updates are attacked
// as one gradient, and said so. `grid` and `steps` as for images (default 2000).
int RunUpdateAttack(const std::string& run_dir, const AttackOptions& options, std::ostream& out, std::ostream& err);

int RunLabelAttack(const std::string& run_dir, int round, std::ostream& out, std::ostream& err);

// `cleave attack hijack RUN_DIR`: what a malicious server's feature-space hijacking
// (split.hijack: fsha) read of the devices' inputs: the reconstructions it recorded with
// each micro-batch, scored against the devices' copies. One line per round and a total
// (SSIM, PSNR, and the auxiliary mean image's SSIM for scale); `grid`: the first images,
// the devices' over the hijack's, of the last round recorded. 0 when some record was
// scored; 2 with the reason when none could be.
int RunHijackScore(const std::string& run_dir, const AttackOptions& options, std::ostream& out, std::ostream& err);

}  // namespace cleave
