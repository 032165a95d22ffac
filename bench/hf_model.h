// The benchmarks' Hugging Face model: a folder's config.json and weights, built into a
// Model whose context is `context` tokens (at most the folder's).
#pragma once

#include <memory>
#include <string>

#include "models/hf_folder.h"
#include "models/model.h"

namespace cleave {

inline StatusOr<std::unique_ptr<Model>> LoadHfModel(const std::string& dir, int64_t context, ModelSpec* spec) {
  spec->gpt.context = context;
  ASSIGN_OR_RETURN(std::string config, ReadHfConfig(dir));
  RETURN_IF_ERROR(SetHfModel(*spec, std::move(config), dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(*spec));
  ASSIGN_OR_RETURN(ParameterSet weights, LoadHfWeights(dir, model->Parameters(), spec->gpt.layers));
  RETURN_IF_ERROR(model->SetParameters(weights));
  return model;
}

}  // namespace cleave
