// The server's own measure of what a cut leaks, for the privacy floor of the automatic
// cut (split.max_reconstruction_ssim): the reconstruction attacks of models/inversion.h
// run on auxiliary images the server holds (its test set), through the client part the
// devices would be sent, scored with SSIM on images the attacker did not train on.
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

}  // namespace cleave
