#include "worker/service/worker_service.h"

#include <chrono>
#include <cstdio>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "common/thread_pool.h"
#include "proto/proto_convert.h"
#include "proto/status_convert.h"
#include "common/comm/gloo_communicator.h"
#include "common/comm/nccl_communicator.h"
#include "common/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "worker/service/grpc_kv_store.h"
#include "worker/service/instrumented_communicator.h"
#include "worker/service/request_limits.h"
#include "common/security/internal_grpc.h"

namespace moeshard {
namespace {

}  // namespace

WorkerServiceImpl::WorkerServiceImpl(WorkerOptions options, std::shared_ptr<prometheus::Registry> registry)
    : options_(std::move(options)),
      registry_(std::move(registry)),
      limits_(DefaultWorkerLimits(options_.runner.device == Device::kCpu)) {
  step_seconds_ = &prometheus::BuildHistogram().Name(MetricName("worker_step_seconds"))
                       .Help("Time of one step on this worker, by phase").Register(*registry_);
  auto& steps = prometheus::BuildCounter().Name(MetricName("worker_steps_total")).Help("Steps run, by result").Register(*registry_);
  steps_ok_ = &steps.Add({{"result", "ok"}});
  steps_failed_ = &steps.Add({{"result", "error"}});
  auto& mem = prometheus::BuildGauge().Name(MetricName("worker_memory_bytes"))
                  .Help("Memory this worker holds, by kind (weights are memory-mapped)").Register(*registry_);
  weight_bytes_ = &mem.Add({{"kind", "weights"}});
  kv_bytes_ = &mem.Add({{"kind", "kv_cache"}});
}

WorkerServiceImpl::~WorkerServiceImpl() {
  if (comm_) comm_->Abort();
}

grpc::Status WorkerServiceImpl::Handshake(grpc::ServerContext* ctx, const v1::HandshakeRequest* req, v1::HandshakeReply* rep) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  std::lock_guard<std::mutex> l(mu_);
  rep->set_protocol_version(kProtocolVersion);
  absl::Status st = DoHandshake(*req, rep);
  if (!st.ok()) {
    rep->set_error(std::string(st.message()));
    rep->set_error_code(static_cast<int32_t>(st.code()));
    std::fprintf(stderr, "moeshard-worker: handshake refused: %s\n", std::string(st.message()).c_str());
  }
  return grpc::Status::OK;
}

// Publishes this worker's (host, GPU bus id) and reads every rank's: true when no two
// ranks share a GPU (NCCL allows one rank per GPU).
absl::StatusOr<bool> WorkerServiceImpl::EveryRankHasItsGpu(KvStore& store, const v1::HandshakeRequest& req,
                                                         std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(std::string bus, GpuBusId(options_.runner.gpu_index));
  const std::string prefix = absl::StrCat(req.group_id(), "/gpu/");
  RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, req.worker_index()), absl::StrCat(options_.host, "|", bus)));
  std::set<std::string> seen;
  for (int r = 0; r < req.num_workers(); ++r) {
    ASSIGN_OR_RETURN(std::string v, store.Get(absl::StrCat(prefix, r), timeout));
    if (!seen.insert(v).second) return false;
  }
  return true;
}

