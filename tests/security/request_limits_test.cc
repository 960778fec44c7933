// The worker's checks of a handshake and a step (worker/service/request_limits.h), with
// sizes computed by hand.
#include "worker/service/request_limits.h"

#include <functional>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

ModelConfig Config() {
  ModelConfig c;
  c.model_type = "qwen3_moe";
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

v1::HandshakeRequest Good(const ModelConfig& c) {
  v1::HandshakeRequest r;
  r.set_protocol_version(1);
  r.set_model_fingerprint(c.Fingerprint());
  r.set_worker_index(1);
  r.set_num_workers(2);
  r.mutable_shard()->set_layer_begin(2);
  r.mutable_shard()->set_layer_end(4);
  r.mutable_shard()->set_tp_size(1);
  r.mutable_shard()->set_pp_rank(1);
  r.mutable_shard()->set_pp_size(2);
  r.set_store_address("127.0.0.1:7000");
  r.set_group_id("g1");
  r.set_num_kv_blocks(100);
  r.set_block_size(16);
  r.set_timeout_ms(60000);
  return r;
}

TEST(ValidateHandshakeTest, AcceptsAPlanAndRefusesEachBadField) {
  const ModelConfig c = Config();
  WorkerLimits limits;
  // 2 layers x K and V x 2 heads x 16 dims x 4 bytes = 512 bytes a token; 100 x 16 tokens.
  limits.max_kv_bytes = 512 * 1600;
  EXPECT_TRUE(ValidateHandshake(Good(c), c, limits).ok());
  std::vector<std::pair<const char*, std::function<void(v1::HandshakeRequest&)>>> bad = {
      {"fingerprint", [](auto& r) { r.set_model_fingerprint("other"); }},
      {"index", [](auto& r) { r.set_worker_index(2); }},
      {"workers", [](auto& r) { r.set_num_workers(100000); }},
      {"layers", [](auto& r) { r.mutable_shard()->set_layer_end(5); }},
      {"empty layers", [](auto& r) { r.mutable_shard()->set_layer_begin(4); }},
      {"tp rank", [](auto& r) { r.mutable_shard()->set_tp_rank(1); }},
      {"pp rank", [](auto& r) { r.mutable_shard()->set_pp_rank(2); }},
      {"group", [](auto& r) { r.set_group_id(""); }},
      {"timeout", [](auto& r) { r.set_timeout_ms(-1); }},
      {"block size", [](auto& r) { r.set_block_size(0); }},
      {"no blocks", [](auto& r) { r.set_num_kv_blocks(0); }},
      {"kv bytes", [](auto& r) { r.set_num_kv_blocks(101); }},
  };
  for (auto& [name, mutate] : bad) {
    v1::HandshakeRequest r = Good(c);
    mutate(r);
    absl::Status st = ValidateHandshake(r, c, limits);
    EXPECT_FALSE(st.ok()) << name;
    EXPECT_EQ(std::string(st.message()).find(c.Fingerprint()), std::string::npos) << name << ": " << st;
  }
}

TEST(ValidateHandshakeTest, TheDefaultLimitStopsAHugeKvPool) {
  const ModelConfig c = Config();
  v1::HandshakeRequest r = Good(c);
  r.set_num_kv_blocks(int64_t{1} << 40);
  EXPECT_EQ(ValidateHandshake(r, c, DefaultWorkerLimits(true)).code(), absl::StatusCode::kResourceExhausted);
}

// A pool past int64 bytes (found by internal_proto_fuzz: the message's byte count was cast from a
// double out of range, undefined behaviour) is refused with the count written out.
TEST(ValidateHandshakeTest, APoolPastInt64BytesIsRefusedAndNamed) {
  const ModelConfig c = Config();
  v1::HandshakeRequest r = Good(c);
  r.set_num_kv_blocks(int64_t{1} << 62);
  const absl::Status s = ValidateHandshake(r, c, DefaultWorkerLimits(true));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(s.message()).find("4611686018427387904 KV blocks need up to "), std::string::npos)
      << s.message();
}

v1::ChunkProto ChunkOfLength(int64_t seq, int64_t start, int n, std::vector<int32_t> blocks) {
  v1::ChunkProto c;
  c.set_seq_id(seq);
  c.set_start_pos(start);
  for (int i = 0; i < n; ++i) c.add_tokens(1);
  for (int32_t b : blocks) c.add_block_table(b);
  return c;
}

TEST(ValidateStepTest, RefusesSharedWriteSlotsAndRepeatedSequences) {
  WorkerLimits limits;
  v1::StepRequest ok;
  *ok.add_chunks() = ChunkOfLength(1, 0, 20, {0, 1});
  *ok.add_chunks() = ChunkOfLength(2, 16, 1, {0, 2});  // reads block 0 (a shared prefix), writes block 2
  EXPECT_TRUE(ValidateStep(ok, 16, limits).ok());
  v1::StepRequest steal;
  *steal.add_chunks() = ChunkOfLength(1, 17, 1, {0, 1});
  *steal.add_chunks() = ChunkOfLength(2, 17, 1, {5, 1});  // writes seq 1's slot 1 of block 1
  EXPECT_FALSE(ValidateStep(steal, 16, limits).ok());
  v1::StepRequest twice;
  *twice.add_chunks() = ChunkOfLength(1, 0, 1, {0});
  *twice.add_chunks() = ChunkOfLength(1, 1, 1, {0});
  EXPECT_FALSE(ValidateStep(twice, 16, limits).ok());
  limits.max_step_tokens = 10;
  EXPECT_FALSE(ValidateStep(ok, 16, limits).ok());
}

}  // namespace
}  // namespace moeshard
