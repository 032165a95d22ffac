// TLS on the wire and identity binding (issue 5): the server takes a client's identity
// from its verified certificate; no client can join or act as another.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "client/client.h"
#include "client/transfer.h"
#include "core/files.h"
#include "data/dataset.h"
#include "job/job.h"
#include "privacy/certs.h"
#include "privacy/tls.h"
#include "server/server.h"
#include "tests/deadline.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

// Channel credentials from a federation directory: `name`'s certificate unless empty,
// and the CA to verify the server with (`dir`'s unless `server_ca` is given).
std::shared_ptr<grpc::ChannelCredentials> Credentials(const fs::path& dir, const std::string& name,
                                                      const fs::path& server_ca = {}) {
  const fs::path ca = server_ca.empty() ? dir / "ca.crt" : server_ca;
  if (name.empty()) return ClientCredentials(ca.string(), "", "", 1);
  return ClientCredentials(ca.string(), (dir / "clients" / (name + ".crt")).string(),
                           (dir / "clients" / (name + ".key")).string(), 1);
}

// Joins with `name` over `creds`; returns the stream's status when refused.
grpc::Status TryJoin(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds,
                     const std::string& name) {
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  ctx.set_deadline(testing::RpcDeadline(10));
  auto stream = stub->Control(&ctx);
  v1::ClientMessage m;
  m.mutable_join()->set_name(name);
  m.mutable_join()->set_num_examples(10);
  m.mutable_join()->set_protocol_version(1);
  v1::ServerMessage reply;
  if (stream->Write(m) && stream->Read(&reply) && reply.has_welcome()) {
    ctx.TryCancel();
    stream->Finish();
    return grpc::Status::OK;
  }
  return stream->Finish();
}

class TlsTest : public RunningServerTest {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cleave-tls-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    ASSERT_TRUE(InitFederation(dir_.string()).ok());
    for (const char* n : {"alice", "bob"}) ASSERT_TRUE(IssueClientCert(dir_.string(), n).ok());
    CertOptions other;
    other.federation = "other";
    ASSERT_TRUE(InitFederation((dir_ / "other").string(), other).ok());
    ASSERT_TRUE(IssueClientCert((dir_ / "other").string(), "alice").ok());
  }
  void TearDown() override {
    RunningServerTest::TearDown();
    fs::remove_all(dir_);
  }

  void StartServer(const std::string& yaml, const std::string& ca = "", bool mutual = true) {
    ServerOptions o;
    auto config = ParseJob(
        yaml + "tls: {cert: " + (dir_ / "server.crt").string() + ", key: " +
            (dir_ / "server.key").string() + ", ca: " + (ca.empty() ? (dir_ / "ca.crt").string() : ca) +
            ", mutual: " + (mutual ? "true" : "false") + ", reload_s: 1}\n",
        "");
    ASSERT_TRUE(config.ok()) << config.status();
    o.config = *config;
    o.clock = clock_;
    StartServerWith(std::move(o));
  }

  fs::path dir_;
  // The server's clock: tests move it past tls.reload_s (1 s) to make it re-read files.
  std::shared_ptr<FakeClock> clock_ = std::make_shared<FakeClock>();
};

TEST_F(TlsTest, OnlyEnrolledClientsJoinAndOnlyAsThemselves) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 3}\n");
  EXPECT_TRUE(TryJoin(address_, Credentials(dir_, "alice"), "alice").ok());
  EXPECT_TRUE(TryJoin(address_, Credentials(dir_, "alice"), "").ok()) << "the name is the CN";
  auto s = TryJoin(address_, Credentials(dir_, "bob"), "alice");
  EXPECT_EQ(s.error_code(), StatusCode::PERMISSION_DENIED) << s.error_message();
  // No certificate, another federation's certificate, or plaintext: no connection at all.
  EXPECT_EQ(TryJoin(address_, Credentials(dir_, ""), "alice").error_code(), StatusCode::UNAVAILABLE);
  EXPECT_EQ(TryJoin(address_, Credentials(dir_ / "other", "alice", dir_ / "ca.crt"), "alice")
                .error_code(),
            StatusCode::UNAVAILABLE);
  EXPECT_EQ(TryJoin(address_, grpc::InsecureChannelCredentials(), "alice").error_code(),
            StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, NoClientCanActWithAnothersSession) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 1, round_deadline_s: 30}\n");
  TestPeer alice(address_, 10, Credentials(dir_, "alice"));
  ASSERT_TRUE(alice.Join("alice"));
  auto task = alice.NextTask();
  ASSERT_TRUE(task);
  // Bob holds alice's client id and session token, but not her certificate.
  TestPeer bob(address_, 10, Credentials(dir_, "bob"));
  auto blob = FetchBlob(bob.stub(), alice.welcome().client_id(), alice.welcome().session_token(),
                        task->model_digest(), 10, nullptr);
  EXPECT_EQ(blob.status().code(), absl::StatusCode::kPermissionDenied) << blob.status();
  const v1::UploadHeader h = alice.Header(*task, 10);
  auto upload = bob.RawUpload(h, {});
  EXPECT_EQ(upload.error_code(), StatusCode::PERMISSION_DENIED) << upload.error_message();
  // Alice herself can.
  EXPECT_TRUE(FetchBlob(alice.stub(), alice.welcome().client_id(), alice.welcome().session_token(),
                        task->model_digest(), 10, nullptr)
                  .ok());
}