absl::Status WorkerServiceImpl::DoHandshake(const v1::HandshakeRequest& req, v1::HandshakeReply* rep) {
  if (req.protocol_version() != kProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("protocol version ", req.protocol_version(), " (this worker speaks ", kProtocolVersion, ")"));
  }
  if (!model_) {
    ASSIGN_OR_RETURN(LoadedModel m, LoadModel(options_.model_path, /*load_tokenizer=*/false));
    model_ = std::make_unique<LoadedModel>(std::move(m));
  }
  // Checked in full before the live group is touched: a refused handshake changes nothing.
  RETURN_IF_ERROR(ValidateHandshake(req, model_->config, limits_));
  // A new handshake replaces the previous group (the coordinator restarted it).
  if (comm_) comm_->Abort();
  if (tp_comm_) tp_comm_->Abort();
  runner_.reset();
  tp_comm_.reset();
  comm_.reset();
  ready_ = false;
  broken_.clear();
  samplers_.Clear();
  follow_.Clear();
  const v1::ShardProto& sp = req.shard();
  ShardSpec shard{sp.layer_begin(), sp.layer_end(), sp.tp_rank(), sp.tp_size(), sp.first_stage(), sp.last_stage()};
  auto timeout = std::chrono::milliseconds(req.timeout_ms() > 0 ? req.timeout_ms() : 60000);
  GrpcKvStore store(req.store_address());
  ASSIGN_OR_RETURN(auto comm, CreateGlooCommunicator(&store, req.group_id(), req.worker_index(), req.num_workers(),
                                                     options_.host, timeout));
  comm_ = std::make_unique<InstrumentedCommunicator>(std::move(comm), *registry_);
  comm_->set_timeout(timeout);
  RunnerOptions ro = options_.runner;
  ro.num_kv_blocks = req.num_kv_blocks();
  ro.block_size = req.block_size();
  ro.num_sliding_kv_blocks = req.num_sliding_kv_blocks();
  Communicator* tp = shard.tp_size > 1 ? comm_.get() : nullptr;
  if (tp != nullptr && ro.device == Device::kCuda && options_.tp_comm != "host") {
    ASSIGN_OR_RETURN(bool own_gpus, EveryRankHasItsGpu(store, req, timeout));
    if (own_gpus) {
      const int pp_rank = req.worker_index() / shard.tp_size;
      ASSIGN_OR_RETURN(auto nccl, CreateNcclCommunicator(&store, absl::StrCat(req.group_id(), "/tp", pp_rank),
                                                         shard.tp_rank, shard.tp_size, ro.gpu_index, timeout));
      tp_comm_ = std::make_unique<InstrumentedCommunicator>(std::move(nccl), *registry_);
      tp = tp_comm_.get();
    } else if (options_.tp_comm == "nccl") {
      return absl::FailedPreconditionError("--tp-comm nccl needs one GPU per worker; some workers share a GPU");
    }
  }
  ASSIGN_OR_RETURN(runner_, ModelRunner::Create(model_->config, *model_->source, shard, ro, tp));
  gpu_runner_ = ro.device == Device::kCuda;
  shard_ = sp;
  block_size_ = req.block_size();
  kv_owners_.Reset(req.block_size(), req.num_kv_blocks());
  sliding_owners_.Reset(req.block_size(), runner_->sliding_pool() ? req.num_sliding_kv_blocks() : 0,
                        model_->config.sliding_window);
  next_step_ = 0;
  ready_ = true;
  kv_bytes_->Set(static_cast<double>(runner_->kv_bytes()));
  rep->set_weight_bytes(0);
  std::fprintf(stderr, "moeshard-worker: worker %d/%d ready, %s, %s%s\n", req.worker_index(), req.num_workers(),
               shard.DebugString().c_str(), runner_->backend().c_str(),
               tp_comm_ ? ", all-reduce over NCCL" : tp ? ", all-reduce staged through host memory" : "");
  return absl::OkStatus();
}

