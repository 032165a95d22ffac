// The job API (proto/cleave/v1/jobs.proto) over a Daemon: each call's identity (a bearer
// token the policy names, else the CN of a verified client certificate), its request
// turned into the daemon's operation, and the answer into the reply.
#pragma once

#include "cleave/v1/jobs.grpc.pb.h"

namespace cleave {

class Daemon;

class JobService final : public v1::Jobs::Service {
 public:
  explicit JobService(Daemon* daemon) : daemon_(daemon) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitJobRequest* req, v1::JobInfo* reply) override;
  grpc::Status List(grpc::ServerContext* ctx, const v1::ListJobsRequest* req, v1::ListJobsReply* reply) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::JobInfo* reply) override;
  grpc::Status Cancel(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::JobInfo* reply) override;
  grpc::Status Logs(grpc::ServerContext* ctx, const v1::JobLogsRequest* req,
                    grpc::ServerWriter<v1::JobLogLine>* writer) override;
  grpc::Status Download(grpc::ServerContext* ctx, const v1::DownloadJobRequest* req,
                        grpc::ServerWriter<v1::JobFileChunk>* writer) override;
  grpc::Status Audit(grpc::ServerContext* ctx, const v1::AuditRequest* req, v1::AuditReply* reply) override;

 private:
  // The caller's identity; UNAUTHENTICATED when it has none.
  grpc::Status Identify(grpc::ServerContext* ctx, std::string* who) const;
  // A unary call: `op` (the daemon's operation) run for the caller's identity, its result
  // written into the reply by `fill`; an error of either as the call's status.
  template <typename Op, typename Fill>
  grpc::Status Answer(grpc::ServerContext* ctx, Op op, Fill fill) const;

  Daemon* const daemon_;
};

}  // namespace cleave
