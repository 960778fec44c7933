#include "coordinator/wire.h"

#include "proto/proto_convert.h"

namespace moeshard {

EngineRequest FromProto(const v1::SeqRequest& r) {
  EngineRequest e;
  e.request_id = r.request_id();
  e.prompt_ids.assign(r.prompt_ids().begin(), r.prompt_ids().end());
  e.max_tokens = r.max_tokens();
  e.sampling = SamplingFromProto(r.sampling());
  e.stop_token_ids.assign(r.stop_token_ids().begin(), r.stop_token_ids().end());
  e.ignore_eos = r.ignore_eos();
  e.logprobs = r.logprobs();
  e.top_logprobs = r.top_logprobs();
  return e;
}

void ToProto(const SeqUpdate& u, v1::SeqUpdate* m) {
  for (const TokenOutput& t : u.tokens) {
    v1::TokenOutput* o = m->add_tokens();
    o->set_token_id(t.token_id);
    o->set_logprob(t.logprob);
    for (const auto& [id, lp] : t.top) {
      v1::TopLogprob* alt = o->add_top();
      alt->set_token_id(id);
      alt->set_logprob(lp);
    }
  }
  m->set_finish_reason(u.finish_reason);  // the error stays in the coordinator's log
  if (u.cached_tokens >= 0) {
    m->set_cached_tokens(u.cached_tokens);
    m->set_prompt_tokens(u.prompt_tokens);
  }
}

void ToProto(const EngineStatus& s, v1::StatusReply* m) {
  m->set_ready(s.ready);
  m->set_outstanding_tokens(s.outstanding_tokens);
  m->set_num_running(s.num_running);
  m->set_num_waiting(s.num_waiting);
  m->set_max_model_len(s.max_model_len);
  m->set_model(s.model);
  m->set_vocab_size(static_cast<int32_t>(s.vocab_size));
  m->set_kv_usage(s.kv_usage);
  m->set_queue_full(s.queue_full);
  m->set_error(s.error);
}

}  // namespace moeshard
