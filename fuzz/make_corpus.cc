// Writes the fuzz targets' seed corpus from real messages: make_corpus SOURCE_DIR OUT_DIR
// makes OUT_DIR/<target>/ for each target (fuzz/CMakeLists.txt). The SecAgg seeds come
// from driving a real SecAggRound, so they reach every stage.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>

#include "cleave/v1/cleave.pb.h"
#include "compression/codec.h"
#include "core/files.h"
#include "fuzz/fuzz_inputs.h"
#include "models/safetensors.h"
#include "server/checkpoint.h"
#include "server/secagg_round.h"

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
  std::cout << "make_corpus: " << written << " seeds in " << out_dir.string() << "\n";
  return 0;
}