grpc::Status WorkerServiceImpl::Step(grpc::ServerContext* ctx, const v1::StepRequest* req, v1::StepReply* rep) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  std::unique_lock<std::mutex> l(mu_);
  if (!ready_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "worker has no plan: handshake first");
  // Steps run in step_id order on every worker, so that the communicator calls match (a step
  // whose turn has passed is refused at once).
  bool turn = cv_.wait_for(l, std::chrono::seconds(600), [&] {
    return next_step_ >= req->step_id() || !ready_ || ctx->IsCancelled();
  });
  if (!turn || !ready_ || next_step_ != req->step_id()) {
    return grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("step ", req->step_id(), " out of order (next is ", next_step_, ")"));
  }
  // Lookahead chunks get their tokens, and tables sent as deltas (ChunkProto.table_start)
  // become whole tables from this worker's own record first: every check below, and the step,
  // see real tokens and whole tables.
  v1::StepRequest whole;
  if (absl::Status follows = broken_.empty() ? ResolveFollows(&req, &whole) : absl::OkStatus(); !follows.ok()) {
    steps_failed_->Increment();
    std::fprintf(stderr, "moeshard-worker: step %ld refused: %s\n", static_cast<long>(req->step_id()),
                 std::string(follows.message()).c_str());
    return ToGrpcStatus(follows);
  }
  if (KvOwnership::HasDeltas(*req)) {
    if (req != &whole) whole = *req;
    absl::Status expanded = broken_.empty() ? kv_owners_.ExpandTables(&whole) : absl::OkStatus();
    if (expanded.ok() && broken_.empty()) expanded = sliding_owners_.ExpandTables(&whole);
    if (!expanded.ok()) {
      steps_failed_->Increment();
      std::fprintf(stderr, "moeshard-worker: step %ld refused: %s\n", static_cast<long>(req->step_id()),
                   std::string(expanded.message()).c_str());
      return ToGrpcStatus(expanded);
    }
    req = &whole;
  }
  if (broken_.empty()) {
    // Checked before it acts: a refused step changes nothing (its step id stays free, the
    // group stays up), so a rogue step cannot stall or break the coordinator's.
    absl::Status valid = ValidateStep(*req, block_size_, limits_);
    if (valid.ok()) valid = kv_owners_.Check(*req);
    if (valid.ok()) valid = sliding_owners_.Check(*req);
    if (!valid.ok()) {
      steps_failed_->Increment();
      std::fprintf(stderr, "moeshard-worker: step %ld refused: %s\n", static_cast<long>(req->step_id()),
                   std::string(valid.message()).c_str());
      return ToGrpcStatus(valid);
    }
    kv_owners_.Commit(*req);
    sliding_owners_.Commit(*req);
  }
  absl::Status st = broken_.empty() ? DoStep(*req, rep) : absl::AbortedError(broken_);
  if (!st.ok() && broken_.empty()) {
    broken_ = absl::StrCat("step ", req->step_id(), " failed: ", st.message());
    if (comm_) comm_->Abort();
  }
  (st.ok() ? steps_ok_ : steps_failed_)->Increment();
  ++next_step_;
  cv_.notify_all();
  return ToGrpcStatus(st);
}

absl::Status WorkerServiceImpl::ResolveFollows(const v1::StepRequest** req, v1::StepRequest* whole) const {
  const v1::StepRequest& r = **req;
  bool any = false;
  for (const auto& c : r.chunks()) any = any || c.follow();
  if (!any) return absl::OkStatus();
  if (!shard_.first_stage() || !shard_.last_stage() || shard_.tp_size() != 1) {
    return absl::FailedPreconditionError("a lookahead (follow) chunk needs a worker that holds the whole model");
  }
  *whole = r;
  for (auto& c : *whole->mutable_chunks()) {
    if (!c.follow()) continue;
    if (c.tokens_size() != 1 || !c.sample()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", c.seq_id(), ": a follow chunk is one sampled token"));
    }
    ASSIGN_OR_RETURN(int32_t token, follow_.Resolve(r.step_id(), c.seq_id()));
    c.set_tokens(0, token);
  }
  *req = whole;
  return absl::OkStatus();
}

