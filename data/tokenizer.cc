#include "data/tokenizer.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/spm_bridge.h"

namespace cleave {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  int vocab_size() const override { return 256; }
  StatusOr<std::vector<std::vector<int32_t>>> Encode(
      const std::vector<std::string>& texts) const override {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& text : texts) {
      std::vector<int32_t>& ids = out.emplace_back(text.size());
      for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    }
    return out;
  }
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
    }
    return out;
  }
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(SpmProcessor p) : p_(std::move(p)) {}
  int vocab_size() const override { return p_.vocab_size(); }
  StatusOr<std::vector<std::vector<int32_t>>> Encode(
      const std::vector<std::string>& texts) const override {
    return p_.Encode(texts);
  }
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::vector<int32_t> in;
    for (int32_t id : ids) {
      if (id >= 0 && id < vocab_size()) in.push_back(id);
    }
    return p_.Decode(in);
  }
  int eos_id() const override { return p_.eos_id(); }

 private:
  SpmProcessor p_;
};

class Gpt2Tokenizer : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(std::unique_ptr<Gpt2Bpe> bpe) : bpe_(std::move(bpe)) {}
  int vocab_size() const override { return bpe_->vocab_size(); }
  StatusOr<std::vector<std::vector<int32_t>>> Encode(
      const std::vector<std::string>& texts) const override {
    std::vector<std::vector<int32_t>> out;
    for (const std::string& t : texts) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, bpe_->Encode(t));
      out.push_back(std::move(ids));
    }
    return out;
  }
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return bpe_->Decode(ids);
  }
  int eos_id() const override { return bpe_->eos_id(); }

 private:
  std::unique_ptr<Gpt2Bpe> bpe_;
};

}  // namespace

StatusOr<std::vector<int32_t>> Tokenizer::EncodeText(const std::string& text, bool) const {
  ASSIGN_OR_RETURN(auto ids, Encode({text}));
  return std::move(ids.at(0));
}

std::vector<int32_t> Tokenizer::DocumentSeparator() const {
  if (eos_id() >= 0) return {eos_id()};
  auto ids = Encode({"\n\n"});
  return ids.ok() ? (*ids)[0] : std::vector<int32_t>{};
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(const std::string& spec) {
  if (spec == "byte") return std::unique_ptr<Tokenizer>(new ByteTokenizer());
  if (spec.rfind("spm:", 0) == 0 && spec.size() > 4) {
    const std::string path = spec.substr(4);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat("tokenizer ", spec, ": no such file ", path));
    }
    ASSIGN_OR_RETURN(SpmProcessor p, SpmProcessor::Load(path));
    return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(std::move(p)));
  }
  if (spec.rfind("hf:", 0) == 0 && spec.size() > 3) {
    ASSIGN_OR_RETURN(auto hf, HfTokenizer::Load(spec.substr(3)));
    return std::unique_ptr<Tokenizer>(std::move(hf));
  }
  if (spec.rfind("gpt2:", 0) == 0 && spec.size() > 5) {
    ASSIGN_OR_RETURN(auto bpe, Gpt2Bpe::Load(spec.substr(5)));
    return std::unique_ptr<Tokenizer>(new Gpt2Tokenizer(std::move(bpe)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tokenizer '", spec, "' (byte, spm:MODEL_FILE, gpt2:DIR with vocab.json and merges.txt, or hf:PATH: a Hugging Face tokenizer.json or its folder)"));
}

Status TrainSentencePieceModel(const std::vector<std::string>& files, int vocab_size,
                               const std::string& model_type, const std::string& prefix) {
  if (files.empty()) return absl::InvalidArgumentError("no text files to train a tokenizer on");
  if (vocab_size < 8 || vocab_size > 1 << 20) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary size ", vocab_size,
                                                   " is not in [8, 1048576]"));
  }
  for (const std::string& f : files) {
    // SentencePiece splits its flags on spaces and its inputs on commas.
    if (f.find_first_of(" ,") != std::string::npos) {
      return absl::InvalidArgumentError("tokenizer input paths cannot hold spaces or commas: " + f);
    }
  }
  // byte_fallback: text outside the learnt pieces still encodes (as bytes), never as
  // <unk>; no normalisation and every space kept: decoding gives back the text exactly.
  Status s = TrainSpm({"--input=" + absl::StrJoin(files, ","), "--model_prefix=" + prefix,
                       absl::StrCat("--vocab_size=", vocab_size), "--model_type=" + model_type,
                       "--character_coverage=1.0", "--byte_fallback=true",
                       "--normalization_rule_name=identity", "--remove_extra_whitespaces=false",
                       "--split_by_whitespace=true", "--minloglevel=2", "--num_threads=1"});
  if (!s.ok()) {
    return Status(s.code(), absl::StrCat("training the SentencePiece model failed: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace cleave
