// The server's own measure of what a cut leaks, for the privacy floor of the automatic
// cut (split.max_reconstruction_ssim, split.max_token_recovery): the attacks of
// models/inversion.h and split/attacks.h run on auxiliary data the server holds (its
// test set), through the client part the devices would be sent, scored on examples the
// attacker did not train on.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "data/dataset.h"
#include "models/inversion.h"

namespace cleave {

struct LeakageOptions {
  int64_t train_images = 2000;  // the learned inverter's auxiliary images: the first N of the set
  int64_t probe_images = 32;    // the next N: the "device's" images it is scored on
  int steps = 400;              // the learned inverter's training steps
  int hidden = 512;             // its hidden width
  int optimise_steps = 100;     // the white-box optimisation's steps
};

// The larger of the two attacks' mean SSIM at `view.cut` (noise and codec as the view
// says). INVALID_ARGUMENT when `aux` has too few images or is not the model's input.
StatusOr<double> MeasureReconstructionSsim(const ClientPartView& view, const Dataset& aux,
                                           const LeakageOptions& options = {});

// Its text counterpart (split.max_token_recovery), for a decoder: the share of the
// probe sequences' tokens the learned token inverter recovers at `view.cut` (trained on
// the sequences before them; hidden 256), or at the embedding cut the nearest
// embedding, whichever recovers more. `aux`: token sequences (a text data set).
StatusOr<double> MeasureTokenRecovery(const ClientPartView& view, const Dataset& aux,
                                      const LeakageOptions& options = {});

}  // namespace cleave
