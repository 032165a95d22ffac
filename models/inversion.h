// Input reconstruction from the activations at a cut: the attacks an honest-but-curious
// server runs on what it recorded of split learning (split.record, split/record.h) to
// measure what a cut and a defense leak (docs/security.md, "Measured leakage"). Both
// know the client part the server sent (its values travel in the record); neither needs
// anything an honest server does not receive.
//
// Inputs and reconstructions are model inputs (normalised, ModelPart's InputBatch).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/part.h"

namespace cleave {

// What the attacker knows of the client part and of what the device adds before
// sending: it mimics both on auxiliary inputs (an adaptive attacker).
struct ClientPartView {
  ModelSpec spec;        // the model (images: mlp, lenet5, cnn, vgg, resnet)
  int cut = 0;           // the client part is stages [0, cut)
  ParameterSet part;     // its values, as the server sent them
  double noise = 0;      // split.activation_noise: N(0, noise^2) added to every activation
  std::string codec;     // split.activation_codec ("" or "none": float32)
};

struct InversionOptions;
// Sets o->lo and o->hi to the range of `space`'s normalised inputs: pixels 0 and 1
// through each channel's mean and stddev, the widest over channels.
void SetInputRange(const Dataset& space, InversionOptions* o);

struct InversionOptions {
  int steps = 1500;   // optimiser steps
  int batch = 64;     // learned: auxiliary inputs per step
  double lr = 1e-3;   // Adam's
  int hidden = 1024;  // learned: the decoder's hidden width
  double tv = 0;      // optimisation: the weight of the total variation prior (UnSplit's)
  uint64_t seed = 1;
  // Each input value's range (normalised): reconstructions are clamped to it.
  float lo = -1e30f, hi = 1e30f;
};

// He et al. 2019 ("Model inversion attacks against collaborative inference"), the
// learned inverse network: a decoder (two hidden layers, ReLU) trained on auxiliary
// inputs of the same domain to map the client part's activations back to its inputs,
// minimising the squared error. Trained on the part's activations of `aux` as the
// device would have sent them (noise and codec applied).
class LearnedInverter {
 public:
  static StatusOr<std::unique_ptr<LearnedInverter>> Train(const ClientPartView& view, const Activations& aux,
                                                          const InversionOptions& options);
  ~LearnedInverter();
  // The inputs that produced `activations` ([B, <the cut's activation shape>]).
  StatusOr<Activations> Invert(const Activations& activations) const;

 private:
  struct Impl;
  explicit LearnedInverter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The learned inversion for a decoder's tokens (model gpt or hf): a classifier (two
// hidden layers, ReLU) trained on auxiliary token sequences to tell, from the client
// part's activation at a position ([dim]), the token at that position, minimising the
// cross-entropy. At the embedding cut it learns the embedding's inverse; deeper, what
// the blocks keep of each position's own token.
class LearnedTokenInverter {
 public:
  // `aux`: sequences of token ids as the model reads them ([N, T], as floats).
  static StatusOr<std::unique_ptr<LearnedTokenInverter>> Train(const ClientPartView& view, const Activations& aux,
                                                               const InversionOptions& options);
  ~LearnedTokenInverter();
  // Each position's most likely token, [B * T] in order, from activations [B, T, dim].
  StatusOr<std::vector<int64_t>> Invert(const Activations& activations) const;

 private:
  struct Impl;
  explicit LearnedTokenInverter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// White-box optimisation against the client part (UnSplit, Erdogan et al. 2022, with
// the part known: the server sent it): inputs x, from the middle of their range,
// minimising ||f(x) - a||^2 / |a| + tv * TV(x) with Adam, clamped to [lo, hi] after each
// step. Best at shallow cuts.
StatusOr<Activations> InvertByOptimisation(const ClientPartView& view, const Activations& activations,
                                           const InversionOptions& options);

// Gradient inversion of a federated update (DLG, Zhu et al. 2019; the labels as iDLG
// reads them, Zhao et al. 2020; cosine gradient matching with a total variation prior,
// Geiping et al. 2020). From the model a client started from and its update after one
// SGD step of learning rate `lr` on a batch of `batch` examples (update = -lr x the
// batch's mean gradient): the labels are the classes whose output bias gradient is
// negative, the most negative first; the inputs are optimised from noise until the
// gradient they give points as the update does. Several local steps make the update a
// sum of gradients at moving weights: the attack then treats it as one. Image models
// without batch normalization (the model runs in float64 here).
struct UpdateInversion {
  Activations inputs;           // [batch, <input shape>]
  std::vector<int64_t> labels;  // the labels read off the update
};
StatusOr<UpdateInversion> InvertUpdate(const ModelSpec& spec, const ParameterSet& model, const ParameterSet& update,
                                       double lr, int64_t batch, const InversionOptions& options);

// Feature-space hijacking (Pasquini et al. 2021, "Unleashing the tiger: inference
// attacks on split learning"): a malicious server's attack, here to measure what a
// device's guard stops (split.hijack; privacy/split_guard.h). The server ignores the
// labels. On auxiliary inputs of the domain it trains a pilot encoder f~ (the client
// part's architecture, its own weights) with a decoder that inverts it, and a
// discriminator D between f~'s features and the device's; the gradient it sends back is
// the non-saturating GAN loss's, -log sigmoid(D(z)), which moves the client part's
// features into f~'s space, where the decoder inverts them. Adam for all three; each
// step draws as many auxiliary inputs as the device's micro-batch has.
// Thread-safe.
struct HijackOptions {
  double lr = 1e-4;      // the pilot's and the decoder's
  double lr_d = 1e-4;    // the discriminator's
  int hidden = 1024;     // the decoder's hidden width (the discriminator's: a quarter)
  uint64_t seed = 1;
  float lo = -1e30f, hi = 1e30f;  // the input range (SetInputRange): reconstructions are clamped to it
};
class FeatureSpaceHijack {
 public:
  // The client part is stages [0, cut) of `spec` (an image or table model); `aux`: the
  // server's auxiliary inputs [N, <input shape>].
  static StatusOr<std::unique_ptr<FeatureSpaceHijack>> Create(const ModelSpec& spec, int cut, const Activations& aux,
                                                              const HijackOptions& options);
  ~FeatureSpaceHijack();
  int cut() const;
  struct Step {
    Activations grad;  // of the attack's loss with respect to `activations`, for the device
    double loss = 0;   // the device's GAN loss (low: its features pass for the pilot's)
  };
  // One step on a device's micro-batch of activations at the cut.
  StatusOr<Step> Train(const Activations& activations);
  // The decoder's inputs for `activations`.
  StatusOr<Activations> Reconstruct(const Activations& activations) const;

 private:
  struct Impl;
  explicit FeatureSpaceHijack(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client part's activations of `inputs`, as the device sends them (noise from
// `seed`, codec applied).
StatusOr<Activations> ClientActivations(const ClientPartView& view, const Activations& inputs, uint64_t seed);

}  // namespace cleave
