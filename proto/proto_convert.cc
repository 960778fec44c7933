#include "proto/proto_convert.h"

namespace moeshard {

SamplingParams SamplingFromProto(const v1::SamplingOptions& s) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p() > 0 ? s.top_p() : 1.f;
  p.min_p = s.min_p();
  p.has_seed = s.has_seed();
  p.seed = s.seed();
  return p;
}

void SamplingToProto(const SamplingParams& p, v1::SamplingOptions* s) {
  s->set_temperature(p.temperature);
  s->set_top_k(p.top_k);
  s->set_top_p(p.top_p);
  s->set_min_p(p.min_p);
  if (p.has_seed) s->set_seed(p.seed);
}

}  // namespace moeshard
