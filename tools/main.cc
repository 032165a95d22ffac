// cleave: the operator's tool.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <tuple>
#include <filesystem>
#include <iostream>

#include "core/cli.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "privacy/accountant.h"
#include "privacy/certs.h"
#include "privacy/tls.h"
#include "tools/lm.h"
#include "tools/local.h"
#include "tools/report.h"
#include "tools/simulate.h"
#include "core/device_trace.h"
#include "core/files.h"
#include "absl/strings/numbers.h"
#include "core/logging.h"

namespace {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return std::filesystem::path(buf).parent_path().string();
}

int Status(const std::string& server, std::shared_ptr<grpc::ChannelCredentials> credentials) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cleave: run and inspect federations"};
  app.require_subcommand(1);

  cleave::LocalOptions local;
  auto* l = app.add_subcommand("local", "run a server and N clients as processes on loopback");
  l->add_option("--config", local.config_path, "job config (YAML)")->required();
  l->add_option("--clients", local.clients, "number of clients (default: local.clients)")
      ->check(cleave::AtLeastOne());
  l->add_option("--run-dir", local.run_dir, "run directory (default: runs/<name>-<time>)");
  l->add_option("--rounds", local.rounds, "override run.rounds")->check(cleave::AtLeastOne());
  l->add_flag("--insecure", local.insecure,
              "plaintext on loopback instead of TLS with certificates made for the run");

  cleave::SimulateOptions sim;
  auto* simulate = app.add_subcommand(
      "simulate", "run a server and thousands of virtual clients in this process (no sockets)");
  simulate->add_option("--config", sim.config_path, "job config (YAML)")->required();
  simulate->add_option("--clients", sim.clients, "virtual clients (default: local.clients)")
      ->check(cleave::AtLeastOne());
  simulate->add_option("--rounds", sim.rounds, "override run.rounds")->check(cleave::AtLeastOne());
  simulate->add_option("--run-dir", sim.run_dir, "run directory (default: runs/<name>-sim-<time>)");
  simulate->add_option("--task-slots", sim.task_slots,
                       "clients working on a task at once (default: the machine's cores)")
      ->check(cleave::AtLeastOne());
  simulate->add_option("--log-level", sim.log_level, "level of RUN_DIR/simulate.log")
      ->check(CLI::IsMember(cleave::LogLevels()));

  cleave::TraceSpec trace_spec;
  std::string trace_out, trace_up, trace_down;
  auto* trace = app.add_subcommand(
      "trace", "write a device trace (speed, links, online windows) for local.trace");
  trace->add_option("--clients", trace_spec.clients, "clients (lines)")->required()
      ->check(cleave::AtLeastOne());
  trace->add_option("--out", trace_out, "the CSV file to write")->required();
  trace->add_option("--seed", trace_spec.seed, "seed (the same seed, the same trace)");
  trace->add_option("--speed-spread", trace_spec.speed_spread,
                    "compute slowdown log-uniform in [1, X] (default 1: all alike)");
  trace->add_option("--uplink-mbps", trace_up, "uplink log-uniform in MIN:MAX Mbps");
  trace->add_option("--downlink-mbps", trace_down, "downlink log-uniform in MIN:MAX Mbps");
  trace->add_option("--online", trace_spec.online_fraction,
                    "fraction of the time a client is online (default 1: always)");
  trace->add_option("--session-s", trace_spec.session_s, "mean online session (seconds)");
  trace->add_option("--horizon-s", trace_spec.horizon_s,
                    "windows up to this time (seconds); online for good after it");

  cleave::ReportOptions report;
  auto* report_cmd = app.add_subcommand(
      "report", "an HTML report (SVG plots) and Markdown/CSV tables of one or several runs");
  report_cmd->add_option("run_dirs", report.run_dirs, "run directories, side by side")->required();
  report_cmd->add_option("--out", report.out,
                         "writes OUT.html, OUT.md, OUT.csv (default: RUN_DIR/report for one run, "
                         "./report for several)");

  std::string server;
  auto* st = app.add_subcommand("status", "ask a running server how it is doing");
  st->add_option("--server", server, "HOST:PORT")->required();
  std::string ca, cert, key;
  st->add_option("--ca", ca, "federation CA certificate: speak TLS");
  st->add_option("--cert", cert, "a client certificate, for a mutual-TLS server")->needs("--ca");
  st->add_option("--key", key, "its private key")->needs("--cert");
  bool status_insecure = false;
  std::string token_file;
  st->add_flag("--insecure", status_insecure, "plaintext (a server run with --insecure)")
      ->excludes("--ca");
  st->add_option("--token-file", token_file, "bearer token (the server's auth.token_file)")
      ->needs("--ca");

  auto* certs = app.add_subcommand("certs", "provision a federation's TLS identities");
  certs->require_subcommand(1);
  std::string certs_dir, client_name;
  cleave::CertOptions cert_opts;
  auto* init = certs->add_subcommand("init", "create DIR with a new root CA and the server's certificate");
  init->add_option("dir", certs_dir, "federation directory")->required();
  init->add_option("--san", cert_opts.server_names,
                   "the server's host names and IP addresses (default: localhost 127.0.0.1 ::1)");
  init->add_option("--federation", cert_opts.federation, "a name for the CA's subject");
  auto* issue = certs->add_subcommand("issue", "issue a client certificate whose identity is NAME");
  issue->add_option("dir", certs_dir, "federation directory")->required();
  issue->add_option("name", client_name, "the client's name (its identity)")->required();
  auto* revoke = certs->add_subcommand(
      "revoke", "revoke NAME: add it to DIR/revoked.txt (the server's tls.revoked)");
  revoke->add_option("dir", certs_dir, "federation directory")->required();
  revoke->add_option("name", client_name, "the client's name")->required();

  auto* privacy = app.add_subcommand("privacy", "plan a differential-privacy budget");
  privacy->require_subcommand(1);
  double z = 0, q = 0, delta = 1e-5;
  int64_t steps = 0;
  auto* epsilon = privacy->add_subcommand(
      "epsilon", "epsilon of the sampled Gaussian mechanism (RDP accountant)");
  epsilon->add_option("--noise-multiplier", z, "noise std / clipping norm")->required();
  epsilon->add_option("--sampling-rate", q, "fraction of clients (or examples) per step")
      ->required();
  epsilon->add_option("--steps", steps, "rounds (or steps)")->required();
  epsilon->add_option("--delta", delta, "delta (default 1e-5)");

  auto* tokenizer = app.add_subcommand("tokenizer", "text tokenizers for language models");
  tokenizer->require_subcommand(1);
  cleave::TokenizerTrainOptions tok;
  auto* tok_train = tokenizer->add_subcommand("train", "train a SentencePiece model on text");
  tok_train->add_option("--input", tok.inputs, "text files or directories of them")->required();
  tok_train->add_option("--vocab", tok.vocab, "pieces in the vocabulary (default 4096)")
      ->check(CLI::Range(8, 1 << 20));
  tok_train->add_option("--type", tok.type, "unigram (default), bpe, char or word")
      ->check(CLI::IsMember({"unigram", "bpe", "char", "word"}));
  tok_train->add_option("--out", tok.out, "writes OUT.model and OUT.vocab")->required();

  // A trained model: a run directory, or a config and a checkpoint given apart.
  auto add_model_source = [](CLI::App* cmd, cleave::ModelSource& src) {
    cmd->add_option("run_dir", src.run_dir, "a run directory (its config.yaml and checkpoint.pb)");
    cmd->add_option("--config", src.config, "the job config (default: RUN_DIR/config.yaml)");
    cmd->add_option("--checkpoint", src.checkpoint,
                    "a checkpoint.pb or a .safetensors file (default: RUN_DIR/checkpoint.pb)");
  };
  cleave::GenerateOptions gen;
  auto* generate = app.add_subcommand("generate", "sample text from a trained language model");
  add_model_source(generate, gen.model);
  generate->add_option("--prompt", gen.prompt, "the text to continue")->required();
  generate->add_option("--tokens", gen.tokens, "tokens to sample (default 200)")
      ->check(cleave::AtLeastOne());
  generate->add_option("--temperature", gen.temperature, "sampling temperature; 0 = greedy (default 0.8)")
      ->check(CLI::Range(0.0, 100.0));
  generate->add_option("--top-k", gen.top_k, "sample among the k most likely (default 40; 0 = all)")
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--seed", gen.seed, "sampling seed");
  generate->add_option("--tokenizer", gen.tokenizer,
                       "byte or spm:MODEL (default: the config's local.data tokenizer=)");
  cleave::EvaluateOptions ev;
  auto* evaluate = app.add_subcommand(
      "evaluate", "measure a trained model on test data, whole and per group or client");
  add_model_source(evaluate, ev.model);
  evaluate->add_option("--data", ev.data, "a data spec, its test part (default: the config's data.test)");
  evaluate->add_option("--by", ev.by,
                       "group: a row per group of the data (a text file, a folder); client:N: "
                       "per client of the natural partition into N");
  evaluate->add_option("--batch-size", ev.batch_size, "evaluation batch (default 64)")
      ->check(cleave::AtLeastOne());
  cleave::ExportOptions exp;
  auto* export_cmd = app.add_subcommand(
      "export", "write a trained model as safetensors (GPT-2's layout for model gpt)");
  add_model_source(export_cmd, exp.model);
  export_cmd->add_option("--out", exp.out, "the .safetensors file to write")->required();

  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (tok_train->parsed()) return cleave::RunTokenizerTrain(tok);
  if (generate->parsed()) return cleave::RunGenerate(gen);
  if (export_cmd->parsed()) return cleave::RunExport(exp);
  if (evaluate->parsed()) return cleave::RunEvaluate(ev);
  if (privacy->parsed()) {
    auto e = cleave::dp::ComputeEpsilon(q, z, steps, delta);
    if (!e.ok()) {
      std::cerr << "cleave privacy epsilon: " << e.status().message() << "\n";
      return 2;
    }
    std::cout << "epsilon " << e->epsilon << " at delta " << delta << " (best RDP order "
              << e->order << ")\n";
    return 0;
  }
  if (revoke->parsed()) {
    if (cleave::Status s = cleave::RevokeClient(certs_dir, client_name); !s.ok()) {
      std::cerr << "cleave certs revoke: " << s.message() << "\n";
      return 1;
    }
    std::cout << client_name << " revoked in " << certs_dir
              << "/revoked.txt; a server with tls.revoked set to it ends its session within "
                 "tls.reload_s\n";
    return 0;
  }
  if (certs->parsed()) {
    const bool is_init = init->parsed();
    cleave::Status s = is_init ? cleave::InitFederation(certs_dir, cert_opts)
                               : cleave::IssueClientCert(certs_dir, client_name, cert_opts);
    if (!s.ok()) {
      std::cerr << "cleave certs: " << s.message() << "\n";
      return 1;
    }
    std::cout << (is_init ? "federation CA and server certificate in " + certs_dir
                          : "client certificate for " + client_name + " in " + certs_dir + "/clients")
              << "\n";
    return 0;
  }
  if (simulate->parsed()) return cleave::RunSimulate(sim);
  if (report_cmd->parsed()) return cleave::RunReport(report);
  if (trace->parsed()) {
    for (auto [flag, text, lo, hi] :
         {std::tuple{"--uplink-mbps", trace_up, &trace_spec.uplink_min_mbps, &trace_spec.uplink_max_mbps},
          std::tuple{"--downlink-mbps", trace_down, &trace_spec.downlink_min_mbps,
                     &trace_spec.downlink_max_mbps}}) {
      if (text.empty()) continue;
      const auto colon = text.find(':');
      if (colon == std::string::npos || !absl::SimpleAtod(text.substr(0, colon), lo) ||
          !absl::SimpleAtod(text.substr(colon + 1), hi)) {
        std::cerr << "cleave trace: " << flag << " wants MIN:MAX, got '" << text << "'\n";
        return 2;
      }
    }
    auto traces = cleave::GenerateDeviceTraces(trace_spec);
    cleave::Status s = traces.ok() ? cleave::WriteFileAtomic(trace_out, cleave::FormatDeviceTraces(*traces))
                                   : traces.status();
    if (!s.ok()) {
      std::cerr << "cleave trace: " << s.message() << "\n";
      return traces.ok() ? 1 : 2;
    }
    std::cout << "device trace for " << trace_spec.clients << " clients in " << trace_out << "\n";
    return 0;
  }
  if (l->parsed()) {
    local.bin_dir = SelfDir();
    return cleave::RunLocal(local);
  }
  if (cert.empty() != key.empty()) {
    std::cerr << "cleave status: --cert and --key go together\n";
    return 2;
  }
  if (ca.empty() && !status_insecure) {
    std::cerr << "cleave status: give --ca (the federation CA), or --insecure for plaintext\n";
    return 2;
  }
  std::string token;
  if (!token_file.empty()) {
    auto read = cleave::ReadBearerToken(token_file);
    if (!read.ok()) {
      std::cerr << "cleave status: --token-file: " << read.status().message() << "\n";
      return 2;
    }
    token = *read;
  }
  return Status(server, cleave::ClientCredentials(ca, cert, key, 60, token));
}
