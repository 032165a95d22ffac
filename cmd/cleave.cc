// cleave: the operator's tool.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <functional>
#include <memory>
#include <tuple>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "core/cli.h"
#include "core/device_trace.h"
#include "core/files.h"
#include "core/logging.h"
#include "privacy/accountant.h"
#include "privacy/certs.h"
#include "privacy/tls.h"
#include "tools/attack.h"
#include "tools/job_cli.h"
#include "tools/lm.h"
#include "tools/local.h"
#include "tools/report.h"
#include "tools/simulate.h"

namespace {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

int ServerStatus(const std::string& server, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  auto stub = cleave::v1::Coordinator::NewStub(grpc::CreateChannel(server, credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  cleave::v1::StatusReply reply;
  grpc::Status s = stub->GetStatus(&ctx, cleave::v1::StatusRequest(), &reply);
  if (!s.ok()) {
    std::cerr << "cleave status: " << server << ": " << s.error_message() << "\n";
    return 1;
  }
  std::cout << "run " << reply.run_id() << ": round " << reply.round() << "/"
            << reply.total_rounds() << ", " << reply.phase() << ", "
            << reply.connected_clients() << " clients connected, last test accuracy "
            << reply.last_test_accuracy() << "\n";
  return 0;
}

// A subcommand: its options registered on its CLI::App, and what runs it once parsed
// (the process's exit code).
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command AddLocal(CLI::App& app) {
  auto o = std::make_shared<cleave::LocalOptions>();
  auto* l = app.add_subcommand("local", "run a server and N clients as processes on loopback");
  l->add_option("--config", o->config_path, "job config (YAML)")->required();
  l->add_option("--clients", o->clients, "number of clients (default: local.clients)")
      ->check(cleave::AtLeastOne());
  l->add_option("--run-dir", o->run_dir, "run directory (default: runs/<name>-<time>)");
  l->add_option("--rounds", o->rounds, "override run.rounds")->check(cleave::AtLeastOne());
  l->add_flag("--insecure", o->insecure,
              "plaintext on loopback instead of TLS with certificates made for the run");
  return {l, [o] {
            o->bin_dir = SelfDir();
            return cleave::RunLocal(*o);
          }};
}

Command AddSimulate(CLI::App& app) {
  auto o = std::make_shared<cleave::SimulateOptions>();
  auto* sim = app.add_subcommand(
      "simulate", "run a server and thousands of virtual clients in this process (no sockets)");
  sim->add_option("--config", o->config_path, "job config (YAML)")->required();
  sim->add_option("--clients", o->clients, "virtual clients (default: local.clients)")
      ->check(cleave::AtLeastOne());
  sim->add_option("--rounds", o->rounds, "override run.rounds")->check(cleave::AtLeastOne());
  sim->add_option("--run-dir", o->run_dir, "run directory (default: runs/<name>-sim-<time>)");
  sim->add_option("--task-slots", o->task_slots,
                  "clients working on a task at once (default: the machine's cores)")
      ->check(cleave::AtLeastOne());
  sim->add_option("--log-level", o->log_level, "level of RUN_DIR/simulate.log")
      ->check(CLI::IsMember(cleave::LogLevels()));
  return {sim, [o] { return cleave::RunSimulate(*o); }};
}

struct TraceArgs {
  cleave::TraceSpec spec;
  std::string out, up, down, tiers;
};

int RunTrace(TraceArgs& t) {
  for (auto [flag, text, lo, hi] :
       {std::tuple{"--uplink-mbps", t.up, &t.spec.uplink_min_mbps, &t.spec.uplink_max_mbps},
        std::tuple{"--downlink-mbps", t.down, &t.spec.downlink_min_mbps,
                   &t.spec.downlink_max_mbps}}) {
    if (text.empty()) continue;
    const auto colon = text.find(':');
    if (colon == std::string::npos || !absl::SimpleAtod(text.substr(0, colon), lo) ||
        !absl::SimpleAtod(text.substr(colon + 1), hi)) {
      std::cerr << "cleave trace: " << flag << " wants MIN:MAX, got '" << text << "'\n";
      return 2;
    }
  }
  if (!t.tiers.empty()) {
    auto tiers = cleave::ParseTiers(t.tiers);
    if (!tiers.ok()) {
      std::cerr << "cleave trace: " << tiers.status().message() << "\n";
      return 2;
    }
    t.spec.tiers = *std::move(tiers);
  }
  auto traces = cleave::GenerateDeviceTraces(t.spec);
  cleave::Status s = traces.ok() ? cleave::WriteFileAtomic(t.out, cleave::FormatDeviceTraces(*traces))
                                 : traces.status();
  if (!s.ok()) {
    std::cerr << "cleave trace: " << s.message() << "\n";
    return traces.ok() ? 1 : 2;
  }
  std::cout << "device trace for " << t.spec.clients << " clients in " << t.out << "\n";
  return 0;
}

Command AddTrace(CLI::App& app) {
  auto t = std::make_shared<TraceArgs>();
  auto* trace = app.add_subcommand(
      "trace", "write a device trace (speed, links, online windows) for local.trace");
  trace->add_option("--clients", t->spec.clients, "clients (lines)")->required()
      ->check(cleave::AtLeastOne());
  trace->add_option("--out", t->out, "the CSV file to write")->required();
  trace->add_option("--seed", t->spec.seed, "seed (the same seed, the same trace)");
  trace->add_option("--speed-spread", t->spec.speed_spread,
                    "compute slowdown log-uniform in [1, X] (default 1: all alike)");
  trace->add_option("--uplink-mbps", t->up, "uplink log-uniform in MIN:MAX Mbps");
  trace->add_option("--downlink-mbps", t->down, "downlink log-uniform in MIN:MAX Mbps");
  trace->add_option("--online", t->spec.online_fraction,
                    "fraction of the time a client is online (default 1: always)");
  trace->add_option("--session-s", t->spec.session_s, "mean online session (seconds)");
  trace->add_option("--tiers", t->tiers,
                    "device tiers in equal numbers, MEMORY_MB:SLOWDOWN,... (client i is of tier i mod n: the "
                    "memory it lends to training, a factor on its slowdown), e.g. 4096:1,1024:4,256:16");
  trace->add_option("--horizon-s", t->spec.horizon_s,
                    "windows up to this time (seconds); online for good after it");
  return {trace, [t] { return RunTrace(*t); }};
}

Command AddReport(CLI::App& app) {
  auto o = std::make_shared<cleave::ReportOptions>();
  auto* report = app.add_subcommand(
      "report", "an HTML report (SVG plots) and Markdown/CSV tables of one or several runs");
  report->add_option("run_dirs", o->run_dirs, "run directories, side by side")->required();
  report->add_option("--out", o->out,
                     "writes OUT.html, OUT.md, OUT.csv (default: RUN_DIR/report for one run, "
                     "./report for several)");
  return {report, [o] { return cleave::RunReport(*o); }};
}

struct StatusArgs {
  std::string server, ca, cert, key, token_file;
  bool insecure = false;
};

int RunStatus(const StatusArgs& a) {
  if (a.cert.empty() != a.key.empty()) {
    std::cerr << "cleave status: --cert and --key go together\n";
    return 2;
  }
  if (a.ca.empty() && !a.insecure) {
    std::cerr << "cleave status: give --ca (the federation CA), or --insecure for plaintext\n";
    return 2;
  }
  std::string token;
  if (!a.token_file.empty()) {
    auto read = cleave::ReadBearerToken(a.token_file);
    if (!read.ok()) {
      std::cerr << "cleave status: --token-file: " << read.status().message() << "\n";
      return 2;
    }
    token = *read;
  }
  return ServerStatus(a.server, cleave::ClientCredentials(a.ca, a.cert, a.key, 60, token));
}

Command AddStatus(CLI::App& app) {
  auto a = std::make_shared<StatusArgs>();
  auto* st = app.add_subcommand("status", "ask a running server how it is doing");
  st->add_option("--server", a->server, "HOST:PORT")->required();
  st->add_option("--ca", a->ca, "federation CA certificate: speak TLS");
  st->add_option("--cert", a->cert, "a client certificate, for a mutual-TLS server")->needs("--ca");
  st->add_option("--key", a->key, "its private key")->needs("--cert");
  st->add_flag("--insecure", a->insecure, "plaintext (a server run with --insecure)")
      ->excludes("--ca");
  st->add_option("--token-file", a->token_file, "bearer token (the server's auth.token_file)")
      ->needs("--ca");
  return {st, [a] { return RunStatus(*a); }};
}

struct JobArgs {
  cleave::JobCliOptions connection;
  std::string config, id, out;
  bool follow = false;
};

// `cleave job SUBCOMMAND`: a daemon's jobs (tools/job_cli.h).
Command AddJob(CLI::App& app) {
  auto a = std::make_shared<JobArgs>();
  auto* job = app.add_subcommand("job", "submit, list, follow and cancel a daemon's jobs");
  job->require_subcommand(1);
  job->add_option("--server", a->connection.server, "the daemon's job API, HOST:PORT")->required();
  job->add_option("--ca", a->connection.ca, "the daemon's CA certificate: speak TLS");
  job->add_option("--cert", a->connection.cert, "a client certificate (its CN is who you are)")->needs("--ca");
  job->add_option("--key", a->connection.key, "its private key")->needs("--cert");
  job->add_option("--token-file", a->connection.token_file, "a bearer token the daemon's policy names");
  job->add_flag("--insecure", a->connection.insecure, "plaintext (a daemon run with --insecure)")->excludes("--ca");
  job->fallthrough();
  auto* submit = job->add_subcommand("submit", "queue a job; prints its id");
  submit->add_option("config", a->config, "the job's config (YAML)")->required();
  auto* list = job->add_subcommand("list", "every job you may read: state, progress, accuracy");
  auto* status = job->add_subcommand("status", "one job in full");
  auto* logs = job->add_subcommand("logs", "a job's rounds (metrics.jsonl lines)");
  logs->add_flag("--follow,-f", a->follow, "keep printing new rounds until the job ends");
  auto* cancel = job->add_subcommand("cancel", "cancel a queued or running job");
  auto* audit = job->add_subcommand("audit", "every submission and cancellation (admin)");
  auto* download = job->add_subcommand("download", "a job's run directory and its report");
  download->add_option("--out", a->out, "where to write it")->required();
  for (CLI::App* sub : {status, logs, cancel, download}) sub->add_option("id", a->id, "the job's id (job-N)")->required();
  return {job, [a, submit, list, status, logs, cancel, audit] {
            const cleave::JobCliOptions& c = a->connection;
            if (submit->parsed()) return cleave::JobSubmit(c, a->config);
            if (list->parsed()) return cleave::JobList(c);
            if (status->parsed()) return cleave::JobStatus(c, a->id);
            if (logs->parsed()) return cleave::JobLogs(c, a->id, a->follow);
            if (cancel->parsed()) return cleave::JobCancel(c, a->id);
            if (audit->parsed()) return cleave::JobAudit(c);
            return cleave::JobDownload(c, a->id, a->out);
          }};
}

struct CertsArgs {
  std::string dir, client_name;
  cleave::CertOptions options;
};

Command AddCerts(CLI::App& app) {
  auto a = std::make_shared<CertsArgs>();
  auto* certs = app.add_subcommand("certs", "provision a federation's TLS identities");
  certs->require_subcommand(1);
  auto* init = certs->add_subcommand("init", "create DIR with a new root CA and the server's certificate");
  init->add_option("dir", a->dir, "federation directory")->required();
  init->add_option("--san", a->options.server_names,
                   "the server's host names and IP addresses (default: localhost 127.0.0.1 ::1)");
  init->add_option("--federation", a->options.federation, "a name for the CA's subject");
  auto* issue = certs->add_subcommand("issue", "issue a client certificate whose identity is NAME");
  issue->add_option("dir", a->dir, "federation directory")->required();
  issue->add_option("name", a->client_name, "the client's name (its identity)")->required();
  auto* revoke = certs->add_subcommand(
      "revoke", "revoke NAME: add it to DIR/revoked.txt (the server's tls.revoked)");
  revoke->add_option("dir", a->dir, "federation directory")->required();
  revoke->add_option("name", a->client_name, "the client's name")->required();
  return {certs, [a, init, revoke] {
            if (revoke->parsed()) {
              if (cleave::Status s = cleave::RevokeClient(a->dir, a->client_name); !s.ok()) {
                std::cerr << "cleave certs revoke: " << s.message() << "\n";
                return 1;
              }
              std::cout << a->client_name << " revoked in " << a->dir
                        << "/revoked.txt; a server with tls.revoked set to it ends its session "
                           "within tls.reload_s\n";
              return 0;
            }
            const bool is_init = init->parsed();
            cleave::Status s = is_init ? cleave::InitFederation(a->dir, a->options)
                                       : cleave::IssueClientCert(a->dir, a->client_name, a->options);
            if (!s.ok()) {
              std::cerr << "cleave certs: " << s.message() << "\n";
              return 1;
            }
            std::cout << (is_init ? "federation CA and server certificate in " + a->dir
                                  : "client certificate for " + a->client_name + " in " + a->dir +
                                        "/clients")
                      << "\n";
            return 0;
          }};
}

struct EpsilonArgs {
  double z = 0, q = 0, delta = 1e-5;
  int64_t steps = 0;
};

Command AddPrivacy(CLI::App& app) {
  auto a = std::make_shared<EpsilonArgs>();
  auto* privacy = app.add_subcommand("privacy", "plan a differential-privacy budget");
  privacy->require_subcommand(1);
  auto* epsilon = privacy->add_subcommand(
      "epsilon", "epsilon of the sampled Gaussian mechanism (RDP accountant)");
  epsilon->add_option("--noise-multiplier", a->z, "noise std / clipping norm")->required();
  epsilon->add_option("--sampling-rate", a->q, "fraction of clients (or examples) per step")
      ->required();
  epsilon->add_option("--steps", a->steps, "rounds (or steps)")->required();
  epsilon->add_option("--delta", a->delta, "delta (default 1e-5)");
  return {privacy, [a] {
            auto e = cleave::dp::ComputeEpsilon(a->q, a->z, a->steps, a->delta);
            if (!e.ok()) {
              std::cerr << "cleave privacy epsilon: " << e.status().message() << "\n";
              return 2;
            }
            std::cout << "epsilon " << e->epsilon << " at delta " << a->delta
                      << " (best RDP order " << e->order << ")\n";
            return 0;
          }};
}

Command AddAttack(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto* attack = app.add_subcommand("attack", "attacks a curious server runs on what it recorded (split.record)");
  attack->require_subcommand(1);
  auto* tokens = attack->add_subcommand(
      "tokens", "recover a decoder's tokens from the activations recorded at its embedding cut (split.cut: 1)");
  tokens->add_option("run_dir", *run_dir, "the run directory")->required();
  auto o = std::make_shared<cleave::AttackOptions>();
  tokens->add_option("--aux", o->aux, "auxiliary sequences for the learned inverter (a data spec; default: the job's "
                     "data.test)");
  tokens->add_option("--aux-limit", o->aux_limit, "use the first N auxiliary sequences (default 5000)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  tokens->add_option("--steps", o->steps, "the learned inverter's training steps (default 1500)")
      ->check(CLI::Range(1, 1000000));
  tokens->add_option("--round", o->round, "attack that round's records only (default: every round's)");
  auto* images = attack->add_subcommand(
      "images", "reconstruct an image model's inputs from the activations recorded at its cut (SSIM, PSNR)");
  images->add_option("run_dir", *run_dir, "the run directory")->required();
  images->add_option("--aux", o->aux, "auxiliary images of the same domain (a data spec; default: the job's data.test)");
  images->add_option("--aux-limit", o->aux_limit, "use the first N auxiliary images (default 5000)")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 30));
  images->add_option("--steps", o->steps, "the learned inverter's training steps (default 1500)")
      ->check(CLI::Range(1, 1000000));
  images->add_option("--optimise-steps", o->optimise_steps,
                     "white-box optimisation steps per micro-batch (default 400; 0: not run)")
      ->check(CLI::Range(0, 1000000));
  images->add_option("--grid", o->grid, "write the first images as a PNG: the devices' inputs, learned, optimised");
  images->add_option("--round", o->round, "attack that round's records only (default: every round's)");
  auto* updates = attack->add_subcommand(
      "updates", "invert the federated updates recorded (server.record_updates): DLG with iDLG's labels (SSIM)");
  updates->add_option("run_dir", *run_dir, "the run directory")->required();
  updates->add_option("--steps", o->steps, "optimisation steps per update (default 2000)")->check(CLI::Range(1, 1000000));
  updates->add_option("--round", o->round, "attack that round's records only (default: every round's)");
  updates->add_option("--grid", o->grid, "write the first images as a PNG: the devices' batches, reconstructed");
  auto* labels = attack->add_subcommand("labels", "infer labels from the gradients recorded at the cut (AUC)");
  labels->add_option("run_dir", *run_dir, "the run directory")->required();
  labels->add_option("--round", o->round, "attack that round's records only (default: every round's)");
  auto* hijack = attack->add_subcommand(
      "hijack", "score what a hijacking server (split.hijack) reconstructed of the devices' inputs (SSIM, PSNR)");
  hijack->add_option("run_dir", *run_dir, "the run directory")->required();
  hijack->add_option("--round", o->round, "score that round's records only (default: every round's)");
  hijack->add_option("--grid", o->grid, "write the last round's first images as a PNG: the devices' inputs, the hijack's");
  return {attack, [run_dir, o, images, labels, updates, hijack] {
            if (images->parsed()) return cleave::RunImageAttack(*run_dir, *o, std::cout, std::cerr);
            if (hijack->parsed()) return cleave::RunHijackScore(*run_dir, *o, std::cout, std::cerr);
            if (labels->parsed()) return cleave::RunLabelAttack(*run_dir, o->round, std::cout, std::cerr);
            if (updates->parsed()) {
              if (updates->count("--steps") == 0) o->steps = 2000;
              return cleave::RunUpdateAttack(*run_dir, *o, std::cout, std::cerr);
            }
            return cleave::RunTokenAttack(*run_dir, *o, std::cout, std::cerr);
          }};
}

Command AddTokenizer(CLI::App& app) {
  auto o = std::make_shared<cleave::TokenizerTrainOptions>();
  auto* tokenizer = app.add_subcommand("tokenizer", "text tokenizers for language models");
  tokenizer->require_subcommand(1);
  auto* train = tokenizer->add_subcommand("train", "train a SentencePiece model on text");
  train->add_option("--input", o->inputs, "text files or directories of them")->required();
  train->add_option("--vocab", o->vocab, "pieces in the vocabulary (default 4096)")
      ->check(CLI::Range(8, 1 << 20));
  train->add_option("--type", o->type, "unigram (default), bpe, char or word")
      ->check(CLI::IsMember({"unigram", "bpe", "char", "word"}));
  train->add_option("--out", o->out, "writes OUT.model and OUT.vocab")->required();
  auto c = std::make_shared<cleave::TokenizerCodecOptions>();
  auto* encode = tokenizer->add_subcommand("encode", "a text's token ids, on one line");
  encode->add_option("--tokenizer", c->tokenizer, "byte, spm:MODEL, gpt2:DIR or hf:PATH (default byte)");
  encode->add_option("--text", c->text, "the text")->required();
  encode->add_flag("--special", c->special, "add the model's special tokens (beginning of text, ...)");
  auto* decode = tokenizer->add_subcommand("decode", "the text of token ids");
  decode->add_option("--tokenizer", c->tokenizer, "byte, spm:MODEL, gpt2:DIR or hf:PATH (default byte)");
  decode->add_option("ids", c->ids, "the ids")->required();
  return {tokenizer, [o, c, encode, decode] {
            if (encode->parsed()) return cleave::RunTokenizerEncode(*c);
            if (decode->parsed()) return cleave::RunTokenizerDecode(*c);
            return cleave::RunTokenizerTrain(*o);
          }};
}

// A trained model: a run directory, or a config and a checkpoint given apart.
void AddModelSource(CLI::App* cmd, cleave::ModelSource& src) {
  cmd->add_option("run_dir", src.run_dir, "a run directory (its config.yaml and checkpoint.pb)");
  cmd->add_option("--config", src.config, "the job config (default: RUN_DIR/config.yaml)");
  cmd->add_option("--checkpoint", src.checkpoint,
                  "a checkpoint.pb, a .safetensors file, or a Hugging Face folder (no config needed) "
                  "(default: RUN_DIR/checkpoint.pb)");
}

Command AddGenerate(CLI::App& app) {
  auto o = std::make_shared<cleave::GenerateOptions>();
  auto* generate = app.add_subcommand("generate", "sample text from a trained language model");
  AddModelSource(generate, o->model);
  generate->add_option("--prompt", o->prompt, "the text to continue")->required();
  generate->add_option("--tokens", o->tokens, "tokens to sample (default 200)")
      ->check(cleave::AtLeastOne());
  generate->add_option("--temperature", o->temperature,
                       "sampling temperature; 0 = greedy (default 0.8)")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-p", o->top_p, "sample among the most likely tokens whose probability reaches p (default 1: off)")
      ->check(CLI::Range(0.0, 1.0));
  generate->add_option("--top-k", o->top_k, "sample among the k most likely (default 40; 0 = all)")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", o->seed, "sampling seed");
  generate->add_option("--tokenizer", o->tokenizer,
                       "byte or spm:MODEL (default: the config's local.data tokenizer=)");
  return {generate, [o] { return cleave::RunGenerate(*o); }};
}

Command AddEvaluate(CLI::App& app) {
  auto o = std::make_shared<cleave::EvaluateOptions>();
  auto* evaluate = app.add_subcommand(
      "evaluate", "measure a trained model on test data, whole and per group or client");
  AddModelSource(evaluate, o->model);
  evaluate->add_option("--data", o->data,
                       "a data spec, its test part (default: the config's data.test)");
  evaluate->add_option("--by", o->by,
                       "group: a row per group of the data (a text file, a folder); client:N: "
                       "per client of the natural partition into N");
  evaluate->add_option("--batch-size", o->batch_size, "evaluation batch (default 64)")
      ->check(cleave::AtLeastOne());
  evaluate->add_option("--width", o->width,
                       "evaluate the width-scaled submodel a device of this rate trains (the leading channels; "
                       "job section width), in (0, 1] (default 1: the whole model)")
      ->check(CLI::Range(1e-6, 1.0));
  return {evaluate, [o] { return cleave::RunEvaluate(*o); }};
}

Command AddExport(CLI::App& app) {
  auto o = std::make_shared<cleave::ExportOptions>();
  auto* export_cmd = app.add_subcommand(
      "export", "write a trained model as safetensors (GPT-2's layout for model gpt)");
  AddModelSource(export_cmd, o->model);
  export_cmd->add_option("--out", o->out, "the .safetensors file to write")->required();
  return {export_cmd, [o] { return cleave::RunExport(*o); }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cleave: run and inspect federations"};
  app.require_subcommand(1);
  const Command commands[] = {
      AddLocal(app),   AddSimulate(app),  AddTrace(app),    AddReport(app),
      AddStatus(app),  AddCerts(app),     AddPrivacy(app),  AddAttack(app),  AddTokenizer(app),
      AddGenerate(app), AddEvaluate(app), AddExport(app), AddJob(app),
  };
  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  for (const Command& c : commands) {
    if (c.app->parsed()) return c.run();
  }
  return 2;  // require_subcommand(1): not reached
}
