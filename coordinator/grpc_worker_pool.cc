#include "coordinator/grpc_worker_pool.h"

#include <grpcpp/grpcpp.h>

#include <future>

#include "absl/strings/str_cat.h"
#include "common/security/internal_grpc.h"
#include "proto/proto_convert.h"

namespace moeshard {
namespace {

// Each chunk's table from what the workers hold on (table_deltas.h).
void StepToProto(const StepRequest& r, const TableDeltas& deltas, v1::StepRequest* p) {
  p->set_step_id(r.step_id);
  for (const ChunkPlan& c : r.chunks) {
    v1::ChunkProto* cp = p->add_chunks();
    cp->set_seq_id(c.seq_id);
    cp->set_start_pos(c.start_pos);
    cp->mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
    const int64_t held = deltas.Held(r, c);
    cp->set_table_start(static_cast<int32_t>(held));
    cp->mutable_block_table()->Add(c.block_table.begin() + held, c.block_table.end());
    if (!c.sliding_table.empty()) {
      const int64_t sliding_held = deltas.HeldSliding(r, c);
      cp->set_sliding_table_start(static_cast<int32_t>(sliding_held));
      cp->mutable_sliding_table()->Add(c.sliding_table.begin() + sliding_held, c.sliding_table.end());
    }
    cp->mutable_cached_prefix()->Add(c.cached_prefix.begin(), c.cached_prefix.end());
    cp->set_sample(c.sample);
    cp->set_follow(c.follow);
    if (c.sample) {
      SamplingToProto(c.sampling, cp->mutable_sampling());
      cp->set_logprobs(c.logprobs);
      cp->set_top_logprobs(c.top_logprobs);
    }
  }
  p->mutable_released_seqs()->Add(r.released_seqs.begin(), r.released_seqs.end());
  p->mutable_preempted_seqs()->Add(r.preempted_seqs.begin(), r.preempted_seqs.end());
}

StepResult StepFromProto(const v1::StepReply& rep) {
  StepResult r;
  for (int i = 0; i < rep.seq_ids_size() && i < rep.tokens_size(); ++i) {
    const v1::TokenOutput& t = rep.tokens(i);
    TokenOutput o;
    o.token_id = t.token_id();
    o.logprob = t.logprob();
    for (const auto& alt : t.top()) o.top.emplace_back(alt.token_id(), alt.logprob());
    r.tokens.emplace_back(rep.seq_ids(i), std::move(o));
  }
  return r;
}

}  // namespace

GrpcWorkerPool::GrpcWorkerPool(std::vector<std::string> addresses) : addresses_(std::move(addresses)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  // A restarted worker comes back on the same port: reconnect within a second.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  for (const auto& a : addresses_) {
    stubs_.push_back(v1::Worker::NewStub(CreateInternalChannel(a, args)));
  }
}

absl::Status GrpcWorkerPool::Ping(std::chrono::milliseconds deadline) {
  std::vector<std::future<grpc::Status>> done;
  for (int w = 0; w < size(); ++w) {
    done.push_back(std::async(std::launch::async, [&, w] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + deadline);
      ctx.set_wait_for_ready(true);  // a restarting worker gets the whole deadline to come up
      v1::PingReply rep;
      return stubs_[w]->Ping(&ctx, v1::PingRequest(), &rep);
    }));
  }
  absl::Status first = absl::OkStatus();
  for (int w = 0; w < size(); ++w) {
    grpc::Status st = done[w].get();
    if (!st.ok() && first.ok()) {
      first = absl::UnavailableError(absl::StrCat("worker ", w, " (", addresses_[w], ") does not answer a ping within ",
                                                  deadline.count(), " ms: ", st.error_message()));
    }
  }
  return first;
}