// One session per certificate: a second connection of the same identity replaces the
// first, whose session token stops working.
TEST_F(TlsTest, OneCertificateIsOneClient) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\n");
  TestPeer first(address_, 10, Credentials(dir_, "alice"));
  ASSERT_TRUE(first.Join("alice"));
  TestPeer second(address_, 10, Credentials(dir_, "alice"));
  ASSERT_TRUE(second.Join("alice"));
  TestPeer bob(address_, 10, Credentials(dir_, "bob"));
  ASSERT_TRUE(bob.Join("bob"));
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address_, Credentials(dir_, "bob")));
  grpc::ClientContext ctx;
  v1::StatusReply reply;
  ASSERT_TRUE(stub->GetStatus(&ctx, v1::StatusRequest(), &reply).ok());
  EXPECT_EQ(reply.connected_clients(), 2) << "alice once, bob once";
  auto stale = FetchBlob(first.stub(), first.welcome().client_id(),
                         first.welcome().session_token(), std::string(64, '0'), 10, nullptr);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kUnauthenticated) << stale.status();
}

// The files are re-read while the server runs: a CA added to tls.ca lets its clients in.
TEST_F(TlsTest, CertificatesReloadWithoutARestart) {
  const fs::path trusted = dir_ / "trusted.crt";
  fs::copy_file(dir_ / "ca.crt", trusted);
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\n", trusted.string());
  // Alice of the other federation, who trusts this server's CA.
  auto other = [&] { return Credentials(dir_ / "other", "alice", dir_ / "ca.crt"); };
  EXPECT_EQ(TryJoin(address_, other(), "alice").error_code(), StatusCode::UNAVAILABLE);
  {
    std::ofstream f(trusted, std::ios::app);
    f << *ReadFile((dir_ / "other" / "ca.crt").string());
  }
  bool joined = false;
  for (int i = 0; i < 50 && !joined; ++i) {
    clock_->AdvanceSeconds(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    joined = TryJoin(address_, other(), "alice").ok();
  }
  EXPECT_TRUE(joined) << "the new CA was not picked up";
}

TEST_F(TlsTest, AFederationTrainsOverMutualTls) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 2, quorum: 1.0}\n");
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::thread> threads;
  std::vector<Status> status(2);
  const Dataset data = *LoadFashionMnist("/usr/share/datasets/fashion-mnist", true, 400);
  for (int i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "alice" : "bob";
    ClientOptions o;
    o.server = address_;
    o.name = name;
    o.train = data;
    o.tls_ca = (dir_ / "ca.crt").string();
    o.tls_cert = (dir_ / "clients" / (name + ".crt")).string();
    o.tls_key = (dir_ / "clients" / (name + ".key")).string();
    clients.push_back(std::make_unique<Client>(std::move(o)));
  }
  for (int i = 0; i < 2; ++i) threads.emplace_back([&, i] { status[i] = clients[i]->Run(); });
  runner_.join();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;
  for (const auto& s : status) EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(server_->History().size(), 1u);
  EXPECT_EQ(server_->History()[0].participants, 2);
}

// Plaintext only when asked for; mutual TLS only with a CA to check clients against.
TEST(TlsConfigTest, TheServerRefusesPlaintextUnlessInsecure) {
  ServerOptions o;
  o.config = *ParseJob("model: {name: mlp}\n", "");
  o.evaluate = false;
  auto refused = Server::Create(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos);
  o.insecure = true;
  EXPECT_TRUE(Server::Create(o).ok());
  o.insecure = false;
  o.config = *ParseJob("model: {name: mlp}\ntls: {cert: s.crt, key: s.key, mutual: true}\n", "");
  EXPECT_EQ(Server::Create(o).status().code(), absl::StatusCode::kInvalidArgument);

  ClientOptions c;
  c.server = "127.0.0.1:1";
  EXPECT_EQ(Client(c).Run().code(), absl::StatusCode::kFailedPrecondition);
  c.insecure = true;
  c.token = "a-token-in-plaintext";
  EXPECT_EQ(Client(c).Run().code(), absl::StatusCode::kFailedPrecondition);
}