absl::Status WorkerServiceImpl::DoStep(const v1::StepRequest& req, v1::StepReply* rep) {
  auto t0 = std::chrono::steady_clock::now();
  auto phase = [&](const char* name, std::chrono::steady_clock::time_point since) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    step_seconds_->Add({{"phase", name}}, LatencyBuckets()).Observe(s);
  };
  for (int64_t id : req.released_seqs()) {
    samplers_.Release(id);
    follow_.Forget(id);
  }
  for (int64_t id : req.preempted_seqs()) follow_.Forget(id);
  if (req.chunks().empty()) return absl::OkStatus();
  std::vector<SeqChunk> batch;
  int64_t T = 0;
  for (const auto& c : req.chunks()) {
    SeqChunk ch;
    ch.tokens.assign(c.tokens().begin(), c.tokens().end());
    ch.start_pos = c.start_pos();
    ch.block_table.assign(c.block_table().begin(), c.block_table().end());
    ch.sliding_table.assign(c.sliding_table().begin(), c.sliding_table().end());
    T += ch.tokens.size();
    batch.push_back(std::move(ch));
  }
  RETURN_IF_ERROR(runner_->ValidateBatch(batch));
  const int64_t H = runner_->config().hidden_size;
  const int tp = shard_.tp_size(), pp_rank = shard_.pp_rank();
  std::vector<float> hidden, logits;
  // Rows that sample, drawn by their sequences' samplers, appended in request order.
  const bool samples = shard_.last_stage() && shard_.tp_rank() == 0;
  std::vector<RowDraw> rows;
  bool greedy = true;  // every row greedy, without logprobs
  for (int i = 0; samples && i < req.chunks_size(); ++i) {
    const auto& c = req.chunks(i);
    if (!c.sample()) continue;
    rows.push_back({i, c.seq_id(), SamplingFromProto(c.sampling()), c.start_pos() + c.tokens_size(), c.logprobs(),
                    c.top_logprobs()});
    greedy = greedy && rows.back().sampling.temperature <= 0.f && !c.logprobs() && c.top_logprobs() == 0;
  }
  std::vector<int32_t> argmax;  // with `greedy`: each row's token, found by the runner
  // A shard with the whole model (one worker, or a tensor-parallel rank) runs the step as one
  // Forward: hidden states stay on the device and decode steps replay as CUDA graphs. On the
  // CPU the ranks beyond 0 would compute the LM head for nothing, so they keep the split path.
  const bool whole = shard_.first_stage() && shard_.last_stage() && (tp == 1 || gpu_runner_);
  greedy = greedy && whole && samples;
  std::chrono::steady_clock::time_point th;
  if (whole) {
    auto tf = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(greedy ? runner_->ForwardArgMax(batch, &argmax) : runner_->Forward(batch, &logits));
    phase("forward", tf);
    th = std::chrono::steady_clock::now();
  } else {
    auto tp0 = std::chrono::steady_clock::now();
    if (shard_.first_stage()) {
      RETURN_IF_ERROR(runner_->Embed(batch, &hidden));
    } else {
      hidden.resize(T * H);
      RETURN_IF_ERROR(comm_->Recv(hidden.data(), hidden.size() * sizeof(float), (pp_rank - 1) * tp + shard_.tp_rank()));
      phase("recv", tp0);
    }
    auto tl = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(runner_->RunLayers(batch, &hidden));
    phase("layers", tl);
    if (!shard_.last_stage()) {
      auto ts = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(comm_->Send(hidden.data(), hidden.size() * sizeof(float), (pp_rank + 1) * tp + shard_.tp_rank()));
      phase("send", ts);
    } else if (shard_.tp_rank() == 0) {
      th = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(runner_->Head(batch, hidden, &logits));
    }
  }
  if (samples) {
    std::vector<RowSample> drawn(rows.size());
    if (greedy) {
      if (argmax.size() != static_cast<size_t>(req.chunks_size())) return absl::InternalError("argmax rows");
      for (size_t i = 0; i < rows.size(); ++i) drawn[i].token = argmax[rows[i].row];
    } else {
      drawn = samplers_.Sample(rows, logits.data(), runner_->config().vocab_size);
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      rep->add_seq_ids(rows[i].seq_id);
      follow_.Record(req.step_id(), rows[i].seq_id, drawn[i].token);
      v1::TokenOutput* out = rep->add_tokens();
      out->set_token_id(drawn[i].token);
      if (rows[i].logprobs || rows[i].top_logprobs > 0) out->set_logprob(drawn[i].logprob);
      for (const auto& [id, lp] : drawn[i].top) {
        auto* t = out->add_top();
        t->set_token_id(id);
        t->set_logprob(lp);
      }
    }
    phase(whole ? "sample" : "head_sample", th);
  }
  phase("total", t0);
  rep->set_compute_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return absl::OkStatus();
}

}  // namespace moeshard