absl::Status GrpcWorkerPool::Handshake(const Plan& plan, const HandshakeOptions& o) {
  if (plan.num_workers != size()) {
    return absl::InvalidArgumentError(absl::StrCat("plan is for ", plan.num_workers, " workers, ", size(), " given"));
  }
  std::vector<std::future<absl::Status>> done;
  for (int w = 0; w < size(); ++w) {
    done.push_back(std::async(std::launch::async, [&, w]() -> absl::Status {
      const ShardSpec& s = plan.shards[w];
      v1::HandshakeRequest req;
      req.set_protocol_version(kProtocolVersion);
      req.set_model_fingerprint(o.model_fingerprint);
      req.set_worker_index(w);
      req.set_num_workers(size());
      auto* sp = req.mutable_shard();
      sp->set_layer_begin(s.layer_begin);
      sp->set_layer_end(s.layer_end);
      sp->set_tp_rank(s.tp_rank);
      sp->set_tp_size(s.tp_size);
      sp->set_first_stage(s.first_stage);
      sp->set_last_stage(s.last_stage);
      sp->set_pp_rank(w / plan.tp_size);
      sp->set_pp_size(plan.pp_size);
      req.set_store_address(o.store_address);
      req.set_group_id(o.group_id);
      req.set_num_kv_blocks(o.num_kv_blocks);
      req.set_num_sliding_kv_blocks(o.num_sliding_kv_blocks);
      req.set_block_size(o.block_size);
      req.set_timeout_ms(o.timeout_ms);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(o.timeout_ms + 600000));
      ctx.set_wait_for_ready(true);
      v1::HandshakeReply rep;
      grpc::Status st = stubs_[w]->Handshake(&ctx, req, &rep);
      if (!st.ok()) return absl::UnavailableError(absl::StrCat("worker ", w, " (", addresses_[w], "): ", st.error_message()));
      if (rep.protocol_version() != kProtocolVersion) {
        return absl::FailedPreconditionError(absl::StrCat("worker ", w, " speaks protocol ", rep.protocol_version()));
      }
      if (!rep.error().empty()) {
        // Workers that predate error_code send 0: treat the refusal as one that may pass.
        const auto code = rep.error_code() == 0 ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(rep.error_code());
        return absl::Status(code, absl::StrCat("worker ", w, " (", addresses_[w], ") refused the handshake: ", rep.error()));
      }
      return absl::OkStatus();
    }));
  }
  absl::Status first = absl::OkStatus();
  for (auto& f : done) {
    absl::Status st = f.get();
    if (first.ok() && !st.ok()) first = st;
  }
  for (int w = 0; w < size(); ++w) {
    if (plan.shards[w].last_stage && plan.shards[w].tp_rank == 0) sampler_worker_ = w;
  }
  follows_ = first.ok() && size() == 1 && plan.shards.size() == 1 && plan.shards[0].first_stage &&
             plan.shards[0].last_stage && plan.shards[0].tp_size == 1;
  deltas_.Reset(first.ok() ? o.block_size : 0);  // the workers start from empty records
  return first;
}

absl::StatusOr<StepResult> GrpcWorkerPool::Step(const StepRequest& step, std::chrono::milliseconds deadline) {
  v1::StepRequest request;
  StepToProto(step, deltas_, &request);
  std::vector<v1::StepReply> replies(size());
  auto call = [&](int w) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    return stubs_[w]->Step(&ctx, request, &replies[w]);
  };
  // One worker: the call on this thread (no thread started per step); several: one each, at once.
  std::vector<std::future<grpc::Status>> done;
  std::vector<grpc::Status> status(size());
  if (size() == 1) {
    status[0] = call(0);
  } else {
    for (int w = 0; w < size(); ++w) done.push_back(std::async(std::launch::async, call, w));
    for (int w = 0; w < size(); ++w) status[w] = done[w].get();
  }
  absl::Status first = absl::OkStatus();
  for (int w = 0; w < size(); ++w) {
    const grpc::Status& st = status[w];
    if (!st.ok() && first.ok()) {
      const std::string why = st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                                  ? absl::StrCat("missed the step deadline of ", deadline.count(), " ms (hung?)")
                                  : st.error_message();
      first = absl::UnavailableError(absl::StrCat("worker ", w, " (", addresses_[w], ") step ", request.step_id(), ": ", why));
    }
  }
  if (!first.ok()) {
    deltas_.Forget();
    return first;
  }
  deltas_.Committed(step);
  return StepFromProto(replies[sampler_worker_]);
}

}  // namespace moeshard