// The server speaks TLS 1.3 to a client that offers it (gRPC 1.51 has no way to refuse
// 1.2, so this checks what is negotiated).
TEST_F(TlsTest, NegotiatesTls13) {
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\n", "", false);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  ASSERT_EQ(SSL_CTX_load_verify_locations(ctx, (dir_ / "ca.crt").c_str(), nullptr), 1);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  static const unsigned char kH2[] = {2, 'h', '2'};
  SSL_CTX_set_alpn_protos(ctx, kH2, sizeof(kH2));
  BIO* bio = BIO_new_ssl_connect(ctx);
  ASSERT_NE(bio, nullptr);
  BIO_set_conn_hostname(bio, address_.c_str());
  SSL* ssl = nullptr;
  BIO_get_ssl(bio, &ssl);
  SSL_set_tlsext_host_name(ssl, "localhost");
  ASSERT_EQ(BIO_do_handshake(bio), 1);
  EXPECT_EQ(SSL_get_verify_result(ssl), X509_V_OK);
  EXPECT_EQ(SSL_version(ssl), TLS1_3_VERSION) << SSL_get_version(ssl);
  BIO_free_all(bio);
  SSL_CTX_free(ctx);
}

// auth.token_file: every call must carry the bearer token; compared in constant time.
TEST_F(TlsTest, BearerTokenIsRequiredWhenConfigured) {
  const std::string token = "0123456789abcdef0123";
  std::ofstream(dir_ / "token") << token << "\n";
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\nauth: {token_file: " +
                  (dir_ / "token").string() + "}\n",
              "", false);
  const std::string ca = (dir_ / "ca.crt").string();
  EXPECT_TRUE(TryJoin(address_, ClientCredentials(ca, "", "", 1, token), "alice").ok());
  auto none = TryJoin(address_, ClientCredentials(ca, "", "", 1), "alice");
  EXPECT_EQ(none.error_code(), StatusCode::UNAUTHENTICATED) << none.error_message();
  auto wrong = TryJoin(address_, ClientCredentials(ca, "", "", 1, token + "x"), "alice");
  EXPECT_EQ(wrong.error_code(), StatusCode::UNAUTHENTICATED) << wrong.error_message();
  // Every RPC, not only Join.
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address_, ClientCredentials(ca, "", "", 1)));
  grpc::ClientContext ctx;
  v1::StatusReply reply;
  EXPECT_EQ(stub->GetStatus(&ctx, v1::StatusRequest(), &reply).error_code(),
            StatusCode::UNAUTHENTICATED);
  auto blob = FetchBlob(stub.get(), "c0", "token", "digest", 10, nullptr);
  EXPECT_EQ(blob.status().code(), absl::StatusCode::kUnauthenticated) << blob.status();
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// Unusable TLS material stops the server before it says it listens, naming the file.
TEST_F(TlsTest, TheServerRefusesToStartWithUnusableTlsMaterial) {
  auto start = [&](const fs::path& cert, const fs::path& key) {
    ServerOptions o;
    o.config = *ParseJob("model: {name: mlp}\ntls: {cert: " + cert.string() +
                                     ", key: " + key.string() + "}\n",
                                 "");
    o.evaluate = false;
    o.listen = "127.0.0.1:0";
    auto s = Server::Create(o);
    if (!s.ok()) return s.status();
    return (*s)->Start();
  };
  const Status mismatch = start(dir_ / "server.crt", dir_ / "clients" / "alice.key");
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("alice.key does not match the certificate"), std::string::npos)
      << mismatch;
  const fs::path garbage = dir_ / "garbage.crt";
  ASSERT_TRUE(WriteFileAtomic(garbage.string(), "-----BEGIN CERTIFICATE-----\nnot base64!\n"
                                                "-----END CERTIFICATE-----\n")
                  .ok());
  const Status bad_cert = start(garbage, dir_ / "server.key");
  EXPECT_EQ(bad_cert.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_cert.message().find("garbage.crt"), std::string::npos) << bad_cert;
  ASSERT_TRUE(WriteFileAtomic(garbage.string(), "hello").ok());
  EXPECT_NE(start(garbage, dir_ / "server.key").message().find("holds no PEM certificate"),
            std::string::npos);
  EXPECT_TRUE(start(dir_ / "server.crt", dir_ / "server.key").ok());
}

