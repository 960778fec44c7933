// libFuzzer target: the internal services' messages as a credential holder could send them.
// The first byte picks the message: a worker's HandshakeRequest (checked against the model
// config, as the worker does before it touches its group), a StepRequest (sizes and KV
// slots), or a store entry (the coordinator's bounded store).
#include "common/comm/kv_store.h"
#include "proto/moeshard.pb.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "worker/service/request_limits.h"

namespace {

moeshard::ModelConfig Config() {
  moeshard::ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moeshard::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const moeshard::ModelConfig config = Config();
  static const moeshard::WorkerLimits limits = moeshard::DefaultWorkerLimits(true);
  static moeshard::InMemoryKvStore store;
  const uint8_t* body = data + 1;
  const int n = static_cast<int>(size - 1);
  switch (data[0] % 3) {
    case 0: {
      moeshard::v1::HandshakeRequest req;
      if (req.ParseFromArray(body, n)) (void)moeshard::ValidateHandshake(req, config, limits);
      break;
    }
    case 1: {
      moeshard::v1::StepRequest req;
      if (req.ParseFromArray(body, n)) (void)moeshard::ValidateStep(req, 1 + data[0] / 3 % 64, limits);
      break;
    }
    default: {
      moeshard::v1::StoreSetRequest req;
      if (req.ParseFromArray(body, n)) {
        (void)store.Set(req.key(), req.value());
        (void)store.Get(req.key(), std::chrono::milliseconds(0));
      }
      break;
    }
  }
  return 0;
}