// A client refused for good (another device's name under mutual TLS, a missing bearer
// token) prints the server's reason and stops at once instead of reconnecting.
TEST_F(TlsTest, TheClientReportsAPermanentRefusalAndStops) {
  const std::string token = "0123456789abcdef0123";
  std::ofstream(dir_ / "token") << token << "\n";
  StartServer("run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\nauth: {token_file: " +
              (dir_ / "token").string() + "}\n");
  const Dataset data = *LoadFashionMnist("/usr/share/datasets/fashion-mnist", true, 100);
  auto run = [&](const std::string& name, const std::string& with_token) {
    ClientOptions o;
    o.server = address_;
    o.name = name;
    o.train = data;
    o.token = with_token;
    o.tls_ca = (dir_ / "ca.crt").string();
    o.tls_cert = (dir_ / "clients" / "alice.crt").string();
    o.tls_key = (dir_ / "clients" / "alice.key").string();
    o.give_up_after_s = 600;  // a retry loop would hold the test for ten minutes
    return Client(std::move(o)).Run();
  };
  const Status wrong_name = run("bob", token);
  EXPECT_EQ(wrong_name.code(), absl::StatusCode::kPermissionDenied) << wrong_name;
  EXPECT_NE(wrong_name.message().find("certificate is for 'alice'"), std::string::npos)
      << wrong_name;
  const Status no_token = run("alice", "");
  EXPECT_EQ(no_token.code(), absl::StatusCode::kUnauthenticated) << no_token;
}

// A second server on a port in use fails instead of sharing the port (SO_REUSEPORT).
TEST(ListenTest, ASecondServerOnAPortInUseFails) {
  ServerOptions o;
  o.config = *ParseJob("model: {name: mlp}\n", "");
  o.evaluate = false;
  o.insecure = true;
  o.listen = "127.0.0.1:0";
  auto first = Server::Create(o);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->Start().ok());
  o.listen = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = Server::Create(o);
  ASSERT_TRUE(second.ok());
  const Status s = (*second)->Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("address in use"), std::string::npos) << s;
}

// A device written into tls.revoked loses its live session within a reload period and
// cannot join again; the others stay.
TEST_F(TlsTest, RevocationEndsALiveSession) {
  const fs::path revoked = dir_ / "revoked.txt";
  ASSERT_TRUE(WriteFileAtomic(revoked.string(), "# revoked devices\n").ok());
  ServerOptions o;
  auto config = ParseJob(
      "run: {rounds: 1}\nmodel: {name: mlp}\nclients: {min: 5}\n"
      "tls: {cert: " + (dir_ / "server.crt").string() + ", key: " + (dir_ / "server.key").string() +
          ", ca: " + (dir_ / "ca.crt").string() + ", mutual: true, reload_s: 1, revoked: " +
          revoked.string() + "}\n",
      "");
  ASSERT_TRUE(config.ok()) << config.status();
  o.config = *config;
  o.clock = clock_;
  StartServerWith(std::move(o));
  TestPeer alice(address_, 10, Credentials(dir_, "alice"));
  TestPeer bob(address_, 10, Credentials(dir_, "bob"));
  ASSERT_TRUE(alice.Join("alice"));
  ASSERT_TRUE(bob.Join("bob"));
  ASSERT_TRUE(WriteFileAtomic(revoked.string(), "# revoked devices\nalice\n").ok());
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address_, Credentials(dir_, "bob")));
  int connected = 2;
  for (int i = 0; i < 100 && connected != 1; ++i) {
    clock_->AdvanceSeconds(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    grpc::ClientContext ctx;
    v1::StatusReply reply;
    ASSERT_TRUE(stub->GetStatus(&ctx, v1::StatusRequest(), &reply).ok());
    connected = reply.connected_clients();
  }
  EXPECT_EQ(connected, 1) << "alice's session was not ended";
  const auto again = TryJoin(address_, Credentials(dir_, "alice"), "alice");
  EXPECT_EQ(again.error_code(), StatusCode::PERMISSION_DENIED) << again.error_message();
  EXPECT_NE(again.error_message().find("revoked"), std::string::npos);
  EXPECT_TRUE(TryJoin(address_, Credentials(dir_, "bob"), "bob").ok());
}

}  // namespace
}  // namespace cleave
